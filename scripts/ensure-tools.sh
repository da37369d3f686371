#!/usr/bin/env bash
# Installs what the build and the tests need beyond cargo, from Debian's
# packages, when it is missing:
# - protoc (protobuf-compiler), which the crate prost-protovalidate-types
#   runs at build time to compile buf/validate (our own proto/ is compiled
#   by protox and needs no protoc);
# - for the fault tests (crates/cli/tests/faults_*.rs): ip (iproute2) for
#   network namespaces, mkfs.ext4 (e2fsprogs) and losetup/mount
#   (util-linux, mount) for the small and slow disks, and libfaketime
#   (faketime) for the skewed clocks;
# - with the argument `console`, also for the console's browser tests
#   (tests/console, scripts/console-tests.sh): Chromium (chromium), which
#   playwright-core drives headless. Only then: it is large, and `make run`
#   and the build do not need it. Never `npx playwright install`: browsers
#   come from Debian's packages here.
set -euo pipefail

missing=()
for group in "$@"; do
  case "$group" in
    console) [ -x /usr/bin/chromium ] || missing+=(chromium) ;;
    *) echo "ensure-tools: unknown group $group (known: console)" >&2; exit 2 ;;
  esac
done
command -v protoc >/dev/null 2>&1 || missing+=(protobuf-compiler)
command -v ip >/dev/null 2>&1 || missing+=(iproute2)
command -v mkfs.ext4 >/dev/null 2>&1 || missing+=(e2fsprogs)
command -v losetup >/dev/null 2>&1 || missing+=(util-linux)
command -v mount >/dev/null 2>&1 || missing+=(mount)
[ -e /usr/lib/x86_64-linux-gnu/faketime/libfaketimeMT.so.1 ] || missing+=(faketime)

if [ "${#missing[@]}" -gt 0 ]; then
  echo "missing tools: installing Debian's ${missing[*]}"
  sudo=""
  [ "$(id -u)" -eq 0 ] || sudo="sudo"
  $sudo apt-get update -qq >/dev/null
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${missing[@]}" >/dev/null
fi
protoc --version >/dev/null
