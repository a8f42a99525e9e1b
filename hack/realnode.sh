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
#       and Go version) and the pause, busybox, fio and btcd images (docker-archive tars, no
#       registry). Prints KUBELET=, KUBE_PROXY=, PAUSE_TAR=, BUSYBOX_TAR=, FIO_TAR=, BTCD_TAR=.
#   hack/realnode.sh tools
#       Lists the commands deps installs, one a line (a test compares them with the tests'
#       capability checks).
#   hack/realnode.sh network [--bridge NAME] [--host-address IP/LEN] [--cluster-cidr CIDR]
#           [--service-cidr CIDR]
#       Creates the bridge with the host's address, the nodes' link (idempotent). Start the
#       control plane after it: crdipc up --advertise-address <the host's IP>
#   hack/realnode.sh join --dir DIR --node NAME --index N --kubeconfig NODE_KUBECONFIG \
#           --proxy-kubeconfig PROXY_KUBECONFIG --ca CA_CRT [--image TAR]... [--timeout SECONDS]
#           [network's flags] [--node-address IP/LEN] [--pod-cidr CIDR]
#       Starts node N (1-200, link crnN): containerd, the kubelet and kube-proxy, everything
#       under DIR (keep it short: /tmp/crn1). Exits 0 once the node is Ready and kube-proxy
#       has programmed its rules. The admin kubeconfig in $KUBECONFIG, if set, watches the node.
#   hack/realnode.sh load --dir DIR --image TAR...
#       Imports images into a joined node's containerd, as join's --image does: another
#       version's image, for an upgrade in place (docs/deploy.md "Upgrading").
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
# Addresses not given are internal/testenv/realnodeplan's, which test/realnode passes
# (`go run ./hack/realnode/nodeconfig plan [--index N]` prints them). Nothing is pulled: pods
# use the images join imports (pause, busybox, fio, btcd, each --image) with
# imagePullPolicy: Never or IfNotPresent. Pods have routes to the cluster and Service ranges
# only, and nothing is masqueraded out: no pod traffic leaves this machine.
#
# Environment: REALNODE_CACHE overrides the cache directory of deps (and where join looks).
set -eEuo pipefail
# An unexpected failure says where (set -e alone exits silently).
trap 'echo "realnode: line $LINENO: \"$BASH_COMMAND\" failed" >&2' ERR

# Where network keeps what it changed on the host, and the nodes joined (nodes/NAME: DIR).
readonly host_state=/run/crdipc-realnode
# Host directories config/default's pods use (hostPath): each node's mount namespace binds
# its own DIR/NAME there; on the host they stay empty directories.
readonly host_dirs=(/var/lib/kubelet /var/lib/crdipc /var/lib/crdipc-fd-holder)
# Kernel settings the kubelet (protectKernelDefaults: false) changes for the whole machine,
# and the forwarding network turns on; recorded by network, restored by the last down.
readonly sysctls=(vm.overcommit_memory vm.panic_on_oom kernel.panic kernel.panic_on_oops
  kernel.keys.root_maxkeys kernel.keys.root_maxbytes net.ipv4.ip_forward)
# Fixed host paths containerd, the CNI library, ip netns or the kubelet create whatever they
# are configured with (a node's /run and /var/log are its own); the last down removes those
# that did not exist before network.
readonly host_paths=(/var/lib/cni /run/netns /opt/containerd /etc/cni /opt/cni
  /usr/libexec/kubernetes /etc/kubernetes)

