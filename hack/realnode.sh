#!/usr/bin/env bash
# Joins real nodes (containerd + kubelet + kube-proxy, built from the Kubernetes module this
# repository pins) to a `crdipc up` running on this machine, and removes them again. Each
# node lives in a network namespace and a mount namespace of its own, so several run side by
# side on one machine as on separate ones: its own address, pod network, kubelet port,
# iptables, /var/lib/kubelet and /run. For CI and for trying config/default on real
# kubelets; run as root, non-interactive.
#
#   hack/realnode.sh deps
#       apt-get installs what is missing, builds kubelet + kube-proxy (cached per Kubernetes
#       and Go version) and the pause, busybox and fio images (docker-archive tars, no
#       registry). Prints KUBELET=, KUBE_PROXY=, PAUSE_TAR=, BUSYBOX_TAR=, FIO_TAR= lines.
#   hack/realnode.sh tools
#       Lists the commands deps installs, one a line (a test compares them with the tests'
#       capability checks).
#   hack/realnode.sh network
#       Creates the bridge crdipc0 with 10.88.0.1/24, the host's address on the nodes' link
#       (idempotent). Start the control plane after it: crdipc up --advertise-address 10.88.0.1
#   hack/realnode.sh join --dir DIR --node NAME --index N --kubeconfig NODE_KUBECONFIG \
#           --proxy-kubeconfig PROXY_KUBECONFIG --ca CA_CRT [--image TAR]... [--timeout SECONDS]
#       Starts node N (1-200): address 10.88.0.(10+N) on crdipc0, pods in 10.88.N.0/24;
#       containerd, the kubelet and kube-proxy, everything under DIR (keep it short:
#       /tmp/crn1). Exits 0 once the node is Ready and kube-proxy has programmed its rules.
#       The admin kubeconfig in $KUBECONFIG, if set, is used to watch the node.
#   hack/realnode.sh kill --dir DIR
#       Loses the node as a machine is lost: its link goes down and every process of it
#       (kubelet, containerd, kube-proxy, its pods) is killed at once, nothing told. The API
#       keeps the Node; down cleans up after it.
#   hack/realnode.sh down --dir DIR
#       Undoes join, also after a partial join or a kill; idempotent. With the API server
#       reachable it first deletes the Node and its pods ($KUBECONFIG, an admin's, if set).
#       The last node's down also undoes network (and a down of a DIR that holds no node
#       does only that, when no node is left).
#
# Nothing is pulled: pods use the images join imports (pause, busybox, fio, each --image)
# with imagePullPolicy: Never or IfNotPresent. Pods have routes to 10.88.0.0/16 and to the
# Service range only, and nothing is masqueraded out: no pod traffic leaves this machine.
#
# Environment: REALNODE_CACHE overrides the cache directory of deps (and where join looks).
set -eEuo pipefail
# An unexpected failure says where (set -e alone exits silently).
trap 'echo "realnode: line $LINENO: \"$BASH_COMMAND\" failed" >&2' ERR

readonly bridge=crdipc0
readonly host_ip=10.88.0.1
readonly link_cidr=10.88.0.0/24
readonly cluster_cidr=10.88.0.0/16
readonly service_route=10.96.0.0/12 # covers crdipc's 10.96.0.0/24
readonly pause_ref=registry.k8s.io/pause:3.10
readonly busybox_ref=docker.io/library/busybox:latest
readonly fio_ref=docker.io/library/fio:latest
# Where network keeps what it changed on the host, and the nodes joined (nodes/NAME: DIR).
readonly host_state=/run/crdipc-realnode
# Host directories config/default's pods use (hostPath): each node's mount namespace binds
# its own DIR/NAME there; on the host they stay empty mount points.
readonly host_dirs=(/var/lib/kubelet /var/lib/crdipc)
# Kernel settings the kubelet (protectKernelDefaults: false) changes for the whole machine,
# and the forwarding network turns on; recorded by network, restored by the last down.
# (Network settings inside a node's namespace go with it.)
readonly sysctls=(
  vm.overcommit_memory vm.panic_on_oom kernel.panic kernel.panic_on_oops
  kernel.keys.root_maxkeys kernel.keys.root_maxbytes net.ipv4.ip_forward
)
# Fixed host paths containerd, the CNI library, ip netns or the kubelet create whatever they
# are configured with (a node's /run and /var/log are its own); the last down removes those
# that did not exist before network.
readonly host_paths=(/var/lib/cni /run/netns /opt/containerd /etc/cni /opt/cni
  /usr/libexec/kubernetes /etc/kubernetes)

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
readonly repo

die() {
  echo "realnode: $*" >&2
  exit 1
}
say() { echo "== $*" >&2; }
warn() { echo "realnode: warning: $*" >&2; }

need_root() {
  [ "$(id -u)" = 0 ] || die "$1 must run as root (namespaces, mounts, cgroups, containerd)"
}

usage() {
  sed -n '2,/^set -eEuo/p' "${BASH_SOURCE[0]}" | sed '$d; s/^# \{0,1\}//' >&2
  exit 2
}

# --- versions and the cache ----------------------------------------------------------------

# The k8s.io/kubernetes version the repository pins (its require line).
k8s_version() {
  local v
  v=$(awk '$1 == "k8s.io/kubernetes" && $2 ~ /^v1\./ && $3 != "=>" {print $2; exit}' "$repo/go.mod")
  [ -n "$v" ] || die "no k8s.io/kubernetes v1.x require line in $repo/go.mod"
  echo "$v"
}

# Binaries depend on both the Kubernetes and the Go version: the key holds both.
cache_dir() {
  if [ -n "${REALNODE_CACHE:-}" ]; then
    echo "$REALNODE_CACHE"
    return
  fi
  command -v go >/dev/null 2>&1 || die "go is not in PATH (needed to find the kubelet's cache)"
  echo "${XDG_CACHE_HOME:-$HOME/.cache}/crdipc/realnode/$(k8s_version)-$(go env GOVERSION)"
}

# --- deps ------------------------------------------------------------------------------------

pkg_installed() {
  dpkg-query -W -f='${Status}' "$1" 2>/dev/null | grep -q 'install ok installed'
}

# Commands deps installs, each from the Debian package of its name; `tools` lists them.
readonly deps_tools=(containerd runc umoci skopeo iptables conntrack gcc fio)

cmd_tools() { printf '%s\n' "${deps_tools[@]}"; }

