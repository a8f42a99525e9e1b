#!/usr/bin/env bash
# Builds the crdipc container image without a Docker daemon or a registry (`make image`), and
# writes it to bin/crdipc-image.tar, a docker-archive for `ctr -n k8s.io images import`,
# `docker load` or `skopeo copy`, tagged crdipc/crdipc:<contents of VERSION> (IMAGE=name:tag
# overrides); the binary in it is left as bin/crdipc. CI and the development machines
# have no Docker engine, so the Dockerfile (`make image-docker`) cannot be built there; this
# script builds the same contents from the same sources:
#  - /usr/local/bin/crdipc: built as `make build` and `go test` build (cgo on, no -trimpath;
#    -s -w only change the link), so a warm build cache makes it a relink instead of a second
#    compile of everything. It links glibc dynamically: the image's libc6 is bookworm's, as
#    the build host's must be, and the script checks that the image loads it;
#  - Debian bookworm's mount, util-linux, e2fsprogs, xfsprogs and fuse3 with the closure of
#    their Depends and Pre-Depends (libraries, and what apt would install with them, python3
#    for xfsprogs included), plus base-files (/etc/os-release, the FHS directories) and dash
#    (/bin/sh: fsck.xfs, xfs_admin and xfs_info are shell scripts). debian:bookworm-slim has
#    the Essential set besides (bash, coreutils, ...), which no tool here needs.
# How: a private apt configuration (its own sources, lists and .deb cache under $cache, so
# the host's apt sources, lists and hooks are neither used nor touched) resolves the closure
# and downloads the .debs; each is extracted into a rootfs (no maintainer scripts run: what
# they would have created is created below), docs, man pages and locales are dropped, and
# umoci packs the rootfs as one layer of an OCI image that skopeo writes as a docker-archive.
# Root is needed: the files must be root-owned in the layer (fusermount3 setuid root), and
# umoci unpacks and repacks as root (its --rootless mode would record the caller's uid).
# A re-run replaces the tar; the .debs stay cached (a warm run downloads no package).
#
# Environment: IMAGE (reference in the archive), DEBIAN_MIRROR, DEBIAN_SECURITY_MIRROR,
# CRDIPC_IMAGE_CACHE (default ${XDG_CACHE_HOME:-$HOME/.cache}/crdipc/image),
# SOURCE_DATE_EPOCH (default: the last commit's time; the mtimes and dates of the image),
# CRDIPC_IMAGE_KEEP=1 keeps the scratch directory bin/image (OCI layout and rootfs).
set -euo pipefail

# -P: the checkout itself, also when reached through a symlinked directory.
cd -P "$(dirname "$0")/.."
# Files and directories created here get the usual modes, whatever the caller's umask.
umask 022
# shellcheck source=hack/lib/oci.sh
. hack/lib/oci.sh

log() { echo "== image [${SECONDS}s]: $*" >&2; }
die() { echo "hack/image.sh: $*" >&2; exit 1; }

if [ "$(id -u)" != 0 ]; then
  die "must run as root (the image's files are root-owned, and umoci packs them as root): run 'sudo make image', or 'make image-docker' where a Docker engine runs"
fi

version=$(cat VERSION)
image=${IMAGE:-crdipc/crdipc:$version}
out=bin/crdipc-image.tar
work=bin/image
cache=${CRDIPC_IMAGE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/crdipc/image}
mirror=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
security_mirror=${DEBIAN_SECURITY_MIRROR:-http://deb.debian.org/debian-security}
keyring=/usr/share/keyrings/debian-archive-keyring.gpg
# What the Dockerfile installs on debian:bookworm-slim, and the two extras said above.
packages=(mount util-linux e2fsprogs xfsprogs fuse3 base-files dash)

# The Debian packages and the Go binary must be of one architecture: the host's.
command -v dpkg >/dev/null 2>&1 || die "needs dpkg and apt-get (a Debian or Ubuntu host)"
arch=$(dpkg --print-architecture)
case "$arch" in
  amd64 | arm64 | s390x | riscv64) goarch=$arch ;;
  ppc64el) goarch=ppc64le ;;
  *) die "unsupported architecture $arch" ;;
esac

