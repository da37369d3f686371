#!/usr/bin/env bash
# End-to-end proof that the contract works from other languages: a real
# `taskmesh serve` (free loopback ports, a temporary data dir), the Python
# worker from examples/python-worker, the Node client from
# examples/node-client. Run scripts/examples-setup.sh first (`make polyglot`
# does both).
#
# Checks, in order: health and reflection from Python; tokens; the table of
# requests in examples/contract/cases.json gets the same verdict from the
# server, Python's and Node's local validation; the worker registers;
# 100 tasks submitted by Node all SUCCEEDED (watched, then read back with
# GetTask, outputs equal to payloads); a failing handler ends FAILED; a
# diamond workflow submitted over REST by dag_example.py whose Python steps
# add up their parents' outputs; a Python handler (py.fanout) spawning 5
# children with its worker token, listed by parent (children_example.py); a
# sharding broadcast whose one shard the Python worker runs, seeing its
# index (py.shard); a Python handler's log lines are followed live and read back (`taskmesh
# logs`), in both modes; tasks
# running at SIGTERM are finished by the drain; the worker exits 0; its own
# count agrees with the Node client's task ids exactly. Then the same in push
# mode: the worker serves the Worker service, registers its address, runs 100
# tasks pushed by Worker.Execute, deregisters on SIGTERM and exits 0.
# The server runs with --auth over TLS (a CA and a server certificate made
# here with openssl): the worker presents a worker token and the client a
# submitter token, both made with `taskmesh token create` from the bootstrap
# token; a call without a token is refused; every client (Python, Node, the
# taskmesh CLI) trusts the CA through $TASKMESH_TLS_CA.
#
# Every wait has a deadline; every process started here is stopped on exit,
# failure or interrupt (trap); the last line is "N passed, M failed".
set -uo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
bin="${TASKMESH_BIN:-${CARGO_TARGET_DIR:-$HOME/.cache/taskmesh-target}/debug/taskmesh}"
py="$root/examples/python-worker/.venv/bin/python"
worker_dir="$root/examples/python-worker"
client="$root/examples/node-client/client.js"
for need in "$bin" "$py" "$root/examples/node-client/node_modules"; do
  if [ ! -e "$need" ]; then
    echo "polyglot: $need is missing; run \`make polyglot\` (it builds and sets up first)" >&2
    exit 1
  fi
done

tmp="$(mktemp -d)"
server_pid=""
worker_pid=""
receiver_pid=""
passed=0
failed=0

