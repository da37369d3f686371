#!/usr/bin/env bash
# Runs every coverage-guided fuzz target in fuzz/ (cargo-fuzz, libFuzzer)
# for SECONDS each (default 60): `make fuzz`; `make test` runs it with 10.
# cargo-fuzz is installed from crates.io when missing; the targets build
# with the nightly toolchain (rustup's), without a sanitizer: the code is
# safe Rust, so what we hunt are panics, overflows and hangs, which
# libFuzzer sees without one, and the build is twice as fast.
# New inputs go to fuzz/corpus/TARGET (git-ignored), the committed seeds
# are fuzz/seeds/TARGET. A crash leaves its input in fuzz/artifacts/TARGET
# and fails the run: turn it into a regression test, then fix it.
set -euo pipefail
seconds="${1:-60}"
cd "$(dirname "$0")/.."

if ! rustup run nightly rustc --version >/dev/null 2>&1; then
  echo "fuzz: the nightly toolchain is missing; rustup toolchain install nightly" >&2
  exit 1
fi
if ! command -v cargo-fuzz >/dev/null 2>&1; then
  echo "fuzz: installing cargo-fuzz from crates.io"
  cargo install cargo-fuzz --locked --version 0.13.2
fi

# The fuzz crate has a target directory of its own (another toolchain).
export CARGO_TARGET_DIR="${FUZZ_TARGET_DIR:-$HOME/.cache/taskmesh-fuzz-target}"
status=0
for target in rest_transcode cron_timezone validators; do
  mkdir -p "fuzz/corpus/$target"
  echo "fuzz: $target for ${seconds}s"
  if ! cargo +nightly fuzz run --sanitizer none "$target" "fuzz/corpus/$target" "fuzz/seeds/$target" -- \
    -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 2>"fuzz/$target.log"; then
    echo "fuzz: $target FAILED; the last lines of its log:" >&2
    tail -n 40 "fuzz/$target.log" >&2
    status=1
  else
    grep -E "^stat::number_of_executed_units|^#[0-9]+.*DONE" "fuzz/$target.log" | tail -n 2 | sed "s/^/fuzz: $target: /"
  fi
done
exit "$status"
