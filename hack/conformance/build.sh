# shellcheck shell=bash disable=SC2154 # repo, die, say: hack/conformance.sh's
# What `hack/conformance.sh deps` builds (sourced by it, after hack/lib/oci.sh and
# hack/realnode/build.sh, whose image helpers it uses): e2e.test and the ginkgo CLI from the
# modules go.mod pins, and the images the storage suites run, named as the suite's
# test/utils/image names them with its default registry. Nothing is pulled.
#
#   build_e2e CACHE VERSION    # CACHE/e2e.test, CACHE/ginkgo (each built when missing)
#   build_e2e_images CACHE     # the images' docker-archives; prints E2E_BUSYBOX_TAR=, ...
#   e2e_image_ref ID [K8S_DIR] # test/utils/image's name of an image: e2e_image_ref Agnhost
#
# Every go build here compiles k8s.io/kubernetes packages (minutes, GBs of memory): callers on
# a shared machine hold the heavy lock (flock /tmp/crdipc-heavy.lock) around deps.

# The directory of the pinned k8s.io/kubernetes in the module cache (test/utils/image's
# manifest, agnhost's VERSION and files).
k8s_module_dir() {
  local dir
  dir=$(cd "$repo" && GOWORK=off go mod download k8s.io/kubernetes &&
    GOWORK=off go list -m -f '{{.Dir}}' k8s.io/kubernetes) || die "k8s.io/kubernetes is not in the module cache and cannot be downloaded"
  [ -d "$dir/test/utils/image" ] || die "$dir has no test/utils/image"
  echo "$dir"
}

# e2e_image_ref ID [K8S_DIR]: REGISTRY/NAME:TAG of the image test/utils/image calls ID
# (BusyBox, Agnhost, ...) in the pinned module (or K8S_DIR), read from its manifest.go: with
# its default registry (initRegistry), which KUBE_TEST_REPO_LIST would remap.
e2e_image_ref() {
  local manifest list name tag registry
  manifest=${2:-$(k8s_module_dir)}/test/utils/image/manifest.go
  # configs[Agnhost] = Config{list.PromoterE2eRegistry, "agnhost", "2.66.1"}
  read -r list name tag < <(sed -n 's/^[[:space:]]*configs\['"$1"'\] = Config{list\.\([A-Za-z0-9]*\), "\([^"]*\)", "\([^"]*\)"}.*/\1 \2 \3/p' "$manifest")
  [ -n "${tag:-}" ] || die "no configs[$1] = Config{list.X, \"name\", \"tag\"} in $manifest"
  # initRegistry = RegistryList{ ... PromoterE2eRegistry: "registry.k8s.io/e2e-test-images", ...
  registry=$(sed -n '/initRegistry = RegistryList{/,/^[[:space:]]*}/s/^[[:space:]]*'"$list"':[[:space:]]*"\([^"]*\)",.*/\1/p' "$manifest")
  [ -n "$registry" ] || die "no default $list in initRegistry of $manifest"
  echo "$registry/$name:$tag"
}

