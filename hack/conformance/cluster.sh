# shellcheck shell=bash disable=SC2154 # repo, die, say: hack/conformance.sh's
# The cluster `hack/conformance.sh` runs the suite against (sourced by it): docs/deploy.md's
# harness, as its block runs it — `crdipc up` with the bridge, three real nodes
# (hack/realnode.sh join) that import crdipc's image and the suite's, config/default — and
# what a user adds before a first claim: a pool on every node and the StorageClass and
# VolumeSnapshotClass of config/samples/csi.
#
# Everything of the cluster is under WORK (up's data directory WORK/.crdipc, its log
# WORK/up.log, the kubeconfigs) but the nodes, whose directories must be short paths
# (/tmp/crdipc-cf1..3: the containerd and kubelet sockets live there). The nodes take
# realnodeplan's indices 1-3 and the bridge crdipc0, as test/realnode does: the two cannot
# run at the same time, and cluster_up says so rather than break the other.

readonly cluster_nodes=3

node_dir() { echo "/tmp/crdipc-cf$1"; }

# cluster_up WORK TAR...: the cluster, each TAR imported into every node besides crdipc's
# image (bin/crdipc-image.tar, make image). Prints nothing; KUBECONFIG=WORK/.crdipc/kubeconfig
# reaches it once it returns.
cluster_up() {
  local work=$1 i t0=$SECONDS
  shift
  local images=(--image "$repo/bin/crdipc-image.tar")
  for i in "$@"; do images+=(--image "$i"); done
  [ -x "$repo/bin/crdipc" ] || die "bin/crdipc missing: make image builds it"
  if [ -d /run/crdipc-realnode/nodes ] && [ -n "$(ls -A /run/crdipc-realnode/nodes)" ]; then
    die "real nodes are joined already ($(ls /run/crdipc-realnode/nodes | tr '\n' ' ')): test/realnode or another cluster runs; stop it first (hack/realnode.sh down)"
  fi
  mkdir -p "$work"
  "$repo/hack/realnode.sh" network
  # up in the background, in a session of its own: cluster_down stops it with SIGINT, as
  # Ctrl-C does. exec twice (the subshell becomes setsid, setsid becomes up): $! is up's PID.
  (cd "$work" && exec setsid "$repo/bin/crdipc" up --services=none --nodes 0 --advertise-address 10.88.0.1 \
    >"$work/up.log" 2>&1 </dev/null) &
  echo $! >"$work/up.pid"
  export KUBECONFIG=$work/.crdipc/kubeconfig
  local deadline=$((SECONDS + 300))
  until kubectl get --raw=/readyz >/dev/null 2>&1; do
    kill -0 "$(cat "$work/up.pid")" 2>/dev/null || die "crdipc up exited: $(tail -n 20 "$work/up.log")"
    [ $SECONDS -lt $deadline ] || die "crdipc up not ready after 5 min: $(tail -n 20 "$work/up.log")"
    sleep 1
  done
  local server
  server=https://10.88.0.1:$(kubectl config view --minify -o jsonpath='{.clusters[0].cluster.server}' | sed 's/.*://')
  "$repo/bin/crdipc" kubeconfig --user system:kube-proxy --server "$server" -o "$work/kube-proxy.kubeconfig"
  for ((i = 1; i <= cluster_nodes; i++)); do
    "$repo/bin/crdipc" kubeconfig --node "real-$i" --server "$server" -o "$work/real-$i.kubeconfig"
    "$repo/hack/realnode.sh" join --dir "$(node_dir "$i")" --node "real-$i" --index "$i" \
      --kubeconfig "$work/real-$i.kubeconfig" --proxy-kubeconfig "$work/kube-proxy.kubeconfig" \
      --ca "$work/.crdipc/pki/ca.crt" "${images[@]}"
  done
  kubectl apply --server-side -k "$repo/config/default" >/dev/null
  kubectl wait --for=condition=Available deployment --all -n crdipc-system --timeout=5m >/dev/null
  # Every DaemonSet's pod Ready on each node (the fd holder's updateStrategy is OnDelete, which
  # rollout status does not follow).
  kubectl wait --for=jsonpath='{.status.numberReady}'=$cluster_nodes daemonset --all -n crdipc-system --timeout=5m >/dev/null
  local s
  for s in storage_v1alpha1_storagepoolclaim storageclass volumesnapshotclass; do
    kubectl apply -f "$repo/config/samples/csi/$s.yaml" >/dev/null
  done
  wait_for "a Healthy pool on each of the $cluster_nodes nodes" 300 \
    '[ "$(kubectl get csp -o jsonpath="{range .items[*]}{.status.phase}{\"\\n\"}{end}" | grep -c "^Healthy$")" -ge '"$cluster_nodes"' ]'
  wait_for "csi.crdipc.io registered on each node (CSINode)" 300 \
    '[ "$(kubectl get csinode -o jsonpath="{range .items[*]}{.spec.drivers[*].name}{\"\\n\"}{end}" | grep -c "csi.crdipc.io")" -ge '"$cluster_nodes"' ]'
  say "cluster ready: up, $cluster_nodes real nodes, config/default, pools, classes ($((SECONDS - t0)) s)"
}

# cluster_down WORK: the nodes (each Node and its pods deleted first, while the API server
# answers), then up; WORK is removed. Idempotent, also after a partial cluster_up.
cluster_down() {
  local work=$1 i pid
  export KUBECONFIG=$work/.crdipc/kubeconfig
  for ((i = cluster_nodes; i >= 1; i--)); do
    "$repo/hack/realnode.sh" down --dir "$(node_dir "$i")" || warn "down of real-$i failed"
  done
  if [ -s "$work/up.pid" ]; then
    pid=$(cat "$work/up.pid")
    kill -INT "$pid" 2>/dev/null || true
    wait_for "crdipc up stopped" 60 "! kill -0 $pid 2>/dev/null" || kill -KILL "$pid" 2>/dev/null || true
  fi
  rm -rf "$work" || warn "could not remove $work"
}

# wait_for WHAT SECONDS CONDITION: polls the shell CONDITION every second until it holds;
# fails with WHAT after SECONDS.
wait_for() {
  local what=$1 deadline=$((SECONDS + $2))
  until eval "$3"; do
    if [ $SECONDS -ge $deadline ]; then
      echo "conformance: timed out after $2 s waiting for $what" >&2
      return 1
    fi
    sleep 1
  done
}
