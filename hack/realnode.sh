#!/usr/bin/env bash
# Joins one real node (containerd + kubelet + kube-proxy, built from the Kubernetes module
# this repository pins) to a `crdipc up` running on this machine, and removes it again.
# For CI and for trying config/default on a real kubelet; run as root, non-interactive.
#
#   hack/realnode.sh deps
#       apt-get installs what is missing, builds kubelet + kube-proxy (cached per Kubernetes
#       and Go version) and the pause and busybox images (docker-archive tars, no registry).
#       Prints KUBELET=, KUBE_PROXY=, PAUSE_TAR=, BUSYBOX_TAR= lines (eval-able).
#   hack/realnode.sh network
#       Creates the bridge crdipc0 with 10.88.0.1/16 (idempotent). Start the control plane
#       after it: crdipc up --advertise-address 10.88.0.1 ...
#   hack/realnode.sh join --dir DIR --node NAME --kubeconfig NODE_KUBECONFIG \
#           --proxy-kubeconfig PROXY_KUBECONFIG --ca CA_CRT [--image TAR]... [--timeout SECONDS]
#       Starts containerd, the kubelet and kube-proxy, everything under DIR (keep it short:
#       /tmp/crn); exits 0 once the node is Ready and kube-proxy has programmed its rules.
#       The admin kubeconfig in $KUBECONFIG, if set, is used to watch the node.
#   hack/realnode.sh down --dir DIR
#       Undoes join and network, also after a partial join; idempotent. With the API server
#       reachable it first deletes the Node and its pods ($KUBECONFIG, an admin's, if set).
#
# Nothing is pulled: pods use the images join imports (pause, busybox, each --image) with
# imagePullPolicy: Never or IfNotPresent. Pod addresses come from 10.88.0.0/16 on crdipc0;
# pods have routes to that network and to the Service range only, and nothing is masqueraded:
# no pod traffic leaves this machine.
#
# Environment: REALNODE_CACHE overrides the cache directory of deps (and where join looks).
set -eEuo pipefail
# An unexpected failure says where (set -e alone exits silently).
trap 'echo "realnode: line $LINENO: \"$BASH_COMMAND\" failed" >&2' ERR

readonly bridge=crdipc0
readonly node_ip=10.88.0.1
readonly pod_cidr=10.88.0.0/16
readonly service_route=10.96.0.0/12 # covers crdipc's 10.96.0.0/24
readonly pause_ref=registry.k8s.io/pause:3.10
readonly busybox_ref=docker.io/library/busybox:latest
# Host directories config/default's pods use (hostPath); join bind-mounts DIR's own there.
readonly host_dirs=(/var/lib/kubelet /var/lib/crdipc)
# Kernel settings the kubelet (protectKernelDefaults: false), the CNI bridge (isGateway) or
# kube-proxy may change; join records them before starting anything and down restores them.
readonly sysctls=(
  vm.overcommit_memory vm.panic_on_oom kernel.panic kernel.panic_on_oops
  kernel.keys.root_maxkeys kernel.keys.root_maxbytes
  net.ipv4.ip_forward net.ipv6.conf.all.forwarding net.ipv4.conf.all.route_localnet
  net.bridge.bridge-nf-call-iptables net.bridge.bridge-nf-call-ip6tables
  net.netfilter.nf_conntrack_max net.netfilter.nf_conntrack_tcp_timeout_established
  net.netfilter.nf_conntrack_tcp_timeout_close_wait net.netfilter.nf_conntrack_tcp_be_liberal
  net.netfilter.nf_conntrack_udp_timeout net.netfilter.nf_conntrack_udp_timeout_stream
)
# Fixed host paths containerd, the CNI library or the kubelet create whatever they are
# configured with; down removes those that did not exist before join.
readonly host_paths=(/var/lib/cni /run/netns /var/log/containers /var/log/pods /run/containerd
  /opt/containerd /etc/cni /opt/cni /usr/libexec/kubernetes /run/nri /etc/kubernetes
  /run/mount) # /run/mount: mount(8)'s utab
# Chains the kubelet makes (filter/nat/mangle, IPv4 and IPv6), which outlive it.
readonly kubelet_chains=(KUBE-FIREWALL KUBE-KUBELET-CANARY KUBE-IPTABLES-HINT)

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
readonly repo