# Tools: from the host's own apt sources (not the private configuration below).
missing=()
command -v umoci >/dev/null 2>&1 || missing+=(umoci)
command -v skopeo >/dev/null 2>&1 || missing+=(skopeo)
[ -r "$keyring" ] || missing+=(debian-archive-keyring)
if [ ${#missing[@]} -gt 0 ]; then
  log "installing ${missing[*]} (apt-get)"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
command -v go >/dev/null 2>&1 || die "needs go (the crdipc binary is built from this checkout)"

# Dates and mtimes from SOURCE_DATE_EPOCH, so that two builds of one commit make the same
# layer and config (the Debian packages permitting: the lists move on with security updates).
if [ -z "${SOURCE_DATE_EPOCH:-}" ]; then
  SOURCE_DATE_EPOCH=$(git log -1 --format=%ct 2>/dev/null || stat -c %Y VERSION)
fi
created=$(date -u -d "@$SOURCE_DATE_EPOCH" +%Y-%m-%dT%H:%M:%SZ)

# One build at a time per cache, the second waiting (two in one checkout would also share
# bin/image): apt's own locks would make the second one fail instead.
mkdir -p "$cache"
exec 9>"$cache/lock"
flock 9
rm -rf "$work"
mkdir -p "$work"
trap 'if [ -n "${gobuild:-}" ]; then kill "$gobuild" 2>/dev/null || true; fi' EXIT

# The binary builds while apt works and the rootfs is assembled (the build is CPU, apt mostly
# network). It is bin/crdipc, `make build`'s: the host runs the very binary the image has
# (test/realnode runs `up` with it). Without git, or with a checkout git refuses to read
# (another owner's, under sudo), go build would fail on stamping the commit that `crdipc
# version` prints: build without it then.
buildvcs=()
if [ -e .git ] && ! git rev-parse HEAD >/dev/null 2>&1; then
  log "git cannot read this checkout: building without the commit stamp (-buildvcs=false)"
  buildvcs=(-buildvcs=false)
fi
[ "$(go env GOARCH)" = "$goarch" ] || die "go builds for $(go env GOARCH), the Debian packages are $arch"
log "building crdipc (as make build, -ldflags='-s -w')"
go build "${buildvcs[@]}" -ldflags="-s -w" -o bin/crdipc ./cmd/crdipc 9>&- &
gobuild=$!

# The private apt: APT_CONFIG is read first, and Dir::Etc::Parts pointed at an empty
# directory keeps the host's apt.conf.d (hooks such as docker-clean's or appstream's, extra
# index targets) out; sources.list.d, preferences and the dpkg status are private too. An
# empty status file makes apt resolve the full closure, as onto an empty system.
a=$cache/apt
mkdir -p "$a/parts" "$a/state/lists/partial" "$a/cache" "$a/log" "$cache/debs/partial"
: >"$a/state/status"
cat >"$a/sources.list" <<EOF
deb [signed-by=$keyring] $mirror bookworm main
deb [signed-by=$keyring] $mirror bookworm-updates main
deb [signed-by=$keyring] $security_mirror bookworm-security main
EOF
cat >"$a/apt.conf" <<EOF
Dir::Etc::Main "/dev/null";
Dir::Etc::Parts "$a/parts";
Dir::Etc::SourceList "$a/sources.list";
Dir::Etc::SourceParts "$a/parts";
Dir::Etc::Preferences "/dev/null";
Dir::Etc::PreferencesParts "$a/parts";
Dir::State "$a/state";
Dir::State::status "$a/state/status";
Dir::Cache "$a/cache";
Dir::Cache::srcpkgcache "";
Dir::Cache::archives "$cache/debs";
Dir::Log "$a/log";
APT::Architecture "$arch";
APT::Architectures { "$arch"; };
APT::Install-Recommends "false";
APT::Install-Suggests "false";
Acquire::Languages "none";
// The cache is root's (0700 home): apt's unprivileged _apt user could not write there.
APT::Sandbox::User "root";
EOF
export APT_CONFIG=$a/apt.conf

log "apt-get update (Debian bookworm, private lists in $a)"
apt-get update -qq

# The closure as apt's resolver computes it: Depends and Pre-Depends, the first of each set
# of alternatives, one provider of a virtual package. (`apt-cache depends --recurse` follows
# every alternative and every provider: it adds perl, cdebconf, libelogind0 and more.)
mapfile -t closure < <(apt-get install -s "${packages[@]}" |
  awk '$1 == "Inst" { gsub(/[()]/, ""); print $2 " " $3 }')
[ ${#closure[@]} -gt 0 ] || die "apt resolved no packages for ${packages[*]}"
# The .deb of each pkg=version, named as apt names it (an epoch's colon as %3a). apt-get
# download checks each against the lists' hashes and renames it into place only then, so a
# file present is a whole one.
debfile() { compgen -G "$cache/debs/${1}_${2//:/%3a}_*.deb" | head -n1; }
fetch=()
for entry in "${closure[@]}"; do
  read -r pkg ver <<<"$entry"
  debfile "$pkg" "$ver" >/dev/null || fetch+=("$pkg=$ver")
done
log "${#closure[@]} packages, ${#fetch[@]} to download into $cache/debs"
if [ ${#fetch[@]} -gt 0 ]; then
  (cd "$cache/debs" && apt-get download -qq "${fetch[@]}")
fi

# The rootfs, in the bundle umoci unpacks from an empty image (repack then records it all).
oci_new "$work"
r=$work/bundle/rootfs

# Merged /usr, as debian:bookworm-slim: /bin, /sbin, /lib, /lib64 are symlinks into /usr.
# Packages still ship files under /bin etc.; tar --keep-directory-symlink extracts them
# through the links (dpkg-deb -x would replace the links by directories).
mkdir -p "$r/usr/bin" "$r/usr/sbin" "$r/usr/lib" "$r/usr/lib64"
for d in bin sbin lib lib64; do ln -s "usr/$d" "$r/$d"; done
log "extracting the packages into the rootfs"
mkdir -p "$r/var/lib/dpkg" "$work/lists"
: >"$r/var/lib/dpkg/status"
for entry in "${closure[@]}"; do
  read -r pkg ver <<<"$entry"
  deb=$(debfile "$pkg" "$ver") || die "no .deb for $pkg $ver in $cache/debs"
  dpkg-deb --fsys-tarfile "$deb" | tar -x -v --keep-directory-symlink -C "$r" >"$work/lists/$pkg"
  # dpkg's database, as installing would leave it: `dpkg -l` in the image, and scanners,
  # see what is in it.
  dpkg-deb -f "$deb" | awk 'NR == 1 { print; print "Status: install ok installed"; next } { print }' \
    >>"$r/var/lib/dpkg/status"
  echo >>"$r/var/lib/dpkg/status"
done
mkdir -p "$r/var/lib/dpkg/info" "$r/var/lib/dpkg/updates"
# The cache keeps only this closure: versions Debian has replaced go.
declare -A used=()
for entry in "${closure[@]}"; do
  read -r pkg ver <<<"$entry"
  used[$(debfile "$pkg" "$ver")]=1
done
for f in "$cache/debs"/*.deb; do
  [ -n "${used[$f]:-}" ] || rm -f "$f"
done
# Through the merged-/usr links two packages could write one file, the later one winning
# silently: say so.
dups=$(cat "$work/lists"/* | grep -v '/$' | sed -E 's,^\./,,; s,^(bin|sbin|lib|lib64)/,usr/\1/,' |
  sort | uniq -d)
[ -z "$dups" ] || log "warning: files shipped by two packages (the later one kept): $dups"

# What the maintainer scripts would have made (none runs here), for what the tools use.
cat >"$r/etc/passwd" <<'EOF'
root:x:0:0:root:/root:/bin/sh
nonroot:x:65532:65532:nonroot:/home/nonroot:/usr/sbin/nologin
EOF
cat >"$r/etc/group" <<'EOF'
root:x:0:
nonroot:x:65532:
EOF
install -d -m 0750 -o 65532 -g 65532 "$r/home/nonroot"
install -d -m 0700 "$r/root"
install -d -m 1777 "$r/tmp" "$r/var/tmp" "$r/run/lock"
# libmount keeps its utab in /run/mount; /etc/mtab is the kernel's table, as on any system.
install -d -m 0755 "$r/run/mount" "$r/usr/local/bin" "$r/usr/local/sbin" "$r/usr/local/lib"
ln -sfn /proc/self/mounts "$r/etc/mtab"
echo "# UNCONFIGURED FSTAB FOR BASE SYSTEM" >"$r/etc/fstab"
# base-files' postinst: /var/run and /var/lock point into /run; dpkg's origin; /etc/profile.
rm -rf "$r/var/run" "$r/var/lock"
ln -s /run "$r/var/run"
ln -s /run/lock "$r/var/lock"
ln -sfn debian "$r/etc/dpkg/origins/default"
cp -p "$r/usr/share/base-files/profile" "$r/etc/profile"
# debianutils' postinst: /etc/shells; update-alternatives' links for awk and which.
cp -p "$r/usr/share/debianutils/shells" "$r/etc/shells"
ln -sfn mawk "$r/usr/bin/awk"
ln -sfn which.debianutils "$r/usr/bin/which"
# fuse3's postinst: fusermount3 is setuid root (the Dockerfile's image has it so too).
chmod 4755 "$r/usr/bin/fusermount3"
# libc-bin's trigger: the loader's cache (the host's ldconfig reads the rootfs, runs nothing of it).
echo 'include /etc/ld.so.conf.d/*.conf' >"$r/etc/ld.so.conf"
# Its aux-cache records inodes and ctimes, different on every build: not kept.
if command -v ldconfig >/dev/null 2>&1; then
  ldconfig -r "$r"
  rm -f "$r/var/cache/ldconfig/aux-cache"
fi

# Small: no documentation (its copyright files stay), manuals or translations.
find "$r/usr/share/doc" -mindepth 1 ! -type d ! -name copyright -delete
find "$r/usr/share/doc" -mindepth 1 -type d -empty -delete
rm -rf "$r/usr/share/man" "$r/usr/share/info" "$r/usr/share/locale" "$r/usr/share/lintian" \
  "$r/usr/share/linda" "$r/usr/share/bug"

log "waiting for the crdipc build"
wait "$gobuild"
gobuild=
install -m 0755 bin/crdipc "$r/usr/local/bin/crdipc"

# cgo links glibc: the image must hold the loader and every library the binary names, and a
# glibc no older than the one it was linked against (symbol versions only go forward).
oci_check_elf "$r" /usr/local/bin/crdipc
chroot "$r" /usr/local/bin/crdipc version >/dev/null || die "bin/crdipc does not run in the image (chroot $r)"
image_glibc=$(printf '%s\n' "${closure[@]}" | awk '$1 == "libc6" { split($2, v, "-"); print v[1] }')
host_glibc=$(getconf GNU_LIBC_VERSION | awk '{print $2}')
needs_glibc=$(readelf -V bin/crdipc | grep -o 'GLIBC_[0-9][0-9.]*' | sed 's/GLIBC_//' | sort -uV | tail -n1)
older() { [ "$1" != "$2" ] && [ "$(printf '%s\n' "$1" "$2" | sort -V | head -n1)" = "$1" ]; }
if readelf -l bin/crdipc | grep -q 'program interpreter'; then
  [ -n "$image_glibc" ] || die "the image has no libc6, and bin/crdipc links glibc"
  ! older "$image_glibc" "${needs_glibc:-0}" ||
    die "bin/crdipc needs glibc $needs_glibc, the image (Debian bookworm) has $image_glibc: build on Debian bookworm"
  # What the binary needs and that it runs in the image (the chroot above) are what counts; a
  # newer host is only a warning: its headers may differ from what the image runs.
  ! older "$image_glibc" "$host_glibc" ||
    echo "hack/image.sh: warning: this host's glibc $host_glibc is newer than the image's $image_glibc (Debian bookworm); bin/crdipc needs only $needs_glibc" >&2
  log "bin/crdipc links glibc (needs $needs_glibc; image $image_glibc, host $host_glibc): loads in the image"
fi

# Nothing newer than SOURCE_DATE_EPOCH (what this script made, the binary): the layer is
# then the same for the same inputs.
find "$r" -newermt "@$SOURCE_DATE_EPOCH" -print0 | xargs -0r touch -h -d "@$SOURCE_DATE_EPOCH"

log "writing $out ($image)"
# The Dockerfile's USER, ENTRYPOINT, CMD and LABELs; PATH as debian:bookworm-slim sets it.
oci_write "$work" "$image" "$out" --history.created "$created" \
  --history.created_by "hack/image.sh: Debian bookworm ${packages[*]} (with dependencies), /usr/local/bin/crdipc" \
  -- --no-history --created "$created" \
  --os linux --architecture "$goarch" \
  --config.user 65532:65532 \
  --config.entrypoint /usr/local/bin/crdipc --config.cmd --help \
  --config.env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
  --config.label org.opencontainers.image.title=crdipc \
  --config.label "org.opencontainers.image.description=Kubernetes custom resources as the channel between services" \
  --config.label org.opencontainers.image.source=https://github.com/crdipc/crdipc \
  --config.label "org.opencontainers.image.version=$version"

if [ "${CRDIPC_IMAGE_KEEP:-}" != 1 ]; then rm -rf "$work"; fi
log "done: $out, $(du -h "$out" | cut -f1) ($image; load with: ctr -n k8s.io images import $out)"
