# shellcheck shell=bash disable=SC2154 # repo, die, say: hack/conformance.sh's
# How `hack/conformance.sh run` runs the suite (sourced by it): as csi-release-tools'
# prow.sh runs it for the kubernetes-csi drivers, in three sets that together hold every
# spec of the driver once — the parallel set, the [Serial] and [Disruptive] specs one at a
# time, then the [Feature:...] specs (snapshots, XFS sources) in parallel — each with its
# junit report, and the names of test/conformance/skips.yaml left out of all three.
# CONFORMANCE_FOCUS (a regular expression over the rest of a spec's name) narrows every set;
# CONFORMANCE_SUBSET (a file of spec names, as test/conformance/ci.yaml) does so by name.

readonly testdriver=$repo/test/conformance/testdriver.yaml
readonly skiplist=$repo/test/conformance/skips.yaml
readonly driver_name=csi.crdipc.io

# The sets: NAME PROCS LABEL-FILTER (ginkgo's, over the labels the e2e framework gives its
# tags: Serial, Disruptive, Feature:<name>).
conformance_sets() {
  local procs=${CONFORMANCE_PROCS:-4}
  printf '%s\n' \
    "parallel $procs !Serial && !Disruptive && !/^Feature:/" \
    "serial 1 Serial || Disruptive" \
    "features $procs /^Feature:/ && !Serial && !Disruptive"
}

# run_set E2E_TEST GINKGO REPORT_DIR NAME PROCS LABEL-FILTER: one set of the driver's specs
# (those CONFORMANCE_FOCUS matches, if set) against $KUBECONFIG; its junit in
# REPORT_DIR/NAME/junit_01.xml, its log in REPORT_DIR/NAME.log.
run_set() {
  local e2e=$1 ginkgo=$2 report=$3 name=$4 procs=$5 labels=$6 t0=$SECONDS
  local focus="External.Storage \\[Driver: ${driver_name//./\\.}\\]"
  if [ -n "${CONFORMANCE_SUBSET:-}" ]; then
    CONFORMANCE_FOCUS=$(cd "$repo" && go run ./hack/conformance/suite focus "$CONFORMANCE_SUBSET") || die "reading the subset $CONFORMANCE_SUBSET"
  fi
  [ -z "${CONFORMANCE_FOCUS:-}" ] || focus="$focus.*(${CONFORMANCE_FOCUS})"
  local args=(--procs="$procs" --timeout=3h --no-color --poll-progress-after=5m --focus="$focus" --label-filter="$labels")
  local s
  while IFS= read -r s; do
    args+=(--skip="$s")
  done < <(cd "$repo" && go run ./hack/conformance/suite skips "$skiplist")
  mkdir -p "$report/$name"
  say "set $name: $procs at a time, labels $labels${CONFORMANCE_FOCUS:+, focus $CONFORMANCE_FOCUS} (log: $report/$name.log)"
  # The e2e flags: --provider skeleton (no cloud, no SSH: the suite skips what needs them),
  # the admin kubeconfig, the junit report in the set's directory. Never --clean-start: it
  # deletes every namespace but the system ones, crdipc-system included.
  local rc=0
  "$ginkgo" "${args[@]}" "$e2e" -- \
    -storage.testdriver="$testdriver" \
    --kubeconfig="$KUBECONFIG" \
    --provider=skeleton \
    --report-dir="$report/$name" \
    --kubectl-path="$(command -v kubectl)" \
    --disable-log-dump >"$report/$name.log" 2>&1 || rc=$?
  say "set $name: ginkgo exited $rc after $((SECONDS - t0)) s"
  if [ ! -s "$report/$name/junit_01.xml" ]; then
    tail -n 40 "$report/$name.log" >&2
    die "set $name wrote no junit report"
  fi
  (cd "$repo" && go run ./hack/conformance/suite report --driver "$driver_name" "$report/$name/junit_01.xml") || true
}

# run_sets E2E_TEST GINKGO REPORT_DIR [SET...]: the sets named (all three by default), then
# the count over all of them; fails if a spec failed or a skip-list entry matched nothing.
run_sets() {
  local e2e=$1 ginkgo=$2 report=$3 t0=$SECONDS
  shift 3
  local want=("$@") name procs labels junits=()
  [ ${#want[@]} -gt 0 ] || want=(parallel serial features)
  while read -r name procs labels; do
    [[ " ${want[*]} " == *" $name "* ]] || continue
    run_set "$e2e" "$ginkgo" "$report" "$name" "$procs" "$labels"
    junits+=("$report/$name/junit_01.xml")
  done < <(conformance_sets)
  [ ${#junits[@]} -gt 0 ] || die "no set named ${want[*]} (parallel, serial, features)"
  say "all sets: $((SECONDS - t0)) s"
  local subset=()
  [ -z "${CONFORMANCE_SUBSET:-}" ] || subset=(--subset "$CONFORMANCE_SUBSET")
  (cd "$repo" && go run ./hack/conformance/suite report --skips "$skiplist" "${subset[@]}" --driver "$driver_name" "${junits[@]}") |
    tee "$report/summary.txt"
  return "${PIPESTATUS[0]}"
}