# The -X flags that make a module build report VERSION (a module build says
# v0.0.0-master+$Format:%H$ otherwise): component-base's, as build_binaries sets them for the
# kubelet, and client-go's as upstream's hack/lib/version.sh sets them too (its user agent).
k8s_version_ldflags() {
  local ver=$1 major minor pkg flags=()
  major=${ver#v}
  major=${major%%.*}
  minor=${ver#v*.}
  minor=${minor%%.*}
  for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    flags+=("-X $pkg.gitVersion=$ver -X $pkg.gitMajor=$major -X $pkg.gitMinor=$minor -X $pkg.gitTreeState=clean")
  done
  echo "${flags[*]}"
}

# The github.com/onsi/ginkgo/v2 version the module graph selects: the CLI must be the library's
# (ginkgo -p runs e2e.test's specs in parallel through it and warns on a mismatch).
ginkgo_module_version() {
  local v
  v=$(cd "$repo" && GOWORK=off go list -m -f '{{.Version}}' github.com/onsi/ginkgo/v2) ||
    die "github.com/onsi/ginkgo/v2 is not in the module graph of $repo/go.mod"
  echo "$v"
}

# build_e2e CACHE VERSION: CACHE/e2e.test from upstream's k8s.io/kubernetes/test/e2e (every
# suite; -storage.testdriver selects crdipc's External.Storage specs), and CACHE/ginkgo, each
# built when missing (ginkgo also when it is not the selected version).
build_e2e() {
  local cache=$1 ver=$2 gv t0 need_e2e=1 need_ginkgo=1
  command -v go >/dev/null 2>&1 || die "go is not in PATH"
  gv=$(ginkgo_module_version)
  [ -x "$cache/e2e.test" ] && need_e2e=""
  if [ -x "$cache/ginkgo" ] && [ "$("$cache/ginkgo" version 2>/dev/null)" = "Ginkgo Version ${gv#v}" ]; then
    need_ginkgo=""
  fi
  if [ -z "$need_e2e$need_ginkgo" ]; then
    say "e2e.test $ver, ginkgo $gv: cached in $cache"
    return
  fi
  mkdir -p "$cache"
  # A subshell: its EXIT trap removes the module, leaving the caller's traps alone.
  (
    mod=$(mktemp -d)
    trap 'rm -rf "$mod"' EXIT
    k8s_module "$mod"
    if [ -n "$need_e2e" ]; then
      say "building e2e.test $ver (~2,800 packages: minutes and ~4 GB of memory on a cold build cache; 2.5 min warm)"
      t0=$SECONDS
      # -s -w as upstream's non-debug builds (hack/lib/golang.sh); not its -trimpath and
      # tags, which would compile every package anew instead of reusing the build cache.
      k8s_go "$mod" test -c -ldflags "-s -w $(k8s_version_ldflags "$ver")" -o "$mod/e2e.test" \
        k8s.io/kubernetes/test/e2e
      mv "$mod/e2e.test" "$cache/e2e.test"
      say "e2e.test built in $((SECONDS - t0))s"
    fi
    if [ -n "$need_ginkgo" ]; then
      say "building ginkgo $gv"
      k8s_go "$mod" build -o "$mod/ginkgo" github.com/onsi/ginkgo/v2/ginkgo
      mv "$mod/ginkgo" "$cache/ginkgo"
    fi
  )
}

# build_e2e_images CACHE: the images of the pinned test/utils/image the storage suites run, as
# docker-archives in CACHE (the tag in the file name), each rebuilt when stale. Prints
# E2E_BUSYBOX_TAR=, AGNHOST_TAR=, GLIBC_DNS_TESTING_TAR= and NGINX_TAR=.
#  - busybox: most pods of the suites (e2epod's default test image on Linux);
#  - agnhost: subPath's containers (its mounttest subcommand);
#  - glibc-dns-testing: multiVolume's concurrent-access pods, for GNU coreutils' dd
#    (oflag=nocache, iflag=direct, which busybox's dd lacks: storage/utils says so);
#  - nginx: volumes' "should allow exec of files on the volume" (a /bin/sh -ec script).
build_e2e_images() {
  local cache=$1 kdir busybox ref tar
  kdir=$(k8s_module_dir)
  busybox=$(command -v busybox 2>/dev/null || echo /bin/busybox)
  ! ldd "$busybox" >/dev/null 2>&1 || die "$busybox is dynamically linked: install busybox-static"
  mkdir -p "$cache"
  # Upstream's is Docker Hub's busybox: every applet, root and nobody, sh its command. The
  # suites' pods run shell commands in it (dd, sha256sum, base64, blockdev, stat, ...).
  ref=$(e2e_image_ref BusyBox "$kdir")
  tar=$cache/e2e-busybox-${ref##*:}.tar
  if stale "$tar" "$busybox" "${BASH_SOURCE[0]}"; then
    say "building $ref from $busybox"
    busybox_rootfs "$busybox"
    image_end "$ref" "$tar" --config.cmd sh --config.env "PATH=$default_path"
  fi
  echo "E2E_BUSYBOX_TAR=$tar"

  ref=$(e2e_image_ref Agnhost "$kdir")
  tar=$cache/agnhost-${ref##*:}.tar
  stale "$tar" "$busybox" "${BASH_SOURCE[0]}" && build_agnhost_image "$kdir" "$ref" "$tar" "$busybox"
  echo "AGNHOST_TAR=$tar"

  ref=$(e2e_image_ref GlibcDnsTesting "$kdir")
  tar=$cache/glibc-dns-testing-${ref##*:}.tar
  stale "$tar" /var/lib/dpkg/status "${BASH_SOURCE[0]}" && build_glibc_dns_testing_image "$ref" "$tar"
  echo "GLIBC_DNS_TESTING_TAR=$tar"

  # Upstream's is nginx on Alpine. This one holds busybox only, no nginx: the one storage spec
  # that runs it gives it a command (a shell script); a spec that served with nginx would fail
  # here, loudly (its command stays upstream's: nginx -g 'daemon off;').
  ref=$(e2e_image_ref Nginx "$kdir")
  tar=$cache/nginx-${ref##*:}.tar
  if stale "$tar" "$busybox" "${BASH_SOURCE[0]}"; then
    say "building $ref from $busybox (a shell, no nginx)"
    busybox_rootfs "$busybox"
    image_end "$ref" "$tar" --config.cmd nginx --config.cmd -g --config.cmd 'daemon off;' \
      --config.env "PATH=$default_path" --config.exposedports 80/tcp --config.stopsignal SIGQUIT
  fi
  echo "NGINX_TAR=$tar"
}

# The PATH of Docker Hub's images (busybox, debian, alpine).
readonly default_path=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin

# busybox_rootfs BUSYBOX: image_begin's rootfs ($r) with BUSYBOX and a link for every applet,
# users root and nobody, as Docker Hub's busybox image has them.
busybox_rootfs() {
  image_begin
  # shellcheck disable=SC2046 # one applet a word
  add_busybox "$r" "$1" $("$1" --list)
  mkdir -p "$r"/{sbin,usr/bin,usr/sbin,proc,sys,dev,root,var}
  printf 'nobody:x:65534:65534:nobody:/:/bin/false\n' >>"$r/etc/passwd"
  printf 'nogroup:x:65534:\n' >>"$r/etc/group"
}

# build_agnhost_image K8S_DIR REF OUT BUSYBOX: test/images/agnhost as its Dockerfile lays it
# out — /agnhost (static, main.Version from its VERSION file as its Makefile sets it) the
# entrypoint with `pause` the command, /agnhost-2 a link to it, /uploads, porter's
# /localhost.crt and /localhost.key, the user user-defined-in-image (1000) in the group
# group-defined-in-image (50000) — on busybox instead of Alpine: every applet (sh, nc, ip,
# mount, ...) for the shell commands tests run in it. Left out, as no storage suite uses
# them and they are fetched from the network upstream: Alpine's bind-tools, curl, iperf,
# socat, bash and iproute2 (busybox has ip and nc), coredns, and the fake registry's
# /var/registry.
build_agnhost_image() {
  local kdir=$1 ref=$2 out=$3 busybox=$4 src version t0
  src=$kdir/test/images/agnhost
  version=$(<"$src/VERSION")
  say "building $ref from k8s.io/kubernetes/test/images/agnhost (static, version $version)"
  busybox_rootfs "$busybox"
  mkdir -p "$r"/{usr/local/bin,uploads,home/user-defined-in-image}
  t0=$SECONDS
  (
    mod=$(mktemp -d)
    trap 'rm -rf "$mod"' EXIT
    k8s_module "$mod"
    # Static, as upstream's image-util.sh builds it. CGO_ENABLED=0 is a build of its own:
    # nothing of a cgo build's cache (the repository's, e2e.test's) is reused.
    CGO_ENABLED=0 k8s_go "$mod" build -ldflags "-s -w -X main.Version=$version" -o "$r/agnhost" \
      k8s.io/kubernetes/test/images/agnhost
  )
  say "agnhost built in $((SECONDS - t0))s"
  ln -s agnhost "$r/agnhost-2"
  install -m 0644 "$src/porter/localhost.crt" "$src/porter/localhost.key" "$r/"
  printf 'user-defined-in-image:x:1000:1000::/home/user-defined-in-image:/bin/sh\n' >>"$r/etc/passwd"
  printf '%s\n' 'user-defined-in-image:x:1000:' \
    'group-defined-in-image:x:50000:user-defined-in-image' >>"$r/etc/group"
  # Rootless, umoci records every file as root's anyway.
  [ "$(id -u)" != 0 ] || chown 1000:1000 "$r/home/user-defined-in-image"
  local port ports=()
  for port in 80 8080 8081 9376 5000; do ports+=(--config.exposedports "$port/tcp"); done
  image_end "$ref" "$out" --config.entrypoint /agnhost --config.cmd pause "${ports[@]}" \
    --config.env "PATH=$default_path"
}

# The host's Debian packages that make glibc-dns-testing's userland: upstream's is
# debian:bookworm-slim plus dnsutils; these are the tools of bookworm-slim the suites' shell
# commands call (sh, GNU dd, sha256sum, base64, grep, blockdev, ...). dnsutils (dig) and
# coredns, for DNS tests only, are left out.
readonly glibc_dns_testing_packages=(base-files bash coreutils dash debianutils diffutils
  findutils grep gzip hostname libc-bin mount sed tar util-linux)

# build_glibc_dns_testing_image REF OUT: the files of glibc_dns_testing_packages as this
# Debian host has them installed (docs, man pages and locales dropped), with the libraries
# their programs link, in a merged-/usr layout; root needed (the image is checked in a chroot).
build_glibc_dns_testing_image() {
  local ref=$1 out=$2 codename f d
  codename=$(. /etc/os-release && echo "${ID:-}/${VERSION_CODENAME:-}")
  [ "${codename%/*}" = debian ] || die "$ref is built from a Debian host's packages; this is ${codename%/*}"
  dpkg-query -W "${glibc_dns_testing_packages[@]}" >/dev/null ||
    die "install ${glibc_dns_testing_packages[*]} (Debian packages) for $ref"
  say "building $ref from this host's Debian $codename packages: ${glibc_dns_testing_packages[*]}"
  image_begin
  # Relative links: absolute ones would lead the copies below out of the rootfs.
  for d in bin lib lib64 sbin; do
    mkdir -p "$r/usr/$d"
    ln -s "usr/$d" "$r/$d"
  done
  dpkg-query -L "${glibc_dns_testing_packages[@]}" | grep '^/.' |
    grep -Ev '^/usr/share/(doc|man|info|locale|lintian|bug|doc-base)(/|$)' |
    while read -r f; do
      if [ -e "$f" ] || [ -L "$f" ]; then printf '%s\n' "${f#/}"; fi
    done | sort -u >"$tmp/files"
  tar -C / --no-recursion -cf - -T "$tmp/files" | tar -C "$r" --keep-directory-symlink -xpf -
  while read -r f; do
    # Programs only (ELF), not scripts.
    [ "$(head -c 4 "$f")" != $'\x7fELF' ] || oci_add_libs "$r" "/${f#"$r"/}"
  done < <(find "$r/usr/bin" "$r/usr/sbin" -type f -perm -u+x)
  mkdir -p "$r"/{tmp,var/tmp,root,proc,sys,dev,run,home}
  chmod 1777 "$r/tmp" "$r/var/tmp"
  printf '%s\n' 'root:x:0:0:root:/root:/bin/bash' 'daemon:x:1:1:daemon:/usr/sbin:/usr/sbin/nologin' \
    'bin:x:2:2:bin:/bin:/usr/sbin/nologin' 'sys:x:3:3:sys:/dev:/usr/sbin/nologin' \
    'nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin' >"$r/etc/passwd"
  printf '%s\n' 'root:x:0:' 'daemon:x:1:' 'bin:x:2:' 'sys:x:3:' 'nogroup:x:65534:' >"$r/etc/group"
  # The cache the loader reads, of the image's own libraries.
  chroot "$r" /sbin/ldconfig
  for f in /bin/sh /bin/dd /usr/bin/sha256sum /usr/bin/base64 /bin/grep /sbin/blockdev; do
    oci_check_elf "$r" "$(chroot "$r" /usr/bin/readlink -f "$f")"
  done
  # The suites' write and read checks use GNU dd's flags (oflag=nocache, iflag=direct).
  # shellcheck disable=SC2016 # the chroot's shell expands
  chroot "$r" /bin/sh -c 'dd --version | grep -q coreutils && yes | head -c 4096 >/tmp/f &&
    dd if=/tmp/f of=/tmp/g oflag=nocache bs=4096 count=1 2>/dev/null && cmp /tmp/f /tmp/g && rm /tmp/f /tmp/g' ||
    die "$ref: GNU dd (oflag=nocache) does not work in the image"
  image_end "$ref" "$out" --config.cmd bash --config.env "PATH=$default_path"
}
