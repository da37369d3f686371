#!/usr/bin/env bash
# Runs schemathesis (from PyPI, into the tools venv) against the OpenAPI
# document served by a real `taskmesh serve --with-worker` on free loopback
# ports over a temporary data directory, for every operation of the
# document; stops the server afterwards. Checks: no 5xx, and every response
# conforms to the document (status code, content type, headers, schema).
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

# RPCs this server does not implement yet answer UNIMPLEMENTED, which the
# issue's mapping makes a 500. While (and only while) a probe shows that,
# their operations are exempt from the no-5xx check alone; every conformance
# check still applies to them. The exemption lifts itself once they work.
config="$work/schemathesis.toml"
cat >"$config" <<'TOML'
# No 5xx, and every response conforms to the document.
[checks]
enabled = false
not_a_server_error.enabled = true
status_code_conformance.enabled = true
content_type_conformance.enabled = true
response_headers_conformance.enabled = true
response_schema_conformance.enabled = true

TOML
for probe in schedules breakers; do
  code="$("$venv/bin/python" - "$base/api/$probe" <<'PY'
import json, sys, urllib.error, urllib.request
try:
    urllib.request.urlopen(sys.argv[1], timeout=5)
    print(0)
except urllib.error.HTTPError as e:
    body = e.read()
    try:
        print(json.loads(body).get("code", -1))
    except ValueError:
        print(f"probe: HTTP {e.code} with a body that is not JSON: {body[:200]!r}", file=sys.stderr)
        print(-1)
PY
)"
  if [ "$code" = "12" ]; then
    echo "schemathesis: /api/$probe answers UNIMPLEMENTED: its operations are exempt from not_a_server_error"
    printf '[[operations]]\ninclude-path-regex = "^/api/%s"\nchecks.not_a_server_error.enabled = false\n\n' "$probe" >>"$config"
  fi
done

status=0
# Run from the temporary directory: schemathesis keeps its example database
# and crash cache in the working directory.
cd "$work"
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
