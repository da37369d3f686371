#!/usr/bin/env bash
# Installs what the examples need from their registries and generates the
# Python stubs from proto/: the Python worker's venv (PyPI, pinned in
# requirements.txt) and the Node client's node_modules (npm, pinned by
# package-lock.json via `npm ci`). Both live inside the example directories
# and are git-ignored.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
bash "$root/examples/python-worker/setup.sh"
npm ci --prefix "$root/examples/node-client" --no-audit --no-fund --loglevel=error
echo "node client: dependencies installed in examples/node-client/node_modules"
