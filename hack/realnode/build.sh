# shellcheck shell=bash disable=SC2154 # repo, die, say: hack/realnode.sh's
# What `hack/realnode.sh deps` builds (sourced by it): kubelet and kube-proxy, and the images
# the nodes import, each a docker-archive in the cache, rebuilt when its source is newer.
# Nothing is pulled: pods use them with imagePullPolicy Never or IfNotPresent.

readonly pause_ref=registry.k8s.io/pause:3.10
readonly busybox_ref=docker.io/library/busybox:latest
readonly fio_ref=docker.io/library/fio:latest
# btcd at the release hack/test-deps.sh installs for the simulated nodes: one version.
btcd_module=$(grep -o 'github\.com/btcsuite/btcd@v[0-9][0-9.]*' "$repo/hack/test-deps.sh" | head -n1)
readonly btcd_module
readonly btcd_ref=docker.io/btcsuite/btcd:${btcd_module#*@}
readonly btcd_tar=btcd-${btcd_module#*@}.tar

# Builds kubelet and kube-proxy from the module cache. The repository's own module cannot
# build them as is (missing go.sum entries for packages only they import), and must not be
# changed: they are built in a module k8s_module makes (hack/lib/k8smodule.sh). Same versions
# as the repository, and a warm build cache is shared with it.
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
  k8s_module "$tmp"
  major=${ver#v}
  major=${major%%.*}
  minor=${ver#v*.}
  minor=${minor%%.*}
  say "building kubelet, kube-proxy $ver (minutes on a cold build cache, ~2.5 GB of memory)"
  # A module build reports v0.0.0-master+$Format:%H$ (the node's kubeletVersion) without these.
  k8s_go "$tmp" build \
    -ldflags "-X $pkg.gitVersion=$ver -X $pkg.gitMajor=$major -X $pkg.gitMinor=$minor -X $pkg.gitTreeState=clean" \
    -o "$tmp/out/" k8s.io/kubernetes/cmd/kubelet k8s.io/kubernetes/cmd/kube-proxy
  mkdir -p "$cache"
  mv "$tmp/out/kube-proxy" "$cache/kube-proxy"
  mv "$tmp/out/kubelet" "$cache/kubelet"
  rm -rf "$tmp"
  trap - EXIT
}

# Prints the archive of each image (NAME_TAR=path lines), building what is missing or stale.
build_images() {
  local cache=$1 busybox
  mkdir -p "$cache"
  build_pause_image "$cache"
  busybox=$(command -v busybox 2>/dev/null || echo /bin/busybox)
  # The static build: these images hold nothing else for it to load.
  ! ldd "$busybox" >/dev/null 2>&1 || die "$busybox is dynamically linked: install busybox-static"
  if stale "$cache/busybox.tar" "$busybox"; then
    say "building $busybox_ref from $busybox"
    image_begin
    # Every applet (sh, echo, cat, sleep, sha256sum, dd, ...) as `busybox --install -s`
    # would link it (that needs a chroot, so root).
    # shellcheck disable=SC2046 # one applet a word
    add_busybox "$r" "$busybox" $("$busybox" --list)
    mkdir -p "$r"/{sbin,usr/bin,usr/sbin,proc,sys,dev,root,var}
    printf 'nobody:x:65534:65534:nobody:/:/bin/false\n' >>"$r/etc/passwd"
    printf 'nogroup:x:65534:\n' >>"$r/etc/group"
    image_end "$busybox_ref" "$cache/busybox.tar" --config.cmd sh \
      --config.env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
  fi
  build_fio_image "$cache" "$busybox"
  build_btcd_image "$cache" "$busybox"
  echo "PAUSE_TAR=$cache/pause.tar"
  echo "BUSYBOX_TAR=$cache/busybox.tar"
  echo "FIO_TAR=$cache/fio.tar"
  echo "BTCD_TAR=$cache/$btcd_tar"
}

# True if TAR is missing, or older than a SOURCE or this file.
stale() {
  local tar=$1 src
  shift
  [ -s "$tar" ] || return 0
  for src in "$@" "${BASH_SOURCE[0]}"; do
    [ ! "$src" -nt "$tar" ] || return 0
  done
  return 1
}

# A scratch image, its rootfs in $r, until image_end packs it.
image_begin() {
  tmp=$(mktemp -d)
  oci_new "$tmp"
  r=$tmp/bundle/rootfs
}

image_end() {
  oci_write "$tmp" "$1" "$2" -- "${@:3}"
  rm -rf "$tmp"
}

# add_busybox ROOTFS BUSYBOX APPLET...: /bin/busybox, a link per applet, /tmp and root.
add_busybox() {
  local r=$1 applet
  mkdir -p "$r"/{bin,etc,tmp}
  chmod 1777 "$r/tmp"
  printf 'root:x:0:0:root:/root:/bin/sh\n' >"$r/etc/passwd"
  printf 'root:x:0:\n' >"$r/etc/group"
  cp "$2" "$r/bin/busybox"
  for applet in "${@:3}"; do
    [ "$applet" = busybox ] || ln -s busybox "$r/bin/$applet"
  done
}

build_pause_image() {
  local cache=$1 src="$repo/hack/realnode/pause.c"
  stale "$cache/pause.tar" "$src" || return 0
  say "building $pause_ref"
  image_begin
  gcc -Os -static -o "$r/pause" "$src"
  strip "$r/pause" 2>/dev/null || true
  image_end "$pause_ref" "$cache/pause.tar" --config.entrypoint /pause --config.user 65535:65535
}

# fio, the data checker of the storage tests (a program no crdipc code implements): the
# host's fio and the shared libraries it links, busybox for the shell.
build_fio_image() {
  local cache=$1 busybox=$2 fio
  fio=$(command -v fio) || die "fio is not installed"
  stale "$cache/fio.tar" "$fio" || return 0
  say "building $fio_ref from $fio"
  image_begin
  add_busybox "$r" "$busybox" sh cat echo sha256sum sync ls mkdir dd sleep cmp
  mkdir -p "$r"/{usr/bin,proc,sys,dev}
  cp "$fio" "$r/usr/bin/fio"
  oci_add_libs "$r" "$fio"
  image_end "$fio_ref" "$cache/fio.tar" --config.cmd fio --config.env PATH=/usr/bin:/bin
}

# btcd, a Bitcoin full node in Go, for BitcoinNetwork pods on real nodes (no bitcoind image
# can be fetched here): btcd and btcctl built static from the module, busybox for the shell.
build_btcd_image() {
  local cache=$1 busybox=$2 out=$1/$btcd_tar
  [ -n "$btcd_module" ] || die "hack/test-deps.sh names no github.com/btcsuite/btcd@VERSION"
  stale "$out" || return 0
  say "building $btcd_ref from $btcd_module"
  image_begin
  # shellcheck disable=SC2046 # one applet a word
  add_busybox "$r" "$busybox" $("$busybox" --list)
  mkdir -p "$r"/{usr/local/bin,root,proc,sys,dev}
  chmod 0700 "$r/root"
  GOBIN="$r/usr/local/bin" CGO_ENABLED=0 GOFLAGS='' go install -ldflags="-s -w" \
    "$btcd_module" "${btcd_module%@*}/cmd/btcctl@${btcd_module#*@}"
  image_end "$btcd_ref" "$out" --config.entrypoint /usr/local/bin/btcd \
    --config.env PATH=/usr/local/bin:/bin --config.env HOME=/root --config.workingdir /root \
    --config.exposedports 8333/tcp --config.exposedports 8334/tcp
}
