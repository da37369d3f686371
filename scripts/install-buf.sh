#!/usr/bin/env bash
# Installs buf (npm package @bufbuild/buf, pinned; its binary ships inside the
# package) into $HOME/.cache/taskmesh-node and prints the binary's path.
# Idempotent: when the pinned version is already there it does nothing.
set -euo pipefail
version="1.75.0"
prefix="${TASKMESH_NODE_PREFIX:-$HOME/.cache/taskmesh-node}"
buf="$prefix/node_modules/.bin/buf"

if [ "$("$buf" --version 2>/dev/null || true)" != "$version" ]; then
  mkdir -p "$prefix"
  npm install --prefix "$prefix" --no-audit --no-fund --save-exact \
    "@bufbuild/buf@$version" >&2
  found="$("$buf" --version)"
  [ "$found" = "$version" ] || { echo "install-buf: got buf $found, want $version" >&2; exit 1; }
fi
echo "$buf"