die() {
  echo "realnode: $*" >&2
  exit 1
}
say() { echo "== $*" >&2; }
warn() { echo "realnode: warning: $*" >&2; }

need_root() {
  [ "$(id -u)" = 0 ] || die "$1 must run as root (mounts, iptables, sysctls, containerd)"
}

usage() {
  sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed '$d; s/^# \{0,1\}//' >&2
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

install_packages() {
  local pkgs=() p
  command -v containerd >/dev/null 2>&1 || pkgs+=(containerd)
  command -v runc >/dev/null 2>&1 || pkgs+=(runc)
  [ -x /usr/lib/cni/bridge ] || pkgs+=(containernetworking-plugins)
  # The static build: the busybox image holds nothing else.
  pkg_installed busybox-static || pkgs+=(busybox-static)
  for p in umoci skopeo iptables conntrack gcc; do
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
}

# --- network ---------------------------------------------------------------------------------

cmd_network() {
  [ $# -eq 0 ] || usage
  need_root network
  local other
  if ip link show "$bridge" >/dev/null 2>&1; then
    ip -d link show "$bridge" | grep -qw bridge || die "$bridge exists and is not a bridge"
  else
    # Another bridge on the same range (podman's default is 10.88.0.0/16) would steal routes.
    other=$(ip -4 -o addr show to "$pod_cidr" | awk '{print $2}' | grep -vx "$bridge" || true)
    [ -z "$other" ] || die "$pod_cidr is already used by $other; remove it first"
    ip link add "$bridge" type bridge
  fi
  if ! ip -4 -o addr show dev "$bridge" | grep -q " $node_ip/16 "; then
    ip addr add "$node_ip/16" dev "$bridge"
  fi
  ip link set "$bridge" up
  say "bridge $bridge: $node_ip/16"
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
recorded() { [ -f "$state/$1" ] && grep -qxF -- "$2" "$state/$1"; }

read_state() { if [ -f "$state/$1" ]; then cat "$state/$1"; fi; }

# Starts a daemon in its own session (the caller's terminal or CI step may end; signals to
# the script must not reach it), output to DIR/logs/NAME.log, PID to DIR/pids/NAME.
start_daemon() {
  local name=$1 exe=$2
  shift 2
  setsid "$exe" "$@" >>"$dir/logs/$name.log" 2>&1 </dev/null &
  local pid=$! i
  echo "$pid $(readlink -f "$exe")" >"$dir/pids/$name"
  # Until setsid has exec'd the program, /proc/PID/exe is setsid: daemon_alive would say no.
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

# A free TCP port on 127.0.0.1 from START upwards (kube-proxy's healthz and metrics cannot be
# turned off; keep them on loopback where they do not clash with another kube-proxy).
free_port() {
  local p=$1
  while ss -Htln "sport = :$p" | grep -q .; do p=$((p + 1)); done
  echo "$p"
}

# --- join ------------------------------------------------------------------------------------

# What down needs to restore the host exactly: kernel settings, chains and paths that
# existed, cgroups that existed. Taken before anything starts.
record_host() {
  local k f v save
  for k in "${sysctls[@]}"; do
    f=/proc/sys/${k//.//}
    if [ -r "$f" ]; then
      record sysctl "$k=$(<"$f")"
    fi
  done
  for v in 4 6; do
    save=iptables-save
    [ $v = 4 ] || save=ip6tables-save
    command -v $save >/dev/null 2>&1 || continue
    # "table chain" lines; down removes KUBE-*/CNI-* chains that are not in here.
    $save 2>/dev/null | awk '/^\*/ {t = substr($1, 2)} /^:/ {print t, substr($1, 2)}' \
      >"$state/chains.$v" || true
  done
  for f in "${host_paths[@]}"; do
    [ -e "$f" ] && record paths.before "$f"
  done
  for f in /run/netns/cni-*; do
    [ -e "$f" ] && record netns.before "$f"
  done
  losetup -n -l -O NAME,BACK-MAJ:MIN,BACK-INO 2>/dev/null | awk '{print $1, $2, $3}' >"$state/loops.before" || true
  # iptables-nft makes its tables (ip/ip6 filter, nat, mangle) on first use; a host that had
  # none should have none after down.
  if command -v nft >/dev/null 2>&1; then
    nft list tables >"$state/nft.before" 2>/dev/null || true
  fi
  for f in $(cgroup_roots); do
    [ -d "$f/kubepods" ] && record cgroups.before "$f/kubepods"
  done
  true
}

# Refuses, before join changes anything, a host directory another kubelet or install uses.
check_host_dir() {
  local target=$1 src=$2
  if mountpoint -q "$target"; then
    # Ours if it is a bind of src: the same directory (device and inode) seen at both paths.
    if [ ! -d "$src" ] || [ "$(stat -c %d:%i "$target")" != "$(stat -c %d:%i "$src")" ]; then
      die "join: $target is a mount point not made by this script (another kubelet or crdipc?); unmount it or run on a clean machine"
    fi
  elif [ -e "$target" ]; then
    [ -d "$target" ] || die "join: $target exists and is not a directory"
    [ -z "$(ls -A "$target")" ] ||
      die "join: $target exists and is not empty (another kubelet or crdipc install?); move it away first"
  fi
}

# Bind-mounts DIR/NAME on TARGET (shared, so Bidirectional volumes and CSI mounts propagate).
bind_host_dir() {
  local src=$1 target=$2
  mkdir -p "$src"
  check_host_dir "$target" "$src"
  if mountpoint -q "$target"; then
    say "$target: already bound to $src"
    record mounts "$target existed"
    return
  fi
  if [ -e "$target" ]; then
    record mounts "$target existed"
  else
    mkdir -p "$target"
    record mounts "$target created"
  fi
  mount --bind "$src" "$target"
  mount --make-rshared "$target"
}

write_containerd_config() {
  cat >"$dir/containerd.toml" <<EOF
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
  # Network namespaces under state, not /run/netns: down finds them with the other mounts.
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
EOF
}

write_cni_config() {
  mkdir -p "$dir/cni/net.d" "$dir/cni/ipam"
  # isGateway puts the pods' gateway on the bridge; no default route (isDefaultGateway false)
  # and no ipMasq: pods reach the pod network and, through the host (kube-proxy), Services.
  # containerd adds the loopback interface itself (the loopback plugin in $cni_bin).
  cat >"$dir/cni/net.d/10-crdipc.conflist" <<EOF
{
  "cniVersion": "1.0.0",
  "name": "crdipc",
  "plugins": [
    {
      "type": "bridge",
      "bridge": "$bridge",
      "isGateway": true,
      "isDefaultGateway": false,
      "ipMasq": false,
      "hairpinMode": true,
      "ipam": {
        "type": "host-local",
        "dataDir": "$dir/cni/ipam",
        "ranges": [[{"subnet": "$pod_cidr", "gateway": "$node_ip"}]],
        "routes": [{"dst": "$service_route"}]
      }
    },
    {"type": "portmap", "capabilities": {"portMappings": true}}
  ]
}
EOF
}

write_kubelet_config() {
  local ca=$1
  cat >"$dir/kubelet.yaml" <<EOF
# Written by hack/realnode.sh.
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
# The API server reaches the kubelet on the node's InternalIP, on the bridge only.
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
EOF
}

write_proxy_config() {
  local kubeconfig=$1 name=$2
  cat >"$dir/kube-proxy.yaml" <<EOF
# Written by hack/realnode.sh.
apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
clientConnection:
  kubeconfig: $kubeconfig
hostnameOverride: $name
# The node's IP, not looked up.
bindAddress: $node_ip
healthzBindAddress: 127.0.0.1:$(free_port 10256)
metricsBindAddress: 127.0.0.1:$(free_port 10249)
mode: iptables
clusterCIDR: $pod_cidr
detectLocalMode: ClusterCIDR
# NodePorts on the bridge only; none on 127.0.0.1 (that would set route_localnet).
nodePortAddresses: ["$pod_cidr"]
iptables:
  localhostNodePorts: false
oomScoreAdj: 0
# 0: leave the host's conntrack table size and timeouts as they are.
conntrack:
  maxPerCore: 0
  min: 0
  tcpEstablishedTimeout: 0s
  tcpCloseWaitTimeout: 0s
EOF
}

cmd_join() {
  local name="" kubeconfig="" proxy_kubeconfig="" ca="" timeout=120 images=()
  while [ $# -gt 0 ]; do
    case $1 in
    --dir) set_dir "${2:-}" ;;
    --node) name=${2:-} ;;
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
  [[ $name =~ ^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$ ]] || die "join: --node $name is not a valid node name"
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
  [ ${#dir} -le 40 ] || die "join: --dir $dir is too long (socket paths); use a short one such as /tmp/crn"
  for f in containerd ctr runc kubectl iptables ip mount; do
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
  for f in "$kubelet" "$kube_proxy" "$cache/pause.tar" "$cache/busybox.tar"; do
    [ -e "$f" ] || die "join: $f is missing: run hack/realnode.sh deps first"
  done
  images=("$cache/pause.tar" "$cache/busybox.tar" "${images[@]}")
  for f in "${images[@]}"; do
    [ -r "$f" ] || die "join: image $f: not readable"
  done

  if [ -e "$state/marker" ]; then
    die "join: $dir holds a node already (joined, or a join that failed): run hack/realnode.sh down --dir $dir first"
  fi
  if [ -e "$dir" ] && [ -n "$(ls -A "$dir")" ]; then
    die "join: $dir exists and is not empty; pick a fresh directory"
  fi
  if ss -Htln "sport = :10250" | grep -q .; then
    die "join: port 10250 (the kubelet's) is taken: is another kubelet running?"
  fi
  local d
  for d in "${host_dirs[@]}"; do
    check_host_dir "$d" "$dir/$(basename "$d")"
  done
  local start
  start=$(date -u +%Y-%m-%dT%H:%M:%SZ)
  local t0=$SECONDS

  mkdir -p "$state" "$dir/pids" "$dir/logs"
  echo "hack/realnode.sh" >"$state/marker"
  # From here on a failed join leaves things running or changed, for its logs to be read.
  trap '[ $? -eq 0 ] || echo "realnode: join failed; hack/realnode.sh down --dir $dir undoes what it did" >&2' EXIT
  echo "$name" >"$state/node"
  echo "$kubeconfig" >"$state/kubeconfig"
  echo "$kube_proxy" >"$state/kube-proxy"
  record_host

  cmd_network
  for d in "${host_dirs[@]}"; do
    bind_host_dir "$dir/$(basename "$d")" "$d"
  done

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

  # Ready, with a heartbeat from this run: without a node-lifecycle controller, a Node left
  # by an earlier run keeps saying Ready.
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
  while ! iptables -t nat -S KUBE-SERVICES >/dev/null 2>&1; do
    daemon_alive kube-proxy || { tail_logs kube-proxy; die "join: kube-proxy exited"; }
    [ $SECONDS -lt $deadline ] || { tail_logs kube-proxy; die "join: kube-proxy did not program its rules in ${timeout}s"; }
    sleep 0.5
  done
  say "node $name Ready, kube-proxy synced ($((SECONDS - t0))s); logs in $dir/logs"
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

# The kubelet's QoS cgroups (kubepods) in every hierarchy, if join found none there: kill
# what still runs in them (pods whose shim died), then remove them deepest first.
remove_cgroups() {
  local root cg pid cgs=() killed=""
  for root in $(cgroup_roots); do
    cg=$root/kubepods
    if [ -d "$cg" ] && ! recorded cgroups.before "$cg"; then
      cgs+=("$cg")
    fi
  done
  [ ${#cgs[@]} -gt 0 ] || return 0
  # cgroup v1: the same process is in every hierarchy.
  for pid in $(find "${cgs[@]}" -name cgroup.procs -exec cat {} + 2>/dev/null | sort -un); do
    say "killing pod process $pid ($(cat "/proc/$pid/comm" 2>/dev/null))"
    kill -KILL "$pid" 2>/dev/null || true
    killed=1
  done
  [ -z "$killed" ] || sleep 0.5
  for cg in "${cgs[@]}"; do
    find "$cg" -depth -type d -exec rmdir {} \; 2>/dev/null || true
    [ ! -d "$cg" ] || warn "could not remove $cg"
  done
}

# containerd keeps network namespaces under its state (netns_mounts_under_state_dir); should
# one land in /run/netns all the same (another containerd version), remove the new ones.
remove_netns() {
  local n
  for n in /run/netns/cni-*; do
    [ -e "$n" ] || continue
    recorded netns.before "$n" && continue
    ip netns delete "${n##*/}" 2>/dev/null || { umount "$n" 2>/dev/null; rm -f "$n"; } || true
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
    elif ! recorded loops.before "$dev $majmin $ino" && [[ $host_devs != *" $majmin "* && $sources != *" $dev "* ]]; then
      warn "left $dev ($file): attached since join, its file on no mount of this host; detach it if it was this node's"
    fi
  done < <(losetup -n -l -O NAME,BACK-MAJ:MIN,BACK-INO,BACK-FILE 2>/dev/null || true)
  true
}

# Unmounts, deepest and latest first, every mount under DIR and under the host directories
# join bound, and detaches the loop devices that keep some of them busy.
unmount_all() {
  local prefixes=("$dir") t how m pass
  while read -r t how; do
    prefixes+=("$t")
  done < <(read_state mounts)
  for pass in 1 2 3; do
    while read -r m; do
      [ -n "$m" ] || continue
      if [ $pass -lt 3 ]; then
        umount "$m" 2>/dev/null || true
      else
        umount "$m" 2>/dev/null || umount -l "$m" 2>/dev/null || warn "could not unmount $m"
      fi
    done < <(mounts_under "${prefixes[@]}" | tac)
    detach_loops "${prefixes[@]}"
    [ -z "$(mounts_under "${prefixes[@]}")" ] && break
  done
  # The mount points join made.
  while read -r t how; do
    [ "$how" = created ] && rmdir "$t" 2>/dev/null
  done < <(read_state mounts)
  true
}

# Another live kubelet on this machine (ours is stopped; a process that is exiting, or a
# zombie not yet reaped, has no exe link).
other_kubelet() {
  local pid
  for pid in $(pgrep -x kubelet || true); do
    readlink "/proc/$pid/exe" >/dev/null 2>&1 && return 0
  done
  return 1
}

# Removes KUBE-*/CNI-* chains that were not there before join (kube-proxy --cleanup has
# removed its own; the kubelet's and portmap's remain), and the jumps to them; the kubelet's
# own chains even if they were (left by an earlier run), unless another kubelet runs.
# One iptables-restore --noflush per table: all of a table's changes or none.
remove_chains() {
  local v save restore before table script always=""
  other_kubelet || always="${kubelet_chains[*]}"
  for v in 4 6; do
    save=iptables-save restore=iptables-restore
    [ $v = 6 ] && save=ip6tables-save restore=ip6tables-restore
    command -v $save >/dev/null 2>&1 || continue
    before=$state/chains.$v
    [ -f "$before" ] || continue
    for table in filter nat mangle raw; do
      script=$($save -t $table 2>/dev/null | awk -v table=$table -v before="$before" -v always="$always" '
        BEGIN {
          while ((getline l < before) > 0) { split(l, f, " "); if (f[1] == table) old[f[2]] = 1 }
          n = split(always, a, " "); for (i = 1; i <= n; i++) delete old[a[i]]; n = 0
        }
        /^:/ { c = substr($1, 2); if ((c ~ /^KUBE-/ || c ~ /^CNI-/) && !(c in old)) gone[c] = 1; next }
        /^-A / { rules[++n] = $0; chain[n] = $2 }
        END {
          for (i = 1; i <= n; i++) {
            if (chain[i] in gone) continue
            for (c in gone) if (index(rules[i] " ", " -j " c " ") || index(rules[i] " ", " -g " c " ")) {
              r = rules[i]; sub(/^-A /, "-D ", r); print r; break
            }
          }
          for (c in gone) print "-F " c
          for (c in gone) print "-X " c
        }')
      [ -n "$script" ] || continue
      say "removing $table chains (IPv$v): $(echo "$script" | awk '/^-X/ {printf "%s ", $2}')"
      printf '*%s\n%s\nCOMMIT\n' "$table" "$script" | $restore --noflush ||
        warn "could not remove the $table chains (IPv$v)"
    done
  done
  true
}

# nftables tables that appeared since join (iptables-nft's, kube-proxy's) and hold no rule
# any more: remove_chains and kube-proxy --cleanup have emptied them.
remove_nft_tables() {
  local family table rules
  command -v nft >/dev/null 2>&1 && [ -f "$state/nft.before" ] || return 0
  while read -r _ family table; do
    grep -qxF "table $family $table" "$state/nft.before" && continue
    case $family/$table in
    ip/filter | ip/nat | ip/mangle | ip/raw | ip6/filter | ip6/nat | ip6/mangle | ip6/raw | */kube-proxy) ;;
    *) continue ;;
    esac
    # Rules are the lines of a chain other than its type/policy declaration.
    rules=$(nft list table "$family" "$table" 2>/dev/null |
      awk '!/^[[:space:]]*(table |chain |type |policy |}|$)/' | wc -l)
    if [ "$rules" -eq 0 ]; then
      nft delete table "$family" "$table" && say "removed the empty nftables table $family $table"
    else
      warn "nftables table $family $table holds $rules rules made since join: left"
    fi
  done < <(nft list tables 2>/dev/null)
  true
}

restore_sysctls() {
  local kv k v f
  while IFS= read -r kv; do
    k=${kv%%=*} v=${kv#*=}
    f=/proc/sys/${k//.//}
    [ -w "$f" ] || continue
    if [ "$(<"$f")" != "$v" ]; then
      if echo "$v" >"$f" 2>/dev/null; then
        say "sysctl $k=$v (restored)"
      else
        warn "could not restore $k=$v"
      fi
    fi
  done < <(read_state sysctl)
}

# Fixed paths that did not exist before join.
remove_host_paths() {
  local p l
  # The kubelet's symlinks to our pod logs, in the fixed /var/log/containers.
  if [ -d /var/log/containers ]; then
    for l in /var/log/containers/*; do
      [ -L "$l" ] && [[ $(readlink "$l") == "$dir"/* ]] && rm -f "$l"
    done
  fi
  for p in "${host_paths[@]}"; do
    [ -e "$p" ] || continue
    recorded paths.before "$p" && continue
    [ -z "$(mounts_under "$p")" ] || { warn "$p has mounts: left"; continue; }
    rm -rf --one-file-system "$p" && say "removed $p"
  done
  true
}

remove_network() {
  local l
  if ip link show "$bridge" >/dev/null 2>&1; then
    # Pod ends of veth pairs whose namespace survived (normally gone with it).
    for l in $(ip -o link show master "$bridge" | awk -F': ' '{print $2}' | cut -d@ -f1); do
      ip link delete "$l" 2>/dev/null || true
    done
    ip link delete "$bridge"
    say "deleted bridge $bridge"
  fi
}

cmd_down() {
  while [ $# -gt 0 ]; do
    case $1 in
    --dir) set_dir "${2:-}" ;;
    *) usage ;;
    esac
    [ $# -ge 2 ] || usage
    shift 2
  done
  [ -n "$dir" ] || die "down: --dir is required"
  need_root down
  if [ ! -e "$state/marker" ]; then
    if [ -e "$dir" ] && [ -n "$(ls -A "$dir" 2>/dev/null)" ]; then
      die "down: $dir was not made by hack/realnode.sh join (no state/marker): not touching it"
    fi
    remove_network
    rmdir "$dir" 2>/dev/null || true
    say "nothing joined in $dir"
    return 0
  fi
  local t0=$SECONDS name kube_proxy
  name=$(read_state node)

  [ -z "$name" ] || delete_from_api "$name"

  if [ -s "$dir/pids/kube-proxy" ]; then
    stop_daemon kube-proxy
  fi
  kube_proxy=$(read_state kube-proxy)
  if [ -x "$kube_proxy" ] && [ -f "$dir/kube-proxy.yaml" ]; then
    # Its Service rules (iptables; nftables and IPVS too, if any).
    "$kube_proxy" --cleanup >>"$dir/logs/kube-proxy-cleanup.log" 2>&1 ||
      warn "kube-proxy --cleanup failed (see $dir/logs/kube-proxy-cleanup.log)"
  fi
  stop_daemon kubelet
  remove_containers
  stop_daemon containerd
  kill_shims
  remove_cgroups
  remove_netns
  unmount_all
  remove_chains
  remove_nft_tables
  remove_network
  remove_host_paths
  restore_sysctls

  if [ -n "$(mounts_under "$dir")" ]; then
    die "down: mounts left under $dir (see mount | grep $dir): not removing it"
  fi
  rm -rf --one-file-system "$dir"
  say "node ${name:-?} stopped and cleaned up, $dir deleted ($((SECONDS - t0))s)"
}

# ---------------------------------------------------------------------------------------------

[ $# -ge 1 ] || usage
sub=$1
shift
case $sub in
deps) cmd_deps "$@" ;;
network) cmd_network "$@" ;;
join) cmd_join "$@" ;;
down) cmd_down "$@" ;;
-h | --help | help) usage ;;
*) usage ;;
esac