stop_process() { # pid name: SIGTERM, up to 10 s, then SIGKILL
  local pid="$1" name="$2"
  [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null || return 0
  kill -TERM "$pid" 2>/dev/null
  if ! wait_until 10 process_gone "$pid"; then
    echo "polyglot: $name ($pid) ignored SIGTERM for 10 s; killing it" >&2
    kill -KILL "$pid" 2>/dev/null
  fi
  wait "$pid" 2>/dev/null
}

cleanup() {
  local code=$?
  stop_process "$worker_pid" "python worker"
  stop_process "$receiver_pid" "callback receiver"
  stop_process "$server_pid" "taskmesh serve"
  if [ "$failed" -gt 0 ] || [ "$code" -ne 0 ]; then
    for log in serve.log worker.log push-worker.log receiver.log; do
      [ -s "$tmp/$log" ] && { echo "--- last lines of $log"; tail -n 40 "$tmp/$log"; }
    done
  fi
  rm -rf "$tmp"
}
trap cleanup EXIT
trap 'echo "polyglot: interrupted" >&2; exit 130' INT TERM

# wait_until SECONDS COMMAND...: runs COMMAND until it succeeds or the
# deadline passes. The pause between tries is a polling interval, not a
# synchronisation sleep.
wait_until() {
  local deadline=$((SECONDS + $1))
  shift
  until "$@"; do
    [ "$SECONDS" -ge "$deadline" ] && return 1
    sleep 0.1
  done
}
process_gone() { ! kill -0 "$1" 2>/dev/null; }

check() { # name command...: one counted check
  local name="$1"
  shift
  if "$@"; then
    echo "PASS $name"
    passed=$((passed + 1))
  else
    echo "FAIL $name"
    failed=$((failed + 1))
  fi
}

free_port() {
  "$py" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}
grpc_port="$(free_port)"
http_port="$(free_port)"
server="127.0.0.1:$grpc_port"
# Node names the server by host name: TLS forbids an IP address as the
# server name (RFC 6066), and the certificate holds both.
node_server="localhost:$grpc_port"
# A CA and a certificate for 127.0.0.1 (and localhost), valid one day.
make_certs() {
  local d="$tmp/pki"
  mkdir -p "$d" &&
    openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 1 \
      -subj "/CN=taskmesh polyglot CA" -keyout "$d/ca.key" -out "$d/ca.crt" \
      -addext "basicConstraints=critical,CA:TRUE" \
      -addext "keyUsage=critical,keyCertSign,cRLSign" 2>/dev/null &&
    openssl req -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes \
      -subj "/CN=localhost" -keyout "$d/server.key" -out "$d/server.csr" 2>/dev/null &&
    printf 'subjectAltName=DNS:localhost,IP:127.0.0.1\nextendedKeyUsage=serverAuth\n' >"$d/ext" &&
    openssl x509 -req -in "$d/server.csr" -CA "$d/ca.crt" -CAkey "$d/ca.key" \
      -CAcreateserial -days 1 -extfile "$d/ext" -out "$d/server.crt" 2>/dev/null
}
if ! make_certs; then
  echo "polyglot: cannot make the test certificates with openssl" >&2
  exit 1
fi
export TASKMESH_TLS_CA="$tmp/pki/ca.crt"

# Tokens travel in the environment only (never a flag `ps` would show).
bootstrap="$(od -An -N32 -tx1 /dev/urandom | tr -d ' \n')"
# Callback keys, as during a rotation: the server signs with an old plain
# key and a new Standard Webhooks one; the receiver knows only the new one.
callback_key="whsec_$(head -c 24 /dev/urandom | base64)"
client_token=""
worker_token=""
node_client() { TASKMESH_TOKEN="$client_token" node "$client" "$1" --server "$node_server" "${@:2}"; }
# Always started with &: exec makes $! the python process itself.
py_worker() { TASKMESH_TOKEN="$worker_token" exec "$py" "$worker_dir/worker.py" "$@"; }
tm() { TASKMESH_TOKEN="$client_token" "$bin" "$@" --server "https://$server"; }
make_token() { # role: prints a new token of namespace default
  TASKMESH_TOKEN="$bootstrap" "$bin" token create --server "https://$server" --role "$1" \
    --name "polyglot-$1"
}

echo "polyglot: taskmesh serve --auth over TLS on $server (data in $tmp/data)"
TASKMESH_CALLBACK_SECRET="old-plain-key $callback_key" \
  TASKMESH_BOOTSTRAP_TOKEN="$bootstrap" NO_COLOR=1 "$bin" serve --auth --data-dir "$tmp/data" \
  --grpc-addr "$server" --http-addr "127.0.0.1:$http_port" \
  --tls-cert "$tmp/pki/server.crt" --tls-key "$tmp/pki/server.key" \
  --egress-allow 127.0.0.1 >"$tmp/serve.log" 2>&1 &
server_pid=$!

# Health doubles as the readiness wait: check_server.py polls it until
# SERVING, for at most 60 s.
check "python: health answers SERVING for the server, TaskApi and Dispatcher" \
  "$py" "$worker_dir/check_server.py" --server "$server" --only health --wait 60
check "python: reflection lists TaskApi, Dispatcher and Worker and resolves them" \
  "$py" "$worker_dir/check_server.py" --server "$server" --only reflection

tokens() {
  client_token="$(make_token submitter)" && worker_token="$(make_token worker)" &&
    [ -n "$client_token" ] && [ -n "$worker_token" ]
}
check "taskmesh token create: a submitter token for node and a worker token for python" tokens

# The contract's rules (buf.validate in proto/): every request of
# examples/contract/cases.json gets the table's verdict from the server, from
# Python's local validation (protovalidate) and from Node's
# (@bufbuild/protovalidate). Admin token: the table includes Admin calls.
cases="$root/examples/contract/cases.json"
contract_python() {
  local out
  out="$(TASKMESH_TOKEN="$bootstrap" "$py" "$worker_dir/contract_cases.py" --cases "$cases" --server "$server")"
  local code=$?
  grep -v '^ok: ' <<<"$out"
  return "$code"
}
check "python: the contract's rules, locally and on the server, give the table's verdicts" contract_python
contract_node() {
  local buf out code
  buf="$(bash "$root/scripts/install-buf.sh")" && "$buf" build "$root/proto" -o "$tmp/contract.binpb" || return 1
  out="$(node "$root/examples/node-client/contract-cases.js" --cases "$cases" --descriptors "$tmp/contract.binpb")"
  code=$?
  grep -v '^ok: ' <<<"$out"
  return "$code"
}
check "node: the contract's rules, locally, give the table's verdicts" contract_node
refused_without_token() {
  local out
  out="$(TASKMESH_TOKEN="" node "$client" workers --server "$node_server" --handler py.echo --wait 1 2>&1)"
  [ $? -ne 0 ] && grep -q "UNAUTHENTICATED\|missing or invalid token" <<<"$out"
}
check "node: a call without a token is refused UNAUTHENTICATED" refused_without_token

py_worker --server "$server" --worker-id py-e2e --concurrency 8 \
  --stats-file "$tmp/worker-stats.json" >"$tmp/worker.log" 2>&1 &
worker_pid=$!
check "node: the python worker is registered (ListWorkers)" \
  node_client workers --handler py.echo --worker-id py-e2e --wait 30
# The same call that just worked, in plaintext to the TLS port: refused.
plaintext_refused() {
  ! TASKMESH_TLS_CA="" TASKMESH_TOKEN="$client_token" node "$client" workers --server "$node_server" \
    --handler py.echo --worker-id py-e2e --wait 2 >/dev/null 2>&1
}
check "node: the same call in plaintext to the TLS port fails" plaintext_refused

check "node: 100 py.echo tasks SUCCEEDED, outputs equal payloads" \
  node_client run --handler py.echo --count 100 --check-echo --timeout 120 \
  --ids-file "$tmp/echo-ids"
check "node: a py.fail task ends FAILED with the handler's message" \
  node_client run --handler py.fail --payload '{"message":"boom","retryable":false}' \
  --expect FAILED --timeout 60
check "python: a workflow's steps get their parents' outputs (dag_example.py over REST)" \
  env TASKMESH_TOKEN="$client_token" "$py" "$worker_dir/dag_example.py" \
  --base "https://127.0.0.1:$http_port" --ids-file "$tmp/dag-ids"
check "python: a handler spawns 5 children with its worker token, listed by parent (children_example.py)" \
  env TASKMESH_TOKEN="$client_token" "$py" "$worker_dir/children_example.py" \
  --base "https://127.0.0.1:$http_port" --n 5 --ids-file "$tmp/children-ids"
# A sharding broadcast over the one python worker serving py.shard: one
# shard, index 0 of 1, as the handler saw it; its id goes to broadcast-ids
# (the cross-checks count it; the broadcast itself runs nothing).
state_is() { [ "$(tm get "$1" | awk '/^state:/ {print $2}')" = "$2" ]; }
python_broadcast() {
  local id shard out
  id="$(tm submit py.shard --broadcast)" || return 1
  wait_until 60 state_is "$id" SUCCEEDED || { tm get "$id"; return 1; }
  shard="$(tm list --parent "$id" | awk 'NR == 2 {print $1}')"
  [ -n "$shard" ] || { echo "no shard listed under $id"; return 1; }
  echo "$shard" >>"$tmp/broadcast-ids"
  out="$(tm get "$shard" | awk '/^output:/ {print $2}')"
  echo "broadcast $id: shard $shard answered $out"
  [ "$out" = '{"shard":0,"of":1}' ]
}
check "python: a sharding broadcast runs one shard on the python worker, which sees its index" \
  python_broadcast

# python_logs IDS_FILE N LIVE: a py.log task of N lines 250 ms apart, its
# lines followed with `taskmesh logs --follow` (with LIVE=1 the first one
# must arrive before the task ended: DISPATCHING or RUNNING, since the node
# holds a stream worker's ACK up to --ack-hold before RUNNING is written),
# then read back: "py line i of N"
# in order. Its id goes to IDS_FILE (the cross-checks count it).
python_logs() {
  local ids="$1" n="$2" live="$3" id first_state="" followed=0 line want
  id="$(tm submit py.log --payload "{\"lines\": $n, \"every_ms\": 250}")" || return 1
  echo "$id" >>"$ids"
  while IFS= read -r line; do
    followed=$((followed + 1))
    [ -n "$first_state" ] || first_state="$(tm get "$id" | awk '/^state:/ {print $2}')"
  done < <(TASKMESH_TOKEN="$client_token" timeout 60 "$bin" logs "$id" --follow \
             --server "https://$server")
  want="$(for i in $(seq "$n"); do echo "py line $i of $n"; done)"
  echo "followed $followed lines; the task was ${first_state:-?} at the first"
  [ "$followed" -eq "$n" ] || return 1
  [ "$live" != 1 ] || [ "$first_state" = RUNNING ] || [ "$first_state" = DISPATCHING ] || return 1
  diff <(tm logs "$id" | sed 's/^[^]]*\] //') <(echo "$want")
}
check "taskmesh logs: a python handler's lines followed live, then read back" \
  python_logs "$tmp/log-ids" 8 1

drained() {
  node_client submit --handler py.sleep --payload '{"ms":1500}' --count 3 \
    --until RUNNING --timeout 60 --ids-file "$tmp/sleep-ids" || return 1
  kill -TERM "$worker_pid"
  node_client watch --ids-file "$tmp/sleep-ids" --expect SUCCEEDED --timeout 60
}
check "node: tasks running at SIGTERM are finished by the worker's drain" drained

worker_exit() { # [log]: waits for the worker to exit, shows its last line
  local log="${1:-worker.log}"
  wait_until 60 process_gone "$worker_pid" || { echo "worker still running after 60 s"; return 1; }
  wait "$worker_pid"
  local code=$?
  worker_pid=""
  echo "python worker exit code $code: $(tail -n 1 "$tmp/$log")"
  [ "$code" -eq 0 ]
}
check "python: the worker drained and exited 0" worker_exit

# compare_stats LABEL STATS_FILE IDS_FILE WANT_JSON: the worker's own counters
# (--stats-file) against what the Node client saw: the same task ids
# succeeded, and the counters in WANT_JSON exactly.
compare_stats() {
  [ -s "$2" ] || { echo "no $1 stats"; return 1; }
  "$py" - "$@" <<'PY'
import json, sys
label, stats_file, ids_file, want_json = sys.argv[1:5]
stats = json.load(open(stats_file))
node_ids = set(open(ids_file).read().split())
worker_ids = set(stats["succeeded_task_ids"])
problems = []
if worker_ids != node_ids:
    problems.append(f"{len(node_ids - worker_ids)} ids only in node, "
                    f"{len(worker_ids - node_ids)} only in the worker")
want = json.loads(want_json)
for key, value in want.items():
    if stats[key] != value:
        problems.append(f"{key}={stats[key]}, want {value}")
print(f"{label} counted " + " ".join(f"{k}={stats[k]}" for k in want) + "; "
      + ("; ".join(problems) if problems else f"{len(worker_ids)} task ids match node's"))
sys.exit(1 if problems else 0)
PY
}
cross_check() {
  cat "$tmp/echo-ids" "$tmp/sleep-ids" "$tmp/log-ids" "$tmp/dag-ids" "$tmp/children-ids" \
    "$tmp/broadcast-ids" >"$tmp/succeeded-ids"
  compare_stats worker "$tmp/worker-stats.json" "$tmp/succeeded-ids" \
    '{"succeeded": 115, "failed": 1, "results_accepted": 116, "results_refused": 0, "rejected": 0, "sessions": 1}'
}
check "python: the worker's own count matches the node client's tasks" cross_check

# Push mode: the same worker serving the Worker service; the server calls
# Worker.Execute on it instead of pushing on a stream.
push_port="$(free_port)"
py_worker --server "$server" --worker-id py-push --concurrency 8 \
  --push-listen "127.0.0.1:$push_port" --stats-file "$tmp/push-stats.json" \
  >"$tmp/push-worker.log" 2>&1 &
worker_pid=$!
check "node: the python push-mode worker is registered (ListWorkers)" \
  node_client workers --handler py.echo --worker-id py-push --wait 30
check "node: 100 py.echo tasks SUCCEEDED through Worker.Execute (push mode)" \
  node_client run --handler py.echo --count 100 --check-echo --timeout 120 \
  --ids-file "$tmp/push-ids"
check "taskmesh logs: a python push-mode handler's lines (ReportLogs) followed live, then read back" \
  python_logs "$tmp/push-ids" 8 1
push_exit() {
  kill -TERM "$worker_pid"
  worker_exit push-worker.log
}
check "python: the push-mode worker deregistered and exited 0" push_exit
push_cross_check() {
  compare_stats "push worker" "$tmp/push-stats.json" "$tmp/push-ids" \
    '{"succeeded": 101, "results_accepted": 101, "results_refused": 0, "sessions": 1}'
}
check "python: the push-mode worker's own count matches the node client's tasks" push_cross_check

# Callbacks to the Python receiver example (examples/python-worker/
# callback_receiver.py): a cancelled task's callback arrives signed and
# verifies; the same request replayed once its timestamp is older than the
# receiver's tolerance (3 s here) is refused, and so is a changed body.
receiver_port="$(free_port)"
TASKMESH_CALLBACK_SECRET="$callback_key" "$py" "$worker_dir/callback_receiver.py" \
  --port "$receiver_port" --tolerance 3 --log "$tmp/callbacks.jsonl" >"$tmp/receiver.log" 2>&1 &
receiver_pid=$!
rest() { # METHOD PATH [JSON]
  curl -sS --fail-with-body --cacert "$TASKMESH_TLS_CA" -X "$1" \
    -H "authorization: Bearer $client_token" -H 'content-type: application/json' \
    "https://127.0.0.1:$http_port$2" ${3:+-d "$3"}
}
callback_id=""
callback_verified() { grep -q "\"verified\": true.*$callback_id" "$tmp/callbacks.jsonl" 2>/dev/null; }
signed_callback() {
  wait_until 30 curl -s -o /dev/null "http://127.0.0.1:$receiver_port/" || { echo "the receiver did not start"; return 1; }
  local answer
  answer="$(rest POST /api/tasks "{\"handler\":\"py.echo\",\"delay\":\"3600s\",\"callbackUrl\":\"http://127.0.0.1:$receiver_port/hook\"}")" || return 1
  callback_id="$("$py" -c 'import json,sys; print(json.load(sys.stdin)["taskId"])' <<<"$answer")"
  rest POST "/api/tasks/$callback_id/cancel" '{}' >/dev/null || return 1
  wait_until 30 callback_verified || { echo "no verified callback for $callback_id"; return 1; }
  echo "callback of $callback_id verified by the python receiver (one of two signatures)"
}
check "python: the receiver example verifies a signed callback during a key rotation" signed_callback
replay_refused() {
  "$py" - "$tmp/callbacks.jsonl" "$receiver_port" "$callback_id" <<'PY'
import json, sys, time, urllib.request, urllib.error
log, port, task_id = sys.argv[1], int(sys.argv[2]), sys.argv[3]
first = next(json.loads(l) for l in open(log) if task_id in l and '"verified": true' in l)
def post(headers, body):
    req = urllib.request.Request(f"http://127.0.0.1:{port}/hook", data=body.encode(), method="POST")
    for k in ("webhook-id", "webhook-timestamp", "webhook-signature", "content-type"):
        req.add_header(k, headers[k])
    try:
        return urllib.request.urlopen(req, timeout=10).status
    except urllib.error.HTTPError as e:
        return e.code
tampered = post(first["headers"], first["body"].replace("TASK_STATE_CANCELLED", "TASK_STATE_SUCCEEDED"))
# The condition is the clock itself: wait until the timestamp is stale.
deadline = int(first["headers"]["webhook-timestamp"]) + 3
while time.time() <= deadline + 1:
    time.sleep(0.2)
replayed = post(first["headers"], first["body"])
print(f"changed body answered {tampered}, replay after the tolerance answered {replayed}")
sys.exit(0 if (tampered, replayed) == (401, 401) else 1)
PY
}
check "python: the receiver refuses a changed body and a replay with an old timestamp" replay_refused

echo "polyglot: $passed passed, $failed failed"
[ "$failed" -eq 0 ]
