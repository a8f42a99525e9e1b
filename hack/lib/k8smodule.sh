# shellcheck shell=bash disable=SC2154 # repo: the sourcing script's
# Building k8s.io/kubernetes packages (kubelet, kube-proxy, e2e.test, agnhost) from the module
# versions the repository pins, without touching the checkout; sourced by hack/realnode.sh and
# hack/conformance.sh.

# k8s_module DIR: a module in DIR with the repository's go.mod and go.sum and an empty main
# package, where `go ... -mod=mod` adds what the repository's own module lacks for packages
# only Kubernetes' binaries import, without touching the checkout. Replacements by a relative
# path (third_party/) are made absolute: they would point into DIR otherwise (a cold
# `realnode.sh deps` failed on that once go.mod gained one).
k8s_module() {
  local dir=$1 old new
  cp "$repo/go.mod" "$repo/go.sum" "$dir/"
  printf 'package main\n\nfunc main() {}\n' >"$dir/main.go"
  while read -r old new; do
    (cd "$dir" && go mod edit -replace "$old=$(realpath -m "$repo/$new")")
  done < <(awk '
    { sub(/^[ \t]*replace[ \t]+/, "") }
    $0 ~ /=>[ \t]+\.\.?\// {
      n = split($0, f, /[ \t]+/)
      for (i = 1; i <= n; i++) if (f[i] == "=>") { print (i == 3 ? f[1] "@" f[2] : f[1]), f[i + 1]; break }
    }' "$repo/go.mod")
}

# k8s_go DIR ARG...: go in the module k8s_module made.
k8s_go() {
  local dir=$1
  shift
  (cd "$dir" && GOWORK=off GOFLAGS="${GOFLAGS:+$GOFLAGS }-mod=mod" go "$@")
}
