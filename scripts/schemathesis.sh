#!/usr/bin/env bash
# Runs schemathesis (from PyPI, into the tools venv) against the OpenAPI
# document served by a real `taskmesh serve --with-worker` on free loopback
# ports over a temporary data directory, for every operation of the
# document, with every check schemathesis has (no 5xx; responses conform to
# the document; data the document allows is accepted and data it forbids is
# refused; ...); stops the server afterwards. scripts/schemathesis_hooks.py
# teaches it the contract's named formats.
#
# Usage: scripts/schemathesis.sh [TASKMESH_BINARY] [VENV]
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
bin="${1:-${CARGO_TARGET_DIR:-$HOME/.cache/taskmesh-target}/debug/taskmesh}"
venv="${2:-$HOME/.cache/taskmesh-py}"
version="4.32.5"
examples="${SCHEMATHESIS_MAX_EXAMPLES:-50}"

[ -x "$bin" ] || { echo "schemathesis: $bin is missing; run \`make build\` first" >&2; exit 1; }
if [ ! -x "$venv/bin/python" ]; then
  python3 -m venv "$venv"
fi
if [ "$("$venv/bin/python" -c 'import schemathesis; print(schemathesis.__version__)' 2>/dev/null)" != "$version" ]; then
  "$venv/bin/pip" install --quiet --disable-pip-version-check "schemathesis==$version"
fi

work="$(mktemp -d)"
server=""
cleanup() {
  if [ -n "$server" ]; then
    kill "$server" 2>/dev/null || true
    wait "$server" 2>/dev/null || true
  fi
  rm -rf "$work"
}
trap cleanup EXIT

free_port() { "$venv/bin/python" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1]); s.close()'; }
grpc_port="$(free_port)"
http_port="$(free_port)"
base="http://127.0.0.1:$http_port"

"$bin" serve --with-worker --data-dir "$work/data" \
  --grpc-addr "127.0.0.1:$grpc_port" --http-addr "127.0.0.1:$http_port" \
  >"$work/serve.log" 2>&1 &
server=$!

ready=""
for _ in $(seq 1 150); do
  if "$venv/bin/python" -c "import urllib.request,sys; sys.exit(0 if urllib.request.urlopen('$base/readyz', timeout=1).status == 200 else 1)" 2>/dev/null; then
    ready=1
    break
  fi
  kill -0 "$server" 2>/dev/null || break
  sleep 0.2
done
if [ -z "$ready" ]; then
  echo "schemathesis: the server did not become ready; its log:" >&2
  cat "$work/serve.log" >&2
  exit 1
fi

# Every check schemathesis has, on every operation.
config="$work/schemathesis.toml"
cat >"$config" <<'TOML'
[checks]
enabled = true

# Retrying a task is refused by the task's state, not the request's shape:
# a SUCCEEDED task answers FAILED_PRECONDITION (400, code 9). A well-formed
# request may meet one (the stateful phase retries tasks the server's own
# worker has run), so 400 is an expected answer to valid data here only.
[[operations]]
include-path = "/api/tasks/{task_id}/retry"
[operations.checks.positive_data_acceptance]
expected-statuses = ["2XX", "400", "401", "403", "404", "409", "429"]

# A workflow's steps must name each other: dependencies among the steps, no
# cycle, at most the server's step limit (1,000 by default, the contract's
# ceiling 10,000). JSON Schema cannot say that one field's values are
# another's names, so a schema-valid body may be refused with 400.
#
# And a body past the server's size limit (4 MiB: say 10,001 steps with
# long dependency lists, which the coverage phase sends to break maxItems)
# is refused before it is read, with 413.
#
# A schedule's template may be such a workflow (Schedule.workflow), so the
# same holds for creating, replacing and previewing a schedule.
[[operations]]
include-path = "/api/workflows"
include-method = "POST"
[operations.checks.positive_data_acceptance]
expected-statuses = ["2XX", "400", "401", "403", "404", "409", "429"]
[operations.checks.negative_data_rejection]
expected-statuses = ["400", "401", "403", "404", "405", "406", "409", "413", "415", "422", "428", "429", "5XX"]

[[operations]]
include-path = "/api/schedules"
include-method = "POST"
[operations.checks.positive_data_acceptance]
expected-statuses = ["2XX", "400", "401", "403", "404", "409", "429"]
[operations.checks.negative_data_rejection]
expected-statuses = ["400", "401", "403", "404", "405", "406", "409", "413", "415", "422", "428", "429", "5XX"]

[[operations]]
include-path = "/api/schedules:preview"
include-method = "POST"
[operations.checks.positive_data_acceptance]
expected-statuses = ["2XX", "400", "401", "403", "404", "409", "429"]
[operations.checks.negative_data_rejection]
expected-statuses = ["400", "401", "403", "404", "405", "406", "409", "413", "415", "422", "428", "429", "5XX"]

[[operations]]
include-path = "/api/schedules/{schedule_id}"
include-method = "PUT"
[operations.checks.positive_data_acceptance]
expected-statuses = ["2XX", "400", "401", "403", "404", "409", "429"]
[operations.checks.negative_data_rejection]
expected-statuses = ["400", "401", "403", "404", "405", "406", "409", "413", "415", "422", "428", "429", "5XX"]
TOML

status=0
# Run from the temporary directory: schemathesis keeps its example database
# and crash cache in the working directory.
cd "$work"
SCHEMATHESIS_HOOKS=schemathesis_hooks PYTHONPATH="$root/scripts${PYTHONPATH:+:$PYTHONPATH}" \
  "$venv/bin/schemathesis" --config-file "$config" run "$base/openapi.json" \
  --max-examples "$examples" \
  --request-timeout 10 \
  --seed "${SCHEMATHESIS_SEED:-42}" \
  --no-color \
  --report junit --report-junit-path "$work/junit.xml" \
  "${@:3}" | tee "$work/out.txt" || status=$?

cases="$(grep -A1 '^Test cases:' "$work/out.txt" | tail -n1 | sed 's/^ *//' || true)"
echo "schemathesis: test cases: ${cases:-no count found}; exit status $status"
if [ "$status" -ne 0 ]; then
  echo "schemathesis: server log tail:" >&2
  tail -n 40 "$work/serve.log" >&2
fi
exit "$status"