# -P: the checkout itself, also when the script is reached through a symlinked directory
# (test/realnode runs docs/deploy.md from a fresh directory of links to the checkout).
repo=$(cd -P "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
readonly repo
# shellcheck source=hack/lib/oci.sh
. "$repo/hack/lib/oci.sh"
# What deps builds (kubelet, kube-proxy, the images) and what down undoes, by topic.
# shellcheck source=hack/realnode/build.sh
. "$repo/hack/realnode/build.sh"
# shellcheck source=hack/realnode/cleanup.sh
. "$repo/hack/realnode/cleanup.sh"

die() { echo "realnode: $*" >&2; exit 1; }
say() { echo "== $*" >&2; }
warn() { echo "realnode: warning: $*" >&2; }
need_root() { [ "$(id -u)" = 0 ] || die "$1 must run as root (namespaces, mounts, cgroups, containerd)"; }

usage() {
  sed -n '2,/^set -eEuo/p' "${BASH_SOURCE[0]}" | sed '$d; s/^# \{0,1\}//' >&2
  exit 2
}

# --- versions and the cache ----------------------------------------------------------------
# k8s_version, cache_dir.
# shellcheck source=hack/lib/cache.sh
. "$repo/hack/lib/cache.sh"
# k8s_module, k8s_go: a module of the pinned versions to build Kubernetes' binaries in.
# shellcheck source=hack/lib/k8smodule.sh
. "$repo/hack/lib/k8smodule.sh"

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

cmd_deps() {
  [ $# -eq 0 ] || usage
  install_packages
  local cache ver
  ver=$(k8s_version)
  cache=$(cache_dir)
  build_binaries "$cache" "$ver"
  echo "KUBELET=$cache/kubelet"
  echo "KUBE_PROXY=$cache/kube-proxy"
  build_images "$cache"
}

# --- state in DIR ----------------------------------------------------------------------------
# DIR's state: state/marker says the directory is ours (down removes only such a DIR);
# state/* the records down undoes from; pids/NAME holds "PID EXE" of each daemon.
dir="" state=""

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

# --- the address plan ----------------------------------------------------------------------
# The address flags of network (and join: the node's two more), as variables of their names.
readonly plan_vars=(bridge host_address cluster_cidr service_cidr node_address pod_cidr)
bridge="" host_address="" cluster_cidr="" service_cidr="" node_address="" pod_cidr=""

# plan_flag FLAG VALUE [default] sets FLAG's variable (a default only if unset); fails if
# FLAG is none of the plan's.
plan_flag() {
  local v=${1#--}
  v=${v//-/_}
  [[ " ${plan_vars[*]} " == *" $v "* ]] || return 1
  [ -z "${3:-}" ] || [ -z "${!v}" ] || return 0
  printf -v "$v" %s "$2"
}

nodeconfig() { (cd "$repo" && go run ./hack/realnode/nodeconfig "$@"); }

# Fills the flags not given from realnodeplan (plan_defaults [--index N]) and checks them.
plan_defaults() {
  local v flags used=("${plan_vars[@]:0:$(($# ? 6 : 4))}")
  for v in "${used[@]}"; do
    [ -n "${!v}" ] && continue
    command -v go >/dev/null 2>&1 || die "go is not in PATH (the address plan's defaults)"
    flags=$(nodeconfig plan "$@") || die "go run ./hack/realnode/nodeconfig plan $* failed"
    # shellcheck disable=SC2086 # flags, space-separated
    set -- $flags
    while [ $# -ge 2 ]; do
      plan_flag "$1" "$2" default || die "nodeconfig plan printed an unknown flag $1"
      shift 2
    done
    break
  done
  [[ $bridge =~ ^[A-Za-z0-9_.-]{1,15}$ ]] || die "--bridge '$bridge': not an interface name"
  for v in "${used[@]:1}"; do
    [[ ${!v} =~ ^[0-9]+(\.[0-9]+){3}/[0-9]+$ ]] || die "--${v//_/-} '${!v}': not an IPv4 address/length"
  done
  host_ip=${host_address%/*}
  node_ip=${node_address%/*}
}

# --- network ---------------------------------------------------------------------------------
cmd_network() {
  while [ $# -gt 0 ]; do
    [ $# -ge 2 ] && plan_flag "$1" "$2" || usage
    shift 2
  done
  need_root network
  plan_defaults
  local other plan="$bridge $host_address $cluster_cidr $service_cidr"
  if [ -s "$host_state/plan" ] && [ "$(<"$host_state/plan")" != "$plan" ]; then
    die "network: set up already as $(<"$host_state/plan") (bridge, host, cluster, Services), not $plan: down every node first"
  fi
  record_host
  echo "$plan" >"$host_state/plan"
  if ip link show "$bridge" >/dev/null 2>&1; then
    ip -d link show "$bridge" | grep -qw bridge || die "$bridge exists and is not a bridge"
  else
    # Another bridge on the same range (podman's default is 10.88.0.0/16) would steal routes.
    other=$(ip -4 -o addr show to "$cluster_cidr" | awk '{print $2}' | grep -vx "$bridge" || true)
    [ -z "$other" ] || die "$cluster_cidr is already used by $other; remove it first"
    ip link add "$bridge" type bridge
  fi
  if ! ip -4 -o addr show dev "$bridge" | grep -q " $host_address "; then
    ip addr add "$host_address" dev "$bridge"
  fi
  ip link set "$bridge" up
  # Nodes reach each other's pods through the host (their default route): it forwards
  # between them on crdipc0, and only there (no masquerading, no route out).
  echo 1 >/proc/sys/net/ipv4/ip_forward
  say "bridge $bridge: $host_address"
}

# The network's addresses, as network recorded them (down and kill take no address flags).
load_plan() {
  if [ -s "$host_state/plan" ]; then
    read -r bridge host_address cluster_cidr service_cidr <"$host_state/plan"
  fi
}

# The joined nodes' names (their registrations under $host_state/nodes: DIR, index, IP).
joined_nodes() {
  local f
  for f in "$host_state"/nodes/*; do
    [ -e "$f" ] && basename "$f"
  done
  true
}

# --- a node's namespaces ---------------------------------------------------------------------
# Sets in_node for node NAME whose namespace holder runs (DIR/pids/ns): nsenter into its
# network and mount namespaces.
enter_node() {
  local pid
  read -r pid _ <"$dir/pids/ns"
  in_node=(nsenter --target "$pid" --mount --net --)
}

# The network namespace: eth0 on the bridge with the node's address, a default route through
# the host, a route on the host to the node's pods (and, if none yet, to the Service range:
# the host's own requests to Services go through the first node's kube-proxy).
setup_netns() {
  local netns=$1
  ip netns add "$netns"
  record netns "$netns"
  ip link add "$veth" type veth peer name eth0 netns "$netns"
  record veth "$veth"
  ip link set "$veth" master "$bridge" up
  ip -n "$netns" addr add "$node_address" dev eth0
  ip -n "$netns" link set lo up
  ip -n "$netns" link set eth0 up
  ip -n "$netns" route add default via "$host_ip"
  ip route replace "$pod_cidr" via "$node_ip"
  record routes "$pod_cidr via $node_ip"
  if ! ip route show "$service_cidr" | grep -q .; then
    ip route add "$service_cidr" via "$node_ip"
    record routes "$service_cidr via $node_ip"
  fi
}

# Runs inside the node's new mount namespace (a slave of the host's: nothing it mounts reaches
# the host; what the host mounts and unmounts later reaches it where the host's mounts are
# shared, as systemd makes them), as the namespace's holder: drops its copies of the host's
# volume mounts, binds the node's own directories, then sleeps until killed. Called as:
# realnode.sh ns-init DIR.
cmd_ns_init() {
  dir=$1
  local d
  drop_host_volumes
  for d in "${host_dirs[@]}"; do
    mkdir -p "$dir/$(basename "$d")" "$d"
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

# Unmounts, in this namespace only, the copies it was made with of the host's FUSE file
# systems and file systems on loop devices (a CSI target's, a test's): none is the node's, it
# has mounted nothing yet. Where the host's / is private (no systemd) the host's unmounts do
# not reach a copy, which would keep such a FUSE connection, and the host's volume with it,
# alive for as long as the node runs.
drop_host_volumes() {
  local target fstype source
  # Deepest first; a lazy unmount takes what is below with it.
  findmnt -rn -o TARGET,FSTYPE,SOURCE | sort -r | while read -r target fstype source; do
    case $fstype in
    fuse | fuse.*) ;;
    *) [[ $source == /dev/loop* ]] || continue ;;
    esac
    [ "$target" != / ] || continue
    umount -l -- "$(printf '%b' "$target")" 2>/dev/null || true
  done
}

# The holder of the node's mount namespace, in its network namespace.
start_ns_holder() {
  local netns=$1 i
  setsid nsenter --net="/run/netns/$netns" unshare --mount --propagation slave -- \
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
    *) plan_flag "$1" "${2:-}" || usage ;;
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
  plan_defaults --index "$idx"
  local f
  for f in kubeconfig proxy_kubeconfig ca; do
    [ -n "${!f}" ] || die "join: --${f//_/-} is required"
    [ -r "${!f}" ] || die "join: --${f//_/-} ${!f}: not readable"
    printf -v "$f" %s "$(realpath "${!f}")"
  done
  # Unix socket paths hold at most 107 bytes: DIR/containerd.sock.ttrpc and the kubelet's.
  [ ${#dir} -le 40 ] || die "join: --dir $dir is too long (socket paths); use a short one such as /tmp/crn1"
  for f in containerd ctr runc kubectl iptables ip mount nsenter unshare findmnt; do
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
  images=("$cache/pause.tar" "$cache/busybox.tar" "$cache/fio.tar" "$cache/$btcd_tar" "${images[@]}")
  for f in "$kubelet" "$kube_proxy" "${images[@]:0:4}"; do
    [ -e "$f" ] || die "join: $f is missing: run hack/realnode.sh deps first"
  done
  for f in "${images[@]}"; do
    [ -r "$f" ] || die "join: image $f: not readable"
  done
  [ ! -e "$state/marker" ] ||
    die "join: $dir holds a node already (joined, or a join that failed): run hack/realnode.sh down --dir $dir first"
  [ ! -e "$dir" ] || [ -z "$(ls -A "$dir")" ] || die "join: $dir exists and is not empty; pick a fresh directory"
  veth=crn$idx
  local netns=crdipc-$name other
  cgroup_name=crdipc-$name
  [ ! -e "$host_state/nodes/$name" ] || die "join: node $name is joined already (in $(<"$host_state/nodes/$name"))"
  for other in $(joined_nodes); do
    [ "$(sed -n 2p "$host_state/nodes/$other")" != "$idx" ] ||
      die "join: --index $idx is node $other's; pick another"
  done
  [ ! -e "/run/netns/$netns" ] || die "join: network namespace $netns exists (a node not cleaned up?): ip netns delete $netns"
  ! ip link show "$veth" >/dev/null 2>&1 || die "join: link $veth exists (a node not cleaned up?)"
  local start t0=$SECONDS
  start=$(date -u +%Y-%m-%dT%H:%M:%SZ)
  mkdir -p "$state" "$dir/pids" "$dir/logs"
  echo "hack/realnode.sh" >"$state/marker"
  # From here on a failed join leaves things running or changed, for its logs to be read.
  trap '[ $? -eq 0 ] || echo "realnode: join failed; hack/realnode.sh down --dir $dir undoes what it did" >&2' EXIT
  echo "$name" >"$state/node"
  echo "$idx" >"$state/index"
  echo "$kubeconfig" >"$state/kubeconfig"
  mkdir -p "$dir/pod-logs" "$dir/volume-plugins"
  nodeconfig write --dir "$dir" --node "$name" --ca "$ca" --proxy-kubeconfig "$proxy_kubeconfig" \
    --cni-bin "$cni_bin" --pause-image "$pause_ref" --cgroup-root "/$cgroup_name" \
    --node-address "$node_address" --pod-cidr "$pod_cidr" --cluster-cidr "$cluster_cidr" \
    --service-cidr "$service_cidr" || die "join: writing the node's configuration failed"
  cmd_network --bridge "$bridge" --host-address "$host_address" --cluster-cidr "$cluster_cidr" \
    --service-cidr "$service_cidr"
  printf '%s\n%s\n%s\n' "$dir" "$idx" "$node_ip" >"$host_state/nodes/$name"
  say "node $name: $node_ip, pods $pod_cidr (network namespace $netns)"
  setup_netns "$netns"
  setup_cgroups
  start_ns_holder "$netns"
  enter_node

  # The CNI config is written before containerd starts: its CRI plugin loads it at start.
  say "starting containerd"
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
    [ "${ready%% *}" = True ] && [[ ! ${ready#* } < $start ]] && break
    ready=""
    sleep 1
  done
  [ -n "$ready" ] || { tail_logs containerd kubelet; die "join: node $name not Ready after ${timeout}s (logs in $dir/logs)"; }

  # After the Node exists: kube-proxy waits for it otherwise.
  say "starting kube-proxy"
  start_daemon kube-proxy "$kube_proxy" --config "$dir/kube-proxy.yaml"
  while ! "${in_node[@]}" iptables -t nat -S KUBE-SERVICES >/dev/null 2>&1; do
    daemon_alive kube-proxy || { tail_logs kube-proxy; die "join: kube-proxy exited"; }
    [ $SECONDS -lt $deadline ] || { tail_logs kube-proxy; die "join: kube-proxy did not program its rules in ${timeout}s"; }
    sleep 0.5
  done
  say "node $name Ready, kube-proxy synced ($((SECONDS - t0))s); logs in $dir/logs"
}

# --- load ------------------------------------------------------------------------------------
cmd_load() {
  local images=() f
  while [ $# -gt 0 ]; do
    case $1 in
    --dir) set_dir "${2:-}" ;;
    --image) images+=("${2:-}") ;;
    *) usage ;;
    esac
    [ $# -ge 2 ] || usage
    shift 2
  done
  [ -n "$dir" ] || die "load: --dir is required"
  [ ${#images[@]} -gt 0 ] || die "load: no --image given"
  need_root load
  [ -e "$state/marker" ] || die "load: $dir holds no node (join it first)"
  for f in "${images[@]}"; do
    [ -r "$f" ] || die "load: cannot read $f"
    say "importing $f into $(read_state node)"
    ctr_ -n k8s.io images import "$f" >/dev/null || die "load: could not import $f (a docker-archive or OCI tar?)"
  done
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
  veth=crn$(read_state index)
  # The link first: from now on nothing of the node answers or sends, as with a machine
  # whose power is cut; then its processes, all at once.
  ip link set "$veth" down 2>/dev/null || true
  kill_node_processes "crdipc-$name"
  rm -f "$dir/pids/"*
  say "node $name lost: link $veth down, every process killed"
}

# --- down ------------------------------------------------------------------------------------
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
  local t0=$SECONDS name
  name=$(read_state node)

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
load) cmd_load "$@" ;;
kill) cmd_kill "$@" ;;
down) cmd_down "$@" ;;
ns-init) cmd_ns_init "$@" ;; # internal: the holder of a node's mount namespace
-h | --help | help) usage ;;
*) usage ;;
esac
