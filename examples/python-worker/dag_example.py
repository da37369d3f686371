#!/usr/bin/env python3
"""A workflow from Python over REST: a diamond a -> (b, c) -> d of `py.sum`
steps (see tmworker/handlers.py), each adding its payload's n to its
parents' outputs, which its handler receives by step name. Submits it,
follows it until it ends, and checks every step's output:

    a = 1, b = 10 + a = 11, c = 100 + a = 101, d = 1000 + b + c = 1112

    .venv/bin/python dag_example.py --base https://127.0.0.1:8080 [--ids-file F]

TASKMESH_TOKEN is sent as the bearer token when set; TASKMESH_TLS_CA is the
CA bundle for https. Prints the steps, appends their task ids to --ids-file,
and exits non-zero unless the workflow SUCCEEDED with those outputs.
"""

import argparse
import base64
import json
import os
import ssl
import sys
import time
import urllib.request

STEPS = [("a", [], 1), ("b", ["a"], 10), ("c", ["a"], 100), ("d", ["b", "c"], 1000)]
WANT = {"a": 1, "b": 11, "c": 101, "d": 1112}


def call(base: str, method: str, path: str, body=None) -> dict:
    headers = {"content-type": "application/json"}
    token = os.environ.get("TASKMESH_TOKEN")
    if token:
        headers["authorization"] = f"Bearer {token}"
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(base + path, data=data, method=method, headers=headers)
    ca = os.environ.get("TASKMESH_TLS_CA")
    context = ssl.create_default_context(cafile=ca) if base.startswith("https") else None
    with urllib.request.urlopen(req, timeout=10, context=context) as resp:
        return json.load(resp)


def step(name: str, deps, n: int) -> dict:
    payload = base64.b64encode(json.dumps({"n": n}).encode()).decode()
    return {"name": name, "dependsOn": deps,
            "template": {"handler": "py.sum",
                         "payload": {"data": payload, "contentType": "application/json"}}}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--base", required=True, help="the REST base URL")
    p.add_argument("--ids-file", help="append the steps' task ids here")
    p.add_argument("--timeout", type=float, default=60, help="seconds to wait for the end")
    args = p.parse_args()

    answer = call(args.base, "POST", "/api/workflows",
                  {"steps": [step(*s) for s in STEPS]})
    wf_id = answer["workflowId"]
    deadline = time.monotonic() + args.timeout
    while True:
        wf = call(args.base, "GET", f"/api/workflows/{wf_id}")["workflow"]
        if wf["state"] != "WORKFLOW_STATE_RUNNING":
            break
        if time.monotonic() >= deadline:
            print(f"workflow {wf_id} still running after {args.timeout:.0f} s")
            return 1
        time.sleep(0.1)  # polling interval of a condition with a deadline
    got = {}
    for s in wf["steps"]:
        data = base64.b64decode(s.get("output", {}).get("data", ""))
        got[s["name"]] = json.loads(data or b"{}").get("n")
        print(f'{s["name"]}: {s["state"]} n={got[s["name"]]}')
    if args.ids_file:
        with open(args.ids_file, "a") as f:
            f.writelines(s["taskId"] + "\n" for s in wf["steps"])
    ok = wf["state"] == "WORKFLOW_STATE_SUCCEEDED" and got == WANT
    print(f"workflow {wf_id} {wf['state']}; outputs {'as expected' if ok else f'{got}, want {WANT}'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
