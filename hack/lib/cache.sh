# shellcheck shell=bash disable=SC2154 # repo: the sourcing script's
# The pinned Kubernetes version and the cache the node components and the e2e suite are built
# into, shared by hack/realnode.sh and hack/conformance.sh (sourced). Callers define die().

# The k8s.io/kubernetes version the repository pins (its require line).
k8s_version() {
  local v
  v=$(awk '$1 == "k8s.io/kubernetes" && $2 ~ /^v1\./ && $3 != "=>" {print $2; exit}' "$repo/go.mod")
  [ -n "$v" ] || die "no k8s.io/kubernetes v1.x require line in $repo/go.mod"
  echo "$v"
}

# Binaries depend on both the Kubernetes and the Go version: the key holds both.
# REALNODE_CACHE overrides it.
cache_dir() {
  [ -z "${REALNODE_CACHE:-}" ] || { echo "$REALNODE_CACHE" && return; }
  command -v go >/dev/null 2>&1 || die "go is not in PATH (needed to find the build cache)"
  echo "${XDG_CACHE_HOME:-$HOME/.cache}/crdipc/realnode/$(k8s_version)-$(go env GOVERSION)"
}
