#!/usr/bin/env bash
# Installs, from Debian, what the tests need that a fresh machine (Go, gcc, kubectl,
# Node) may lack; `make test` runs it first.
#  - prometheus: the SCM end-to-end test scrapes the metrics agent with a real
#    Prometheus server (without it that test skips, unless CRDIPC_REQUIRE_PROMETHEUS=1);
#  - e2fsprogs (mkfs.ext4), util-linux (blkid, losetup) and mount: the CSI Node service
#    formats replica files and loop-mounts them.
set -euo pipefail

pkgs=()
command -v prometheus >/dev/null 2>&1 || pkgs+=(prometheus)
command -v mkfs.ext4 >/dev/null 2>&1 || pkgs+=(e2fsprogs)
command -v blkid >/dev/null 2>&1 || pkgs+=(util-linux)
command -v mount >/dev/null 2>&1 || pkgs+=(mount)
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
