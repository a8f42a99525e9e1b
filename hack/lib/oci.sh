# shellcheck shell=bash
# Image packing without a Docker engine or a registry, sourced by hack/image.sh and
# hack/realnode.sh: a rootfs becomes the one layer of an OCI image (umoci), written as a
# docker-archive (skopeo) that `ctr images import`, `docker load` and `skopeo copy` read with
# its name kept. Callers define die().
#
#   oci_new WORK                      # WORK/bundle/rootfs: fill it
#   oci_write WORK REF OUT [REPACK_FLAG...] -- [CONFIG_FLAG...]
#   oci_add_libs ROOTFS BINARY        # the loader and libraries BINARY links, at their paths
#   oci_check_elf ROOTFS PATH         # ROOTFS loads PATH (a file in it): loader, libraries

# An empty image unpacked into WORK/bundle. As root the layer records root-owned files;
# otherwise --rootless (the caller's files recorded as root's).
oci_new() {
  local work=$1 rootless=()
  [ "$(id -u)" = 0 ] || rootless=(--rootless)
  umoci init --layout "$work/oci"
  umoci new --image "$work/oci:img"
  umoci unpack "${rootless[@]}" --image "$work/oci:img" "$work/bundle" >/dev/null
}

# Packs WORK/bundle/rootfs as the layer, sets the configuration and writes OUT (replaced
# whole: the old archive stays until the new one is complete).
oci_write() {
  local work=$1 ref=$2 out=$3 repack=()
  shift 3
  while [ $# -gt 0 ] && [ "$1" != -- ]; do
    repack+=("$1")
    shift
  done
  [ $# -eq 0 ] || shift
  umoci repack --image "$work/oci:img" "${repack[@]}" "$work/bundle"
  umoci config --image "$work/oci:img" "$@"
  # skopeo reads a signature policy before any copy; none applies between two local files,
  # so say so rather than depend on the host's /etc/containers/policy.json.
  echo '{"default":[{"type":"insecureAcceptAnything"}]}' >"$work/policy.json"
  mkdir -p "$work/tmp"
  rm -f "$out.tmp"
  local copy=(skopeo --policy "$work/policy.json" copy --quiet --tmpdir "$work/tmp"
    "oci:$work/oci:img" "docker-archive:$out.tmp:$ref")
  # As root skopeo would record the blobs' digests in /var/lib/containers/cache, of no use
  # here: in a mount namespace of its own /var/lib is read-only and that cache stays in memory.
  if [ "$(id -u)" = 0 ] && unshare --mount true 2>/dev/null; then
    unshare --mount sh -c 'mount --bind -o ro /var/lib /var/lib 2>/dev/null; exec "$@"' sh "${copy[@]}"
  else
    "${copy[@]}"
  fi
  mv -f "$out.tmp" "$out"
}

# Copies the loader and every shared library BINARY links (as ldd resolves them on this
# host) into ROOTFS at the same paths.
oci_add_libs() {
  local r=$1 bin=$2 lib
  for lib in $(ldd "$bin" | awk '$2 == "=>" && $3 ~ /^\// {print $3} $1 ~ /^\// {print $1}'); do
    mkdir -p "$r$(dirname "$lib")"
    cp -L "$lib" "$r$lib"
  done
}

# Fails unless the image's own loader, run in ROOTFS (chroot: root only), finds every
# library PATH (an absolute path inside ROOTFS) names. A static PATH passes as is.
oci_check_elf() {
  local r=$1 path=$2 interp needed out
  interp=$(readelf -l "$r$path" | sed -n 's/.*Requesting program interpreter: \(.*\)]$/\1/p')
  [ -n "$interp" ] || return 0
  needed=$(readelf -d "$r$path" | sed -n 's/.*(NEEDED).*\[\(.*\)\]$/\1/p' | tr '\n' ' ')
  [ "$(id -u)" = 0 ] || die "checking $path's libraries in the image needs root (chroot)"
  # The interpreter's path may be a symlink that is absolute inside ROOTFS: resolve it there.
  # shellcheck disable=SC2016 # $1 is the chroot's shell's
  chroot "$r" /bin/sh -c '[ -e "$1" ]' sh "$interp" 2>/dev/null ||
    die "$path needs the loader $interp, which the image lacks (its libraries: $needed)"
  out=$(chroot "$r" "$interp" --list "$path" 2>&1) ||
    die "the image's loader $interp cannot load $path: $out"
  if grep -q 'not found' <<<"$out"; then
    die "libraries $path needs are missing from the image: $(grep 'not found' <<<"$out" | tr -s '\t\n' '  ')"
  fi
}
