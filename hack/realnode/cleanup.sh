# shellcheck shell=bash disable=SC2154 # dir, state, host_state, ...: hack/realnode.sh's
# What `hack/realnode.sh down` undoes, sourced by it: the node's objects in the API, its
# containers, cgroups, network namespace, routes, mounts and loop devices, and, after the
# last node, the host's network and what network recorded of the host before the first.

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
  load_plan
  [ -n "$service_cidr" ] || return 0
  ip route show "$service_cidr" | grep -q . && return 0
  for other in $(joined_nodes); do
    odir=$(sed -n 1p "$host_state/nodes/$other")
    [ -e "$odir/pids/kube-proxy" ] || continue
    via=$(sed -n 3p "$host_state/nodes/$other")
    ip route add "$service_cidr" via "$via" && echo "$service_cidr via $via" >>"$odir/state/routes"
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

# Undoes network once no node is left: the bridge, the kernel settings, the fixed paths and
# host directories that did not exist before.
teardown_network() {
  [ -z "$(joined_nodes)" ] || return 0
  local l kv k v f p t how
  load_plan
  if [ -n "$bridge" ] && ip link show "$bridge" >/dev/null 2>&1; then
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
