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
#    (without it the Bitcoin tests skip, unless CRDIPC_REQUIRE_BTCD=1).
set -euo pipefail

btcd_module=github.com/btcsuite/btcd@v0.26.2 # keep in step with internal/bitcoin/btcd.Module
if ! command -v btcd >/dev/null 2>&1 && [ ! -x "$(go env GOPATH)/bin/btcd" ]; then
  echo "== installing btcd ($btcd_module)"
  go install "$btcd_module"
fi

pkgs=()
command -v prometheus >/dev/null 2>&1 || pkgs+=(prometheus)
command -v mkfs.ext4 >/dev/null 2>&1 || pkgs+=(e2fsprogs)
command -v mkfs.xfs >/dev/null 2>&1 || pkgs+=(xfsprogs)
command -v blkid >/dev/null 2>&1 || pkgs+=(util-linux)
command -v mount >/dev/null 2>&1 || pkgs+=(mount)
command -v fio >/dev/null 2>&1 || pkgs+=(fio)
command -v chromium >/dev/null 2>&1 || pkgs+=(chromium)
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