install_packages() {
  local pkgs=() p
  [ -x /usr/lib/cni/bridge ] || pkgs+=(containernetworking-plugins)
  # The static build: the busybox image holds nothing else.
  pkg_installed busybox-static || pkgs+=(busybox-static)
  for p in "${deps_tools[@]}"; do
    command -v "$p" >/dev/null 2>&1 || pkgs+=("$p")
  done
  pkg_installed libc6-dev || pkgs+=(libc6-dev) # libc.a for the static pause
  [ ${#pkgs[@]} -eq 0 ] && return
  command -v apt-get >/dev/null 2>&1 || die "missing ${pkgs[*]} and no apt-get: install them"
  local sudo_cmd=""
  if [ "$(id -u)" != 0 ]; then
    command -v sudo >/dev/null 2>&1 || die "missing ${pkgs[*]} and not root (no sudo)"
    sudo_cmd=sudo
  fi
  say "installing ${pkgs[*]} (Debian packages)"
  export DEBIAN_FRONTEND=noninteractive
  $sudo_cmd apt-get update -qq
  $sudo_cmd apt-get install -y -qq --no-install-recommends "${pkgs[@]}" >/dev/null
}

# Builds kubelet and kube-proxy from the module cache. The repository's own module cannot
# build them as is (missing go.sum entries for packages only they import), and must not be
# changed: copy go.mod + go.sum next to an empty main package and let go add what is missing
# there (-mod=mod). Same versions as the repository, and a warm build cache is shared with it.
build_binaries() {
  local cache=$1 ver=$2
  if [ -x "$cache/kubelet" ] && [ -x "$cache/kube-proxy" ]; then
    say "kubelet, kube-proxy $ver: cached in $cache"
    return
  fi
  command -v go >/dev/null 2>&1 || die "go is not in PATH"
  local tmp major minor pkg=k8s.io/component-base/version
  tmp=$(mktemp -d)
  # shellcheck disable=SC2064 # expand now: tmp is local
  trap "rm -rf '$tmp'" EXIT
  cp "$repo/go.mod" "$repo/go.sum" "$tmp/"
  printf 'package main\n\nfunc main() {}\n' >"$tmp/main.go"
  major=${ver#v}
  major=${major%%.*}
  minor=${ver#v*.}
  minor=${minor%%.*}
  say "building kubelet, kube-proxy $ver (minutes on a cold build cache, ~2.5 GB of memory)"
  # A module build reports v0.0.0-master+$Format:%H$ (the node's kubeletVersion) without these.
  (cd "$tmp" && GOWORK=off GOFLAGS="${GOFLAGS:+$GOFLAGS }-mod=mod" go build \
    -ldflags "-X $pkg.gitVersion=$ver -X $pkg.gitMajor=$major -X $pkg.gitMinor=$minor -X $pkg.gitTreeState=clean" \
    -o "$tmp/out/" k8s.io/kubernetes/cmd/kubelet k8s.io/kubernetes/cmd/kube-proxy)
  mkdir -p "$cache"
  mv "$tmp/out/kube-proxy" "$cache/kube-proxy"
  mv "$tmp/out/kubelet" "$cache/kubelet"
  rm -rf "$tmp"
  trap - EXIT
}

# Packs ROOTFS into a one-layer image and writes it as a docker-archive named REF (what
# `ctr images import` reads, names kept). Remaining arguments go to `umoci config`.
pack_image() {
  local rootfs=$1 ref=$2 out=$3 work rootless=()
  shift 3
  [ "$(id -u)" = 0 ] || rootless=(--rootless)
  work=$(mktemp -d)
  umoci init --layout "$work/oci"
  umoci new --image "$work/oci:img"
  umoci unpack "${rootless[@]}" --image "$work/oci:img" "$work/bundle" >/dev/null
  cp -a "$rootfs/." "$work/bundle/rootfs/"
  umoci repack --image "$work/oci:img" "$work/bundle"
  umoci config --image "$work/oci:img" "$@"
  rm -f "$out.tmp"
  # --insecure-policy: no /etc/containers/policy.json needed; nothing is pulled.
  skopeo --insecure-policy copy --quiet "oci:$work/oci:img" "docker-archive:$out.tmp:$ref"
  mv "$out.tmp" "$out"
  rm -rf "$work"
}

build_images() {
  local cache=$1 src="$repo/hack/realnode/pause.c" busybox tmp
  mkdir -p "$cache"
  if [ ! -s "$cache/pause.tar" ] || [ "$src" -nt "$cache/pause.tar" ]; then
    say "building $pause_ref"
    tmp=$(mktemp -d)
    mkdir "$tmp/rootfs"
    gcc -Os -static -o "$tmp/rootfs/pause" "$src"
    strip "$tmp/rootfs/pause" 2>/dev/null || true
    pack_image "$tmp/rootfs" "$pause_ref" "$cache/pause.tar" \
      --config.entrypoint /pause --config.user 65535:65535
    rm -rf "$tmp"
  fi
  busybox=$(command -v busybox 2>/dev/null || echo /bin/busybox)
  if [ ! -s "$cache/busybox.tar" ] || [ "$busybox" -nt "$cache/busybox.tar" ]; then
    say "building $busybox_ref from $busybox"
    if ldd "$busybox" >/dev/null 2>&1; then
      die "$busybox is dynamically linked: install busybox-static"
    fi
    tmp=$(mktemp -d)
    local r="$tmp/rootfs"
    mkdir -p "$r"/{bin,sbin,usr/bin,usr/sbin,etc,proc,sys,dev,root,var,tmp}
    chmod 1777 "$r/tmp"
    cp "$busybox" "$r/bin/busybox"
    # Every applet (sh, echo, cat, sleep, sha256sum, dd, ls, mkdir, ...) as a symlink, as
    # `busybox --install -s` makes them (which would need a chroot, so root).
    local applet
    for applet in $("$busybox" --list); do
      [ "$applet" = busybox ] || ln -s busybox "$r/bin/$applet"
    done
    printf 'root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/:/bin/false\n' >"$r/etc/passwd"
    printf 'root:x:0:\nnogroup:x:65534:\n' >"$r/etc/group"
    pack_image "$r" "$busybox_ref" "$cache/busybox.tar" \
      --config.cmd sh --config.env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
    rm -rf "$tmp"
  fi
  build_fio_image "$cache" "$busybox"
}

# fio, the data checker of the storage tests (a program no crdipc code implements), as an
# image: the host's fio and the shared libraries it links (ldd), busybox for the shell.
build_fio_image() {
  local cache=$1 busybox=$2 fio tmp r lib
  fio=$(command -v fio) || die "fio is not installed"
  if [ -s "$cache/fio.tar" ] && [ ! "$fio" -nt "$cache/fio.tar" ] && [ ! "${BASH_SOURCE[0]}" -nt "$cache/fio.tar" ]; then
    return
  fi
  say "building $fio_ref from $fio"
  tmp=$(mktemp -d)
  r="$tmp/rootfs"
  mkdir -p "$r"/{bin,usr/bin,etc,proc,sys,dev,tmp}
  chmod 1777 "$r/tmp"
  cp "$busybox" "$r/bin/busybox"
  local applet
  for applet in sh cat echo sha256sum sync ls mkdir dd sleep cmp; do
    ln -s busybox "$r/bin/$applet"
  done
  cp "$fio" "$r/usr/bin/fio"
  # The loader and every library, at the paths ldd resolved them to.
  for lib in $(ldd "$fio" | awk '$2 == "=>" && $3 ~ /^\// {print $3} $1 ~ /^\// {print $1}'); do
    mkdir -p "$r$(dirname "$lib")"
    cp -L "$lib" "$r$lib"
  done
  printf 'root:x:0:0:root:/root:/bin/sh\n' >"$r/etc/passwd"
  printf 'root:x:0:\n' >"$r/etc/group"
  pack_image "$r" "$fio_ref" "$cache/fio.tar" \
    --config.cmd fio --config.env PATH=/usr/bin:/bin
  rm -rf "$tmp"
}

cmd_deps() {
  [ $# -eq 0 ] || usage
  install_packages
  local cache ver
  ver=$(k8s_version)
  cache=$(cache_dir)
  build_binaries "$cache" "$ver"
  build_images "$cache"
  echo "KUBELET=$cache/kubelet"
  echo "KUBE_PROXY=$cache/kube-proxy"
  echo "PAUSE_TAR=$cache/pause.tar"
  echo "BUSYBOX_TAR=$cache/busybox.tar"
  echo "FIO_TAR=$cache/fio.tar"
}

# --- state in DIR ----------------------------------------------------------------------------

# DIR's state: state/marker says the directory is ours (down removes only such a DIR);
# state/* the records down undoes from; pids/NAME holds "PID EXE" of each daemon.
dir=""
state=""

set_dir() {
  [ -n "$1" ] || die "--dir is required"
  case $1 in
  /*) ;;
  *) die "--dir must be absolute: $1" ;;
  esac
  dir=$(realpath -m "$1")
  [[ $dir =~ ^/[A-Za-z0-9._/-]+$ ]] || die "--dir may hold only letters, digits and ._-/: $dir"
  case $dir in
  / | /tmp | /var | /var/lib | /run | /home | /root | /usr | /etc | /opt)
    die "--dir $dir is not a work directory of its own" ;;
  esac
  state=$dir/state
}

record() { echo "$2" >>"$state/$1"; }

read_state() { if [ -f "$state/$1" ]; then cat "$state/$1"; fi; }

# The command prefix that runs a program in the node's namespaces (set by enter_node).
in_node=()

# Starts a daemon in its own session (the caller's terminal or CI step may end; signals to
# the script must not reach it), in the node's namespaces, output to DIR/logs/NAME.log, PID
# to DIR/pids/NAME. setsid and nsenter exec: the PID is the daemon's.
start_daemon() {
  local name=$1 exe=$2
  shift 2
  setsid "${in_node[@]}" "$exe" "$@" >>"$dir/logs/$name.log" 2>&1 </dev/null &
  local pid=$! i
  echo "$pid $(readlink -f "$exe")" >"$dir/pids/$name"
  # Until setsid and nsenter have exec'd the program, /proc/PID/exe is theirs: not alive yet.
  for ((i = 0; i < 50; i++)); do
    daemon_alive "$name" && return 0
    [ -e "/proc/$pid" ] || return 0
    sleep 0.1
  done
}

# True if the daemon NAME recorded in DIR/pids is alive (and is still the program started:
# PIDs are reused). A zombie has no exe link: dead.
daemon_alive() {
  local f="$dir/pids/$1" pid exe cur
  [ -s "$f" ] || return 1
  read -r pid exe <"$f"
  cur=$(readlink "/proc/$pid/exe" 2>/dev/null) || return 1
  [ "${cur% (deleted)}" = "$exe" ]
}

stop_daemon() {
  local name=$1 grace=${2:-15} pid i
  [ -s "$dir/pids/$name" ] || return 0
  if daemon_alive "$name"; then
    read -r pid _ <"$dir/pids/$name"
    say "stopping $name (pid $pid)"
    kill -TERM "$pid" 2>/dev/null || true
    for ((i = 0; i < grace * 10; i++)); do
      daemon_alive "$name" || break
      sleep 0.1
    done
    if daemon_alive "$name"; then
      warn "$name did not stop in ${grace}s: SIGKILL"
      kill -KILL "$pid" 2>/dev/null || true
    fi
    # Exiting (no exe link any more) is not gone yet: wait until it is (or a zombie).
    for ((i = 0; i < 50; i++)); do
      gone "$pid" && break
      sleep 0.1
    done
  fi
  rm -f "$dir/pids/$name"
}

# True if PID is gone or a zombie.
gone() {
  local st
  st=$(awk '{print $3}' "/proc/$1/stat" 2>/dev/null) || return 0
  [ -z "$st" ] || [ "$st" = Z ] || [ "$st" = X ]
}

tail_logs() {
  local f log
  for f in "$@"; do
    log=$dir/logs/$f.log
    [ -s "$log" ] || continue
    echo "---- last lines of $log" >&2
    if [ "$f" = containerd ]; then
      # Mostly plugin loading at info level: its problems are its warnings and errors.
      grep -E 'level=(warning|error|fatal)' "$log" | tail -n 10 >&2 || tail -n 10 "$log" >&2
    else
      tail -n 25 "$log" >&2
    fi
  done
}

# Mount points from /proc/self/mountinfo (in mount order) at or under any of the paths given;
# with -v dev=1 first, their devices (major:minor) instead.
mounts_under() {
  local opts=()
  [ "${1:-}" != -v ] || { opts=(-v "$2"); shift 2; }
  awk "${opts[@]}" -v prefixes="$*" '
    BEGIN { n = split(prefixes, p, " ") }
    { m = $5; gsub(/\\040/, " ", m)
      for (i = 1; i <= n; i++) if (m == p[i] || index(m, p[i] "/") == 1) { print (dev ? $3 : m); break } }
  ' /proc/self/mountinfo
}

# The sysfs/cgroup mount points of every hierarchy (cgroup v1 controllers, cgroup2).
cgroup_roots() {
  awk '$9 == "cgroup" || $9 == "cgroup2" {print $5}' /proc/self/mountinfo | sort -u
}

ctr_() { ctr --address "$dir/containerd.sock" "$@"; }

# The admin credentials in $KUBECONFIG if set, else the node's (recorded by join).
kubectl_() {
  if [ -n "${KUBECONFIG:-}" ]; then
    kubectl --request-timeout=10s "$@"
  else
    [ -s "$state/kubeconfig" ] || return 1
    kubectl --kubeconfig "$(<"$state/kubeconfig")" --request-timeout=10s "$@"
  fi
}

# --- network ---------------------------------------------------------------------------------

hrecord() { echo "$2" >>"$host_state/$1"; }
hrecorded() { [ -f "$host_state/$1" ] && grep -qxF -- "$2" "$host_state/$1"; }

# What the last down restores: kernel settings and fixed paths as they were before the first
# node. Taken once, when network first runs.
record_host() {
  local k f
  mkdir -p "$host_state/nodes"
  [ -e "$host_state/recorded" ] && return 0
  for k in "${sysctls[@]}"; do
    f=/proc/sys/${k//.//}
    [ -r "$f" ] && hrecord sysctl "$k=$(<"$f")"
  done
  for f in "${host_paths[@]}"; do
    [ -e "$f" ] && hrecord paths.before "$f"
  done
  for f in "${host_dirs[@]}"; do
    # Each node binds its own directory here, in its own mount namespace: on the host the
    # directory must be free (another kubelet or crdipc install would be hidden from ours).
    if mountpoint -q "$f"; then
      die "network: $f is a mount point (another kubelet or crdipc?); unmount it or run on a clean machine"
    elif [ -e "$f" ]; then
      [ -d "$f" ] && [ -z "$(ls -A "$f")" ] ||
        die "network: $f exists and is not an empty directory (another kubelet or crdipc install?); move it away first"
      hrecord dirs "$f existed"
    else
      mkdir -p "$f"
      hrecord dirs "$f created"
    fi
  done
  losetup -n -l -O NAME,BACK-MAJ:MIN,BACK-INO 2>/dev/null | awk '{print $1, $2, $3}' >"$host_state/loops.before" || true
  touch "$host_state/recorded"
}

cmd_network() {
  [ $# -eq 0 ] || usage
  need_root network
  local other
  record_host
  if ip link show "$bridge" >/dev/null 2>&1; then
    ip -d link show "$bridge" | grep -qw bridge || die "$bridge exists and is not a bridge"
  else
    # Another bridge on the same range (podman's default is 10.88.0.0/16) would steal routes.
    other=$(ip -4 -o addr show to "$cluster_cidr" | awk '{print $2}' | grep -vx "$bridge" || true)
    [ -z "$other" ] || die "$cluster_cidr is already used by $other; remove it first"
    ip link add "$bridge" type bridge
  fi
  if ! ip -4 -o addr show dev "$bridge" | grep -q " $host_ip/24 "; then
    ip addr add "$host_ip/24" dev "$bridge"
  fi
  ip link set "$bridge" up
  # Nodes reach each other's pods through the host (their default route): it forwards
  # between them on crdipc0, and only there (no masquerading, no route out).
  echo 1 >/proc/sys/net/ipv4/ip_forward
  say "bridge $bridge: $host_ip/24"
}

# The joined nodes' names (their registrations under $host_state/nodes).
joined_nodes() {
  local f
  for f in "$host_state"/nodes/*; do
    [ -e "$f" ] && basename "$f"
  done
  true
}

# Undoes network once no node is left: the bridge, the kernel settings, the fixed paths and
# host directories that did not exist before.
teardown_network() {
  [ -z "$(joined_nodes)" ] || return 0
  local l kv k v f p t how
  if ip link show "$bridge" >/dev/null 2>&1; then
    for l in $(ip -o link show master "$bridge" | awk -F': ' '{print $2}' | cut -d@ -f1); do
      ip link delete "$l" 2>/dev/null || true
    done
    ip link delete "$bridge"
    say "deleted bridge $bridge"
  fi
  [ -d "$host_state" ] || return 0
  if [ -f "$host_state/sysctl" ]; then
    while IFS= read -r kv; do
      k=${kv%%=*} v=${kv#*=}
      f=/proc/sys/${k//.//}
      [ -w "$f" ] && [ "$(<"$f")" != "$v" ] || continue
      if echo "$v" >"$f" 2>/dev/null; then say "sysctl $k=$v (restored)"; else warn "could not restore $k=$v"; fi
    done <"$host_state/sysctl"
  fi
  for p in "${host_paths[@]}"; do
    [ -e "$p" ] || continue
    hrecorded paths.before "$p" && continue
    # ip netns add makes /run/netns a mount of its own.
    [ "$p" != /run/netns ] || umount /run/netns 2>/dev/null || true
    [ -z "$(mounts_under "$p")" ] || { warn "$p has mounts: left"; continue; }
    rm -rf --one-file-system "$p" && say "removed $p"
  done
  if [ -f "$host_state/dirs" ]; then
    while read -r t how; do
      [ "$how" = created ] && rmdir "$t" 2>/dev/null
    done <"$host_state/dirs"
  fi
  rm -rf "$host_state"
  true
}

# --- a node's namespaces ---------------------------------------------------------------------

# Node N's address on crdipc0.
node_address() { echo "10.88.0.$((10 + $1))"; }

# Node N's addresses and names.
node_vars() {
  local idx=$1
  node_ip=$(node_address "$idx")
  pod_cidr=10.88.$idx.0/24
  pod_gw=10.88.$idx.1
  veth=crn$idx
}

# Sets in_node for node NAME whose namespace holder runs (DIR/pids/ns): nsenter into its
# network and mount namespaces.
enter_node() {
  local pid
  read -r pid _ <"$dir/pids/ns"
  in_node=(nsenter --target "$pid" --mount --net --)
}

# The network namespace: eth0 on crdipc0 with the node's address, a default route through
# the host, a route on the host to the node's pods (and, if none yet, to the Service range:
# the host's own requests to Services go through the first node's kube-proxy).
setup_netns() {
  local netns=$1
  ip netns add "$netns"
  record netns "$netns"
  ip link add "$veth" type veth peer name eth0 netns "$netns"
  record veth "$veth"
  ip link set "$veth" master "$bridge" up
  ip -n "$netns" addr add "$node_ip/24" dev eth0
  ip -n "$netns" link set lo up
  ip -n "$netns" link set eth0 up
  ip -n "$netns" route add default via "$host_ip"
  ip route replace "$pod_cidr" via "$node_ip"
  record routes "$pod_cidr via $node_ip"
  if ! ip route show "$service_route" | grep -q .; then
    ip route add "$service_route" via "$node_ip"
    record routes "$service_route via $node_ip"
  fi
}

# Runs inside the node's new mount namespace (private: nothing it mounts reaches the host,
# nothing the host mounts later reaches it), as the namespace's holder: binds the node's own
# directories, then sleeps until killed. Called as: realnode.sh ns-init DIR.
cmd_ns_init() {
  dir=$1
  local d
  for d in "${host_dirs[@]}"; do
    mkdir -p "$dir/$(basename "$d")"
    mount --bind "$dir/$(basename "$d")" "$d"
    # Shared: the kubelet's and the CSI driver's mounts propagate to the pods (Bidirectional).
    mount --make-rshared "$d"
  done
  # /run of its own: containerd's and runc's state, mount(8)'s utab, the xtables lock.
  mount -t tmpfs -o mode=0755,size=64m "crdipc-$(<"$dir/state/node")" /run
  mkdir -p "$dir/var-log"
  mount --bind "$dir/var-log" /var/log
  touch "$dir/state/ns-ready"
  exec sleep infinity
}

# The holder of the node's mount namespace, in its network namespace.
start_ns_holder() {
  local netns=$1 i
  setsid nsenter --net="/run/netns/$netns" unshare --mount --propagation private -- \
    bash "$repo/hack/realnode.sh" ns-init "$dir" >>"$dir/logs/ns.log" 2>&1 </dev/null &
  echo "$! $(readlink -f "$(command -v sleep)")" >"$dir/pids/ns"
  for ((i = 0; i < 100; i++)); do
    [ -e "$state/ns-ready" ] && daemon_alive ns && return 0
    sleep 0.1
  done
  tail_logs ns
  die "join: the node's mount namespace was not set up"
}

# The node's cgroup, one per hierarchy: the kubelet's cgroupRoot, so that two kubelets on one
# machine do not share kubepods.
setup_cgroups() {
  local root cg
  for root in $(cgroup_roots); do
    cg=$root/$cgroup_name
    [ -d "$cg" ] || mkdir "$cg"
    record cgroups "$cg"
    # cgroup v1 cpuset: a child starts with no CPUs or memory nodes; tasks need both.
    if [ -f "$cg/cpuset.cpus" ]; then
      cat "$root/cpuset.cpus" >"$cg/cpuset.cpus"
      cat "$root/cpuset.mems" >"$cg/cpuset.mems"
    fi
  done
}

# Every process of the node: those in its network namespace (the holder, containerd, the
# shims, the kubelet, kube-proxy, host-network pods) and in its cgroups (every pod).
node_pids() {
  local netns=$1 cg
  if [ -e "/run/netns/$netns" ]; then
    ip netns pids "$netns" 2>/dev/null || true
  fi
  while read -r cg; do
    [ -d "$cg" ] && find "$cg" -name cgroup.procs -exec cat {} + 2>/dev/null
  done < <(read_state cgroups)
  true
}

# Kills every process of the node until none is left.
kill_node_processes() {
  local netns=$1 i pids
  for ((i = 0; i < 50; i++)); do
    pids=$(node_pids "$netns" | sort -un | tr '\n' ' ')
    [ -n "${pids// /}" ] || return 0
    # shellcheck disable=SC2086 # a list of PIDs
    kill -KILL $pids 2>/dev/null || true
    sleep 0.1
  done
  warn "processes of the node still alive: $pids"
}

# --- join ------------------------------------------------------------------------------------

write_containerd_config() {
  cat >"$dir/containerd.toml" <<EOC
# Written by hack/realnode.sh: a containerd of its own, everything under $dir.
version = 2
root = "$dir/containerd/root"
state = "$dir/containerd/state"
oom_score = 0

[grpc]
  address = "$dir/containerd.sock"

[ttrpc]
  address = "$dir/containerd.sock.ttrpc"

[plugins."io.containerd.internal.v1.opt"]
  path = "$dir/containerd/opt"

[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "$pause_ref"
  # Clamp containers' oom_score_adj to containerd's own: pause asks -998, which root without
  # CAP_SYS_RESOURCE (some CI VMs) may not set, and runc then fails every sandbox.
  restrict_oom_score_adj = true
  # Network namespaces under state, not /run/netns.
  netns_mounts_under_state_dir = true
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"

  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"

    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"

      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
        Root = "$dir/runc"

  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "$cni_bin"
    conf_dir = "$dir/cni/net.d"
    max_conf_num = 1
EOC
}

write_cni_config() {
  mkdir -p "$dir/cni/net.d" "$dir/cni/ipam"
  # The node's pods on its own bridge (in its namespace), the node their gateway; routes to
  # the cluster's pods (other nodes' through the host) and Services only, no masquerading.
  cat >"$dir/cni/net.d/10-crdipc.conflist" <<EOC
{
  "cniVersion": "1.0.0",
  "name": "crdipc",
  "plugins": [
    {
      "type": "bridge",
      "bridge": "cni0",
      "isGateway": true,
      "isDefaultGateway": false,
      "ipMasq": false,
      "hairpinMode": true,
      "ipam": {
        "type": "host-local",
        "dataDir": "$dir/cni/ipam",
        "ranges": [[{"subnet": "$pod_cidr", "gateway": "$pod_gw"}]],
        "routes": [{"dst": "$cluster_cidr"}, {"dst": "$service_route"}]
      }
    },
    {"type": "portmap", "capabilities": {"portMappings": true}}
  ]
}
EOC
}

write_kubelet_config() {
  local ca=$1
  cat >"$dir/kubelet.yaml" <<EOC
# Written by hack/realnode.sh.
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
# The API server reaches the kubelet on the node's InternalIP.
address: $node_ip
readOnlyPort: 0
healthzPort: 0
authentication:
  anonymous:
    enabled: false
  webhook:
    enabled: true
  x509:
    clientCAFile: $ca
authorization:
  mode: Webhook
containerRuntimeEndpoint: unix://$dir/containerd.sock
# Pods under a cgroup of this node's own: other kubelets run on this machine.
cgroupRoot: /$cgroup_name
# cgroup v1 hosts (CI VMs) are refused otherwise; containerd 1.6 cannot tell the kubelet its
# driver (no RuntimeConfig RPC), so both say cgroupfs.
failCgroupV1: false
cgroupDriver: cgroupfs
# Root may lack CAP_SYS_RESOURCE: the default -999 fails (non-fatal, but noisy).
oomScoreAdj: 0
podLogsDir: $dir/pod-logs
volumePluginDir: $dir/volume-plugins
resolvConf: /etc/resolv.conf
clusterDomain: cluster.local
failSwapOn: false
protectKernelDefaults: false
# A test machine's disk may be fuller than a production node's: evict only when nearly full.
mergeDefaultEvictionSettings: false
evictionHard:
  memory.available: 100Mi
  nodefs.available: 1%
  nodefs.inodesFree: 1%
  imagefs.available: 1%
  imagefs.inodesFree: 1%
# Imported images cannot be pulled again: never collect them.
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
serializeImagePulls: false
rotateCertificates: false
serverTLSBootstrap: false
EOC
}

write_proxy_config() {
  local kubeconfig=$1 name=$2
  cat >"$dir/kube-proxy.yaml" <<EOC
# Written by hack/realnode.sh.
apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
clientConnection:
  kubeconfig: $kubeconfig
hostnameOverride: $name
bindAddress: $node_ip
# The node's own loopback (its own network namespace).
healthzBindAddress: 127.0.0.1:10256
metricsBindAddress: 127.0.0.1:10249
mode: iptables
clusterCIDR: $cluster_cidr
# Traffic from this node's pods is local; the rest (other nodes, the host) is masqueraded
# when a Service sends it on to another node, so that replies come back the same way.
detectLocalMode: BridgeInterface
detectLocal:
  bridgeInterface: cni0
nodePortAddresses: ["$node_ip/32"]
iptables:
  localhostNodePorts: false
oomScoreAdj: 0
# 0: leave conntrack's table size and timeouts as they are.
conntrack:
  maxPerCore: 0
  min: 0
  tcpEstablishedTimeout: 0s
  tcpCloseWaitTimeout: 0s
EOC
}

cmd_join() {
  local name="" idx="" kubeconfig="" proxy_kubeconfig="" ca="" timeout=120 images=()
  while [ $# -gt 0 ]; do
    case $1 in
    --dir) set_dir "${2:-}" ;;
    --node) name=${2:-} ;;
    --index) idx=${2:-} ;;
    --kubeconfig) kubeconfig=${2:-} ;;
    --proxy-kubeconfig) proxy_kubeconfig=${2:-} ;;
    --ca) ca=${2:-} ;;
    --image) images+=("${2:-}") ;;
    --timeout) timeout=${2:-} ;;
    *) usage ;;
    esac
    [ $# -ge 2 ] || usage
    shift 2
  done
  [ -n "$dir" ] || die "join: --dir is required"
  [ -n "$name" ] || die "join: --node is required"
  [[ $name =~ ^[a-z0-9]([-a-z0-9]*[a-z0-9])?$ ]] && [ ${#name} -le 40 ] ||
    die "join: --node $name: lowercase letters, digits and '-', at most 40"
  [[ $idx =~ ^[0-9]+$ ]] && [ "$idx" -ge 1 ] && [ "$idx" -le 200 ] || die "join: --index takes 1-200"
  [[ $timeout =~ ^[0-9]+$ ]] || die "join: --timeout takes seconds"
  need_root join
  local f
  for f in kubeconfig proxy_kubeconfig ca; do
    [ -n "${!f}" ] || die "join: --${f//_/-} is required"
    [ -r "${!f}" ] || die "join: --${f//_/-} ${!f}: not readable"
  done
  kubeconfig=$(realpath "$kubeconfig")
  proxy_kubeconfig=$(realpath "$proxy_kubeconfig")
  ca=$(realpath "$ca")
  # Unix socket paths hold at most 107 bytes: DIR/containerd.sock.ttrpc and the kubelet's.
  [ ${#dir} -le 40 ] || die "join: --dir $dir is too long (socket paths); use a short one such as /tmp/crn1"
  for f in containerd ctr runc kubectl iptables ip mount nsenter unshare; do
    command -v "$f" >/dev/null 2>&1 || die "join: $f is not installed (hack/realnode.sh deps)"
  done
  cni_bin=/usr/lib/cni
  [ -x $cni_bin/bridge ] || cni_bin=/opt/cni/bin
  for f in bridge host-local portmap loopback; do
    [ -x "$cni_bin/$f" ] || die "join: CNI plugin $f not in /usr/lib/cni or /opt/cni/bin (hack/realnode.sh deps)"
  done
  local cache kubelet kube_proxy
  cache=$(cache_dir)
  kubelet=$cache/kubelet
  kube_proxy=$cache/kube-proxy
  for f in "$kubelet" "$kube_proxy" "$cache/pause.tar" "$cache/busybox.tar" "$cache/fio.tar"; do
    [ -e "$f" ] || die "join: $f is missing: run hack/realnode.sh deps first"
  done
  images=("$cache/pause.tar" "$cache/busybox.tar" "$cache/fio.tar" "${images[@]}")
  for f in "${images[@]}"; do
    [ -r "$f" ] || die "join: image $f: not readable"
  done

  if [ -e "$state/marker" ]; then
    die "join: $dir holds a node already (joined, or a join that failed): run hack/realnode.sh down --dir $dir first"
  fi
  if [ -e "$dir" ] && [ -n "$(ls -A "$dir")" ]; then
    die "join: $dir exists and is not empty; pick a fresh directory"
  fi
  node_vars "$idx"
  local netns=crdipc-$name other
  cgroup_name=crdipc-$name
  [ ! -e "$host_state/nodes/$name" ] || die "join: node $name is joined already (in $(<"$host_state/nodes/$name"))"
  for other in $(joined_nodes); do
    [ "$(sed -n 2p "$host_state/nodes/$other")" != "$idx" ] ||
      die "join: --index $idx is node $other's; pick another"
  done
  [ ! -e "/run/netns/$netns" ] || die "join: network namespace $netns exists (a node not cleaned up?): ip netns delete $netns"
  ! ip link show "$veth" >/dev/null 2>&1 || die "join: link $veth exists (a node not cleaned up?)"
  local start
  start=$(date -u +%Y-%m-%dT%H:%M:%SZ)
  local t0=$SECONDS

  mkdir -p "$state" "$dir/pids" "$dir/logs"
  echo "hack/realnode.sh" >"$state/marker"
  # From here on a failed join leaves things running or changed, for its logs to be read.
  trap '[ $? -eq 0 ] || echo "realnode: join failed; hack/realnode.sh down --dir $dir undoes what it did" >&2' EXIT
  echo "$name" >"$state/node"
  echo "$idx" >"$state/index"
  echo "$kubeconfig" >"$state/kubeconfig"
  cmd_network
  printf '%s\n%s\n' "$dir" "$idx" >"$host_state/nodes/$name"

  say "node $name: $node_ip, pods $pod_cidr (network namespace $netns)"
  setup_netns "$netns"
  setup_cgroups
  start_ns_holder "$netns"
  enter_node

  # Before containerd: its CRI plugin loads the network config at start.
  write_cni_config
  say "starting containerd"
  write_containerd_config
  start_daemon containerd "$(command -v containerd)" --config "$dir/containerd.toml"
  local i
  for ((i = 0; i < 300; i++)); do
    ctr_ version >/dev/null 2>&1 && break
    daemon_alive containerd || { tail_logs containerd; die "join: containerd exited"; }
    sleep 0.1
  done
  ctr_ version >/dev/null 2>&1 || { tail_logs containerd; die "join: containerd did not answer on $dir/containerd.sock in 30s"; }

  for f in "${images[@]}"; do
    say "importing $f"
    ctr_ -n k8s.io images import "$f" >/dev/null || die "join: could not import $f (a docker-archive or OCI tar?)"
  done

  mkdir -p "$dir/pod-logs" "$dir/volume-plugins"
  write_kubelet_config "$ca"
  say "starting the kubelet (node $name)"
  start_daemon kubelet "$kubelet" --config "$dir/kubelet.yaml" --kubeconfig "$kubeconfig" \
    --root-dir /var/lib/kubelet --node-ip "$node_ip" --hostname-override "$name"

  # Ready, with a heartbeat from this run: a Node left by an earlier run may still say Ready.
  say "waiting for node $name to be Ready (up to ${timeout}s)"
  local deadline=$((SECONDS + timeout)) ready=""
  while [ $SECONDS -lt $deadline ]; do
    daemon_alive kubelet || { tail_logs containerd kubelet; die "join: the kubelet exited"; }
    ready=$(kubectl_ get node "$name" \
      -o jsonpath='{range .status.conditions[?(@.type=="Ready")]}{.status} {.lastHeartbeatTime}{end}' 2>/dev/null || true)
    if [ "${ready%% *}" = True ] && [[ ! ${ready#* } < $start ]]; then
      break
    fi
    ready=""
    sleep 1
  done
  [ -n "$ready" ] || { tail_logs containerd kubelet; die "join: node $name not Ready after ${timeout}s (logs in $dir/logs)"; }

  # After the Node exists: kube-proxy waits for it otherwise.
  say "starting kube-proxy"
  write_proxy_config "$proxy_kubeconfig" "$name"
  start_daemon kube-proxy "$kube_proxy" --config "$dir/kube-proxy.yaml"
  while ! "${in_node[@]}" iptables -t nat -S KUBE-SERVICES >/dev/null 2>&1; do
    daemon_alive kube-proxy || { tail_logs kube-proxy; die "join: kube-proxy exited"; }
    [ $SECONDS -lt $deadline ] || { tail_logs kube-proxy; die "join: kube-proxy did not program its rules in ${timeout}s"; }
    sleep 0.5
  done
  say "node $name Ready, kube-proxy synced ($((SECONDS - t0))s); logs in $dir/logs"
}

# --- kill ------------------------------------------------------------------------------------

# Parses the only flag of kill and down: --dir DIR.
dir_flag() {
  local cmd=$1
  shift
  while [ $# -gt 0 ]; do
    case $1 in
    --dir) set_dir "${2:-}" ;;
    *) usage ;;
    esac
    [ $# -ge 2 ] || usage
    shift 2
  done
  [ -n "$dir" ] || die "$cmd: --dir is required"
  need_root "$cmd"
}

cmd_kill() {
  dir_flag kill "$@"
  [ -e "$state/marker" ] || die "kill: $dir holds no node"
  local name
  name=$(read_state node)
  node_vars "$(read_state index)"
  # The link first: from now on nothing of the node answers or sends, as with a machine
  # whose power is cut; then its processes, all at once.
  ip link set "$veth" down 2>/dev/null || true
  kill_node_processes "crdipc-$name"
  rm -f "$dir/pids/"*
  say "node $name lost: link $veth down, every process killed"
}

# --- down ------------------------------------------------------------------------------------

# Deletes the Node (so DaemonSets stop placing pods on it) and its pods while the kubelet
# still runs: it then stops their containers, runs CNI DEL and unmounts their volumes.
delete_from_api() {
  local name=$1 i left
  kubectl_ get --raw /readyz >/dev/null 2>&1 || { warn "API not reachable: pods and node $name left in it"; return 0; }
  say "deleting node $name and its pods"
  kubectl_ delete node "$name" --ignore-not-found --wait=false >/dev/null 2>&1 ||
    warn "could not delete node $name (a node's own credentials may not: set KUBECONFIG to an admin's)"
  if daemon_alive kubelet; then
    # A short grace period: this is a teardown, and a pod whose PID 1 ignores SIGTERM
    # (sh -c "...; sleep") would hold it up for the default 30 s.
    kubectl_ delete pods -A --field-selector "spec.nodeName=$name" --grace-period=3 \
      --wait=false >/dev/null 2>&1 || true
    for ((i = 0; i < 60; i++)); do
      left=$(kubectl_ get pods -A --field-selector "spec.nodeName=$name" -o name 2>/dev/null | wc -l) || break
      [ "$left" -eq 0 ] && break
      sleep 1
    done
  fi
  # Whatever is left (no kubelet, or it took too long): only from the API.
  kubectl_ delete pods -A --field-selector "spec.nodeName=$name" --grace-period=0 --force \
    >/dev/null 2>&1 || true
}

# Kills and deletes every task and container of our containerd (the kubelet is gone).
remove_containers() {
  local ns t c
  ctr_ version >/dev/null 2>&1 || return 0
  say "removing containerd's leftover tasks and containers"
  for ns in $(ctr_ namespaces ls -q 2>/dev/null); do
    for t in $(ctr_ -n "$ns" tasks ls -q 2>/dev/null); do
      ctr_ -n "$ns" tasks kill -a -s SIGKILL "$t" >/dev/null 2>&1 || true
    done
    for t in $(ctr_ -n "$ns" tasks ls -q 2>/dev/null); do
      ctr_ -n "$ns" tasks delete -f "$t" >/dev/null 2>&1 || true
    done
    for c in $(ctr_ -n "$ns" containers ls -q 2>/dev/null); do
      ctr_ -n "$ns" containers delete "$c" >/dev/null 2>&1 || true
    done
  done
}

# Shims outlive containerd when their tasks could not be deleted: they name our socket.
kill_shims() {
  local pid
  for pid in $(pgrep -f -- "-address $dir/containerd.sock( |$)" || true); do
    say "killing shim $pid"
    kill -KILL "$pid" 2>/dev/null || true
  done
}

# The node's cgroups, deepest first (kill_node_processes has emptied them).
remove_cgroups() {
  local cg
  while read -r cg; do
    [ -d "$cg" ] || continue
    find "$cg" -depth -type d -exec rmdir {} \; 2>/dev/null || true
    [ ! -d "$cg" ] || warn "could not remove $cg"
  done < <(read_state cgroups)
  true
}

# The network namespace (and with it the node's iptables, its pods' bridge and its kernel
# network settings), its link and the host's routes to it.
remove_netns() {
  local n r
  while read -r r; do
    # shellcheck disable=SC2086 # "CIDR via IP"
    ip route del $r 2>/dev/null || true
  done < <(read_state routes)
  while read -r n; do
    ip link delete "$n" 2>/dev/null || true
  done < <(read_state veth)
  while read -r n; do
    [ -e "/run/netns/$n" ] && ip netns delete "$n"
  done < <(read_state netns)
  true
}

# The host's route to the Service range went through this node: through another node now.
repoint_service_route() {
  local other odir via
  ip route show "$service_route" | grep -q . && return 0
  for other in $(joined_nodes); do
    odir=$(sed -n 1p "$host_state/nodes/$other")
    [ -e "$odir/pids/kube-proxy" ] || continue
    via=$(node_address "$(sed -n 2p "$host_state/nodes/$other")")
    ip route add "$service_route" via "$via" && echo "$service_route via $via" >>"$odir/state/routes"
    return 0
  done
}

# Detaches loop devices (pods' block volumes: the CSI driver's) backed by our files:
#  - a file under DIR on DIR's own filesystem;
#  - a file on a filesystem mounted under PREFIXES (a FUSE target, a tmpfs).
# A device backed by a file only a gone pod's mount namespace had (the CSI driver's FUSE
# target, when the driver was killed before it unstaged) cannot be told apart from another
# program's on this machine (the CSI tests run beside this one): it is left, and down says
# so. The normal path never leaves one: down deletes the pods first, the kubelet unstages.
# Matched by device and inode, not by path: losetup shows the path in the mount namespace of
# whoever attached it, a pod's, meaningless once the pod is gone.
detach_loops() {
  local own devs host_devs sources dev majmin ino file
  own=$(findmnt -n -o MAJ:MIN -T "$dir" | tr -d "[:space:]") # padded
  devs=" $(mounts_under -v dev=1 "$@" | sort -u | tr '\n' ' ') "
  host_devs=" $(awk '{print $3}' /proc/self/mountinfo | sort -u | tr '\n' ' ') "
  sources=" $(awk '{for (i = 7; $i != "-"; i++); print $(i + 2)}' /proc/self/mountinfo | sort -u | tr '\n' ' ') "
  while read -r dev majmin ino file; do
    if { [ "$majmin" = "$own" ] && [ -n "$(find "$dir" -xdev -inum "$ino" -print -quit 2>/dev/null)" ]; } ||
      { [ "$majmin" != "$own" ] && [[ $devs == *" $majmin "* ]]; }; then
      losetup -d "$dev" 2>/dev/null && say "detached $dev ($file)"
    elif ! hrecorded loops.before "$dev $majmin $ino" && [[ $host_devs != *" $majmin "* && $sources != *" $dev "* ]]; then
      warn "left $dev ($file): attached since join, its file on no mount of this host; detach it if it was this node's"
    fi
  done < <(losetup -n -l -O NAME,BACK-MAJ:MIN,BACK-INO,BACK-FILE 2>/dev/null || true)
  true
}

# Unmounts, deepest and latest first, what the host sees mounted under DIR (the node's own
# mounts were in its mount namespace, gone with its last process), and detaches the loop
# devices backed by DIR's files.
unmount_all() {
  local m pass
  for pass in 1 2 3; do
    while read -r m; do
      [ -n "$m" ] || continue
      if [ $pass -lt 3 ]; then
        umount "$m" 2>/dev/null || true
      else
        umount "$m" 2>/dev/null || umount -l "$m" 2>/dev/null || warn "could not unmount $m"
      fi
    done < <(mounts_under "$dir" | tac)
    detach_loops "$dir"
    [ -z "$(mounts_under "$dir")" ] && break
  done
  true
}

cmd_down() {
  dir_flag down "$@"
  if [ ! -e "$state/marker" ]; then
    if [ -e "$dir" ] && [ -n "$(ls -A "$dir" 2>/dev/null)" ]; then
      die "down: $dir was not made by hack/realnode.sh join (no state/marker): not touching it"
    fi
    rmdir "$dir" 2>/dev/null || true
    teardown_network
    say "nothing joined in $dir"
    return 0
  fi
  local t0=$SECONDS name idx
  name=$(read_state node)
  idx=$(read_state index)
  [ -n "$idx" ] && node_vars "$idx"
  cgroup_name=crdipc-$name

  [ -z "$name" ] || delete_from_api "$name"
  stop_daemon kube-proxy
  stop_daemon kubelet
  remove_containers
  stop_daemon containerd
  kill_shims
  # The rest: pods whose shim died, and the namespace holder; the mount namespace goes with it.
  kill_node_processes "crdipc-$name"
  rm -f "$dir/pids/ns"
  remove_cgroups
  remove_netns
  unmount_all
  [ -z "$name" ] || rm -f "$host_state/nodes/$name"
  repoint_service_route

  if [ -n "$(mounts_under "$dir")" ]; then
    die "down: mounts left under $dir (see mount | grep $dir): not removing it"
  fi
  rm -rf --one-file-system "$dir"
  say "node ${name:-?} stopped and cleaned up, $dir deleted ($((SECONDS - t0))s)"
  teardown_network
}

# ---------------------------------------------------------------------------------------------

[ $# -ge 1 ] || usage
sub=$1
shift
case $sub in
deps) cmd_deps "$@" ;;
tools) cmd_tools ;; # the commands deps installs, one a line
network) cmd_network "$@" ;;
join) cmd_join "$@" ;;
kill) cmd_kill "$@" ;;
down) cmd_down "$@" ;;
ns-init) cmd_ns_init "$@" ;; # internal: the holder of a node's mount namespace
-h | --help | help) usage ;;
*) usage ;;
esac
