#!/usr/bin/env bash
# Installs, from Debian, what the tests need that a fresh machine (Go, gcc, kubectl,
# Node) may lack; `make test` runs it first.
#  - prometheus: the SCM end-to-end test scrapes the metrics agent with a real
#    Prometheus server (without it that test skips, unless CRDIPC_REQUIRE_PROMETHEUS=1);
#  - e2fsprogs (mkfs.ext4), util-linux (blkid, losetup) and mount: the CSI Node service
#    formats replica files and loop-mounts them;
#  - xfsprogs (mkfs.xfs, xfs_growfs): volume expansion is tested online on xfs, which grows
#    with the privilege mounting needs (ext4 online needs CAP_SYS_RESOURCE, which CI lacks);
#  - fio: `crdipc bench volume` and its test measure the volume data path with it (without
#    it that test skips, unless CRDIPC_REQUIRE_FIO=1).
#  - chromium: the console end-to-end test loads up's console page in headless Chromium and
#    watches it update (without it that test skips, unless CRDIPC_REQUIRE_CHROMIUM=1).
# and, from the Go module proxy:
#  - btcd, a Bitcoin full node in Go: the simulated nodes run BitcoinNetwork pods with it
#    (without it the Bitcoin tests skip, unless CRDIPC_REQUIRE_BTCD=1);
#  - versitygw, an S3 server in Go (Apache-2.0): the backup tests store into a real
#    bucket of it (without it they skip, unless CRDIPC_REQUIRE_S3=1).
#
# `hack/test-deps.sh --list` prints, one a line, the commands it guarantees (from the same
# lists it installs from): internal/testenv/require's tests check that every tool a test's
# capability check names is installed by a script or on a fresh machine.
set -euo pipefail

# command:package, for each command the tests look up, from Debian.
apt_tools=(prometheus:prometheus mkfs.ext4:e2fsprogs mkfs.xfs:xfsprogs xfs_growfs:xfsprogs
  blkid:util-linux losetup:mount mount:mount fio:fio chromium:chromium)
# command:module, from the Go module proxy (keep in step with internal/bitcoin/btcd.Module and
# internal/storage/backup/s3local.Module).
go_tools=(btcd:github.com/btcsuite/btcd@v0.26.2 versitygw:github.com/versity/versitygw/cmd/versitygw@v1.8.0)

if [ "${1:-}" = --list ]; then
  for entry in "${apt_tools[@]}" "${go_tools[@]}"; do echo "${entry%%:*}"; done
  exit 0
fi
[ $# -eq 0 ] || { echo "usage: hack/test-deps.sh [--list]" >&2; exit 2; }

for entry in "${go_tools[@]}"; do
  cmd=${entry%%:*} module=${entry#*:}
  if ! command -v "$cmd" >/dev/null 2>&1 && [ ! -x "$(go env GOPATH)/bin/$cmd" ]; then
    echo "== installing $cmd ($module)"
    go install "$module"
  fi
done

pkgs=()
for entry in "${apt_tools[@]}"; do
  pkg=${entry#*:}
  command -v "${entry%%:*}" >/dev/null 2>&1 || [[ " ${pkgs[*]} " == *" $pkg "* ]] || pkgs+=("$pkg")
done
[ ${#pkgs[@]} -eq 0 ] && exit 0

sudo_cmd=""
if [ "$(id -u)" != 0 ]; then
  if ! command -v sudo >/dev/null 2>&1; then
    echo "test-deps: missing ${pkgs[*]} and not root (no sudo): install them with apt-get" >&2
    exit 1
  fi
  sudo_cmd=sudo
fi
echo "== installing ${pkgs[*]} (Debian packages)"
export DEBIAN_FRONTEND=noninteractive
$sudo_cmd apt-get update -qq
$sudo_cmd apt-get install -y -qq --no-install-recommends "${pkgs[@]}" >/dev/null
