#!/usr/bin/env bash
# The web console's browser tests (tests/console): a real `taskmesh serve`
# and `taskmesh worker` on free loopback ports, driven through the console
# at /ui/ by Debian's Chromium (headless) with playwright-core, checked with
# axe-core. Installs what is missing first: Chromium from Debian's packages
# (through scripts/ensure-tools.sh; never `npx playwright install`, which
# downloads a browser build of its own) and the npm packages pinned by
# tests/console/package-lock.json (`npm ci`). Writes the screenshots in
# docs/console/.
#
#   scripts/console-tests.sh [BINARY]     (default $TASKMESH_BIN, else $CARGO_TARGET_DIR/debug/taskmesh)
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
bin="${1:-${TASKMESH_BIN:-${CARGO_TARGET_DIR:-$HOME/.cache/taskmesh-target}/debug/taskmesh}}"
if [ ! -x "$bin" ]; then
  echo "console: no taskmesh binary at $bin; build it first (make build)" >&2
  exit 1
fi
[ -x "${CHROMIUM:-/usr/bin/chromium}" ] || bash "$root/scripts/ensure-tools.sh" console
command -v node >/dev/null 2>&1 || { echo "console: node is missing" >&2; exit 1; }
npm ci --prefix "$root/tests/console" --no-audit --no-fund --loglevel=error
cd "$root/tests/console"
TASKMESH_BIN="$bin" node --test --test-concurrency=1 --test-reporter=spec ./*.test.mjs
