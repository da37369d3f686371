#!/usr/bin/env bash
# Generates Python stubs from proto/ with grpcio-tools (from PyPI) into a
# temporary directory and imports them: proof that the contract compiles for
# another language. Nothing generated is checked in.
set -euo pipefail
venv="${1:-$HOME/.cache/taskmesh-py}"
root="$(cd "$(dirname "$0")/.." && pwd)"

if [ ! -x "$venv/bin/python" ]; then
  python3 -m venv "$venv"
fi
if ! "$venv/bin/python" -c 'import grpc_tools' 2>/dev/null; then
  "$venv/bin/pip" install --quiet --disable-pip-version-check grpcio-tools
fi

out="$(mktemp -d)"
trap 'rm -rf "$out"' EXIT
"$venv/bin/python" -m grpc_tools.protoc -I "$root/proto" \
  --python_out="$out" --grpc_python_out="$out" \
  "$root"/proto/taskmesh/v1/*.proto "$root"/proto/google/api/*.proto "$root"/proto/buf/validate/*.proto "$root"/proto/taskmesh/options/v1/*.proto
(cd "$out" && "$venv/bin/python" - <<'PY'
from taskmesh.v1 import task_api_pb2_grpc, dispatcher_pb2_grpc, worker_pb2_grpc, task_pb2
names = [s.full_name for m in (task_api_pb2_grpc, dispatcher_pb2_grpc, worker_pb2_grpc)
         for s in m.__dict__.get("DESCRIPTOR", None).services_by_name.values()] if False else []
from taskmesh.v1 import task_api_pb2, dispatcher_pb2, worker_pb2
services = sorted(s for f in (task_api_pb2, dispatcher_pb2, worker_pb2) for s in f.DESCRIPTOR.services_by_name)
assert services == ["Dispatcher", "TaskApi", "Worker"], services
t = task_pb2.Task(task_id="x", state=task_pb2.TASK_STATE_READY)
assert task_pb2.Task.FromString(t.SerializeToString()).state == task_pb2.TASK_STATE_READY
print("python stubs: generated and imported; services", ", ".join(services))
PY
)
