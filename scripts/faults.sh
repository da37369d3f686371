#!/usr/bin/env bash
# `make faults`: every fault scenario (crates/cli/tests/faults_*.rs), one at a
# time, then one summary line per scenario. Needs root (network namespaces,
# mounts, a blkio cgroup). Takes about 5 minutes here.
set -euo pipefail

if [ "$(id -u)" -ne 0 ]; then
  echo "make faults needs root: it makes network namespaces, mounts a tmpfs and a loop disk, and throttles a cgroup" >&2
  exit 1
fi
log="$(mktemp -t taskmesh-faults.XXXXXX)"
start=$(date +%s)
status=0
cargo test --no-fail-fast -p taskmesh-cli --test faults_net --test faults_disk --test faults_clock -- \
  --include-ignored --nocapture --test-threads 1 2>&1 | tee "$log" || status=$?
echo
echo "== fault scenarios ($(( $(date +%s) - start )) s; full output in $log) =="
grep -oE '\bfault [a-z-]+[^:]*: accepted.*' "$log" || true
exit "$status"
