#!/usr/bin/env bash
# Sets up the Python worker: a virtual environment with the pinned packages
# from PyPI, and stubs generated from proto/ by grpcio-tools into gen/.
# Nothing generated is checked in; running this again is cheap (pip skips
# what is installed, the stubs are regenerated so they follow proto/).
#
#   examples/python-worker/setup.sh            # venv in examples/python-worker/.venv
#   VENV=/some/dir examples/python-worker/setup.sh
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../.." && pwd)"
venv="${VENV:-$here/.venv}"
gen="$here/gen"

if [ ! -x "$venv/bin/python" ]; then
  python3 -m venv "$venv"
fi
"$venv/bin/pip" install --quiet --disable-pip-version-check -r "$here/requirements.txt"

# Generate into a fresh directory and swap it in, so a failed run never
# leaves half a set of stubs behind.
tmp="$(mktemp -d "$here/.gen.XXXXXX")"
trap 'rm -rf "$tmp"' EXIT
"$venv/bin/python" -m grpc_tools.protoc -I "$root/proto" \
  --python_out="$tmp" --grpc_python_out="$tmp" \
  "$root"/proto/taskmesh/v1/*.proto "$root"/proto/google/api/*.proto "$root"/proto/buf/validate/*.proto "$root"/proto/taskmesh/options/v1/*.proto
rm -rf "$gen"
mv "$tmp" "$gen"
trap - EXIT
echo "python worker: packages installed in $venv, stubs generated in $gen"
