#!/usr/bin/env bash
# Kubernetes' own storage e2e suite (External.Storage) against crdipc on real nodes.
#
#   hack/conformance.sh deps
#       Builds e2e.test (upstream's k8s.io/kubernetes/test/e2e at the version go.mod pins) and
#       the ginkgo CLI (github.com/onsi/ginkgo/v2 at the version the module graph selects),
#       cached beside hack/realnode.sh's kubelet and built when missing; and the images the
#       storage suites run, as docker-archive tars named as the suite's test/utils/image names
#       them, each rebuilt when stale: busybox, agnhost (from test/images/agnhost),
#       glibc-dns-testing (GNU coreutils, for multiVolume) and nginx (a shell only, for
#       volumes' exec spec). Prints E2E_TEST=, GINKGO=, E2E_BUSYBOX_TAR=, AGNHOST_TAR=,
#       GLIBC_DNS_TESTING_TAR=, NGINX_TAR=. The first run builds for about 13 minutes
#       (e2e.test 515 s, agnhost 234 s, measured with crdipc's and the kubelet's packages in
#       the build cache); cached, it takes under a minute.
#
#   hack/conformance.sh run [--report-dir DIR] [SET...]
#       Runs the suite against the cluster $KUBECONFIG names (where config/default runs, with
#       the StorageClass and VolumeSnapshotClass of config/samples/csi, and the images above
#       on its nodes) with test/conformance/testdriver.yaml, in the sets parallel, serial
#       and features (all three by default), each with a junit report under DIR (default
#       ./conformance-report), then counts them: ran, passed, failed, skipped by the suite,
#       skipped by test/conformance/skips.yaml. Exits 1 if a spec failed.
#   hack/conformance.sh all [--report-dir DIR] [SET...]
#       What `make conformance` runs (root): deps and hack/realnode.sh deps, a cluster of
#       `crdipc up` and three real nodes as docs/deploy.md's harness makes it (nodes in
#       /tmp/crdipc-cf1..3; not while test/realnode runs), config/default, a pool on every
#       node and the sample classes; run; then the cluster is removed, pass or fail.
#
# Environment: REALNODE_CACHE overrides the cache directory, as for hack/realnode.sh.
# CONFORMANCE_PROCS: specs at a time in the parallel sets (4). CONFORMANCE_FOCUS: a further
# ginkgo focus over every set. CONFORMANCE_SUBSET: a file of spec names, each literally
# (test/conformance/ci.yaml, CI's subset), run alone.
# KEEP_CLUSTER=1: all leaves the cluster running (remove it with `all --down`).
set -eEuo pipefail
# An unexpected failure says where (set -e alone exits silently).
trap 'echo "conformance: line $LINENO: \"$BASH_COMMAND\" failed" >&2' ERR

# -P: the checkout itself, also when reached through a symlinked directory.
repo=$(cd -P "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
readonly repo
# shellcheck source=hack/lib/oci.sh
. "$repo/hack/lib/oci.sh"
# The image helpers (image_begin, image_end, add_busybox, stale).
# shellcheck source=hack/realnode/build.sh
. "$repo/hack/realnode/build.sh"
# shellcheck source=hack/conformance/build.sh
. "$repo/hack/conformance/build.sh"
# shellcheck source=hack/conformance/cluster.sh
. "$repo/hack/conformance/cluster.sh"
# shellcheck source=hack/conformance/run.sh
. "$repo/hack/conformance/run.sh"

die() { echo "conformance: $*" >&2; exit 1; }
say() { echo "== $*" >&2; }
warn() { echo "conformance: warning: $*" >&2; }

usage() {
  sed -n '2,/^set -eEuo/p' "${BASH_SOURCE[0]}" | sed '$d; s/^# \{0,1\}//' >&2
  exit 2
}

# k8s_version, cache_dir: hack/realnode.sh's, whose cache deps builds into too.
# shellcheck source=hack/lib/cache.sh
. "$repo/hack/lib/cache.sh"
# k8s_module, k8s_go: a module of the pinned versions to build Kubernetes' binaries in.
# shellcheck source=hack/lib/k8smodule.sh
. "$repo/hack/lib/k8smodule.sh"

# umoci and skopeo pack the images, the static busybox fills them (Debian packages; the
# glibc-dns-testing image's are Essential or Priority required on Debian).
install_packages() {
  local pkgs=() p
  for p in umoci skopeo; do
    command -v "$p" >/dev/null 2>&1 || pkgs+=("$p")
  done
  dpkg-query -W -f='${Status}' busybox-static 2>/dev/null | grep -q 'install ok installed' ||
    pkgs+=(busybox-static)
  [ ${#pkgs[@]} -eq 0 ] && return
  if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null 2>&1; then
    die "missing ${pkgs[*]}: install them (as root, with apt-get)"
  fi
  say "installing ${pkgs[*]} (Debian packages)"
  DEBIAN_FRONTEND=noninteractive apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${pkgs[@]}" >/dev/null
}

cmd_deps() {
  [ $# -eq 0 ] || usage
  install_packages
  local cache ver
  ver=$(k8s_version)
  cache=$(cache_dir)
  build_e2e "$cache" "$ver"
  echo "E2E_TEST=$cache/e2e.test"
  echo "GINKGO=$cache/ginkgo"
  build_e2e_images "$cache"
}

# The paths deps prints (NAME=path lines), as variables.
deps_paths() {
  local out line
  out=$("$@") || die "$* failed"
  while IFS= read -r line; do
    case $line in
    [A-Z_]*=*) export "${line?}" ;;
    esac
  done <<<"$out"
}

report_dir=$PWD/conformance-report
report_flag() {
  if [ "${1:-}" = --report-dir ]; then
    [ -n "${2:-}" ] || die "--report-dir needs a directory"
    report_dir=$(realpath -m "$2")
    return 0
  fi
  return 1
}

cmd_run() {
  if report_flag "$@"; then shift 2; fi
  [ -n "${KUBECONFIG:-}" ] || die "run: set KUBECONFIG to the cluster's admin kubeconfig"
  command -v kubectl >/dev/null 2>&1 || die "run: kubectl is not in PATH (the suite runs it)"
  local cache
  cache=$(cache_dir)
  [ -x "$cache/e2e.test" ] && [ -x "$cache/ginkgo" ] || die "run: no e2e.test or ginkgo in $cache: run hack/conformance.sh deps first"
  mkdir -p "$report_dir"
  run_sets "$cache/e2e.test" "$cache/ginkgo" "$report_dir" "$@"
}

cmd_all() {
  [ "$(id -u)" = 0 ] || die "all must run as root (real nodes: namespaces, mounts, containerd)"
  local work=/tmp/crdipc-conformance
  if [ "${1:-}" = --down ]; then
    cluster_down "$work"
    return
  fi
  if report_flag "$@"; then shift 2; fi
  [ -x "$repo/bin/crdipc" ] && [ -s "$repo/bin/crdipc-image.tar" ] || die "all: bin/crdipc-image.tar missing: make image first"
  deps_paths "$repo/hack/realnode.sh" deps
  deps_paths cmd_deps
  # A cluster of an earlier run that was interrupted goes first.
  cluster_down "$work" 2>/dev/null || true
  if [ "${KEEP_CLUSTER:-}" != 1 ]; then
    trap 'cluster_down "'"$work"'"' EXIT
  fi
  cluster_up "$work" "$E2E_BUSYBOX_TAR" "$AGNHOST_TAR" "$GLIBC_DNS_TESTING_TAR" "$NGINX_TAR"
  mkdir -p "$report_dir"
  local rc=0
  run_sets "$(cache_dir)/e2e.test" "$(cache_dir)/ginkgo" "$report_dir" "$@" || rc=$?
  return $rc
}

[ $# -ge 1 ] || usage
sub=$1
shift
case $sub in
deps) cmd_deps "$@" ;;
run) cmd_run "$@" ;;
all) cmd_all "$@" ;;
-h | --help | help) usage ;;
*) usage ;;
esac
