#!/usr/bin/env python3
"""Child tasks from a Python handler: submits a `py.fanout` task (see
tmworker/handlers.py) over REST, whose handler spawns N `py.echo` children
under its own task with `task.spawn(...)`; waits for the parent, then
lists its children by parent (`GET /api/tasks?parentTaskId=...`) until
every one SUCCEEDED with its payload echoed back.

    .venv/bin/python children_example.py --base https://127.0.0.1:8080 [--n 5] [--ids-file F]

TASKMESH_TOKEN is sent as the bearer token when set; TASKMESH_TLS_CA is the
CA bundle for https. Appends the parent's and the children's task ids to
--ids-file, and exits non-zero unless all of them SUCCEEDED.
"""

import argparse
import base64
import json
import sys
import time

from dag_example import call


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--base", required=True, help="the REST base URL")
    p.add_argument("--n", type=int, default=5, help="children to spawn")
    p.add_argument("--ids-file", help="append the tasks' ids here")
    p.add_argument("--timeout", type=float, default=60, help="seconds to wait for the end")
    args = p.parse_args()

    payload = base64.b64encode(json.dumps({"n": args.n}).encode()).decode()
    parent = call(args.base, "POST", "/api/tasks",
                  {"handler": "py.fanout",
                   "payload": {"data": payload, "contentType": "application/json"}})["taskId"]
    deadline = time.monotonic() + args.timeout
    while True:
        task = call(args.base, "GET", f"/api/tasks/{parent}")["task"]
        children = call(args.base, "GET",
                        f"/api/tasks?parentTaskId={parent}&pageSize=1000&view=TASK_VIEW_FULL")
        children = children.get("tasks", [])
        done = [c for c in children if c["state"] == "TASK_STATE_SUCCEEDED"]
        if task["state"] == "TASK_STATE_SUCCEEDED" and len(done) == args.n:
            break
        if task["state"] in ("TASK_STATE_FAILED", "TASK_STATE_CANCELLED", "TASK_STATE_TIMED_OUT"):
            print(f"parent {parent} ended {task['state']}: {task.get('errorMessage', '')}")
            return 1
        if time.monotonic() >= deadline:
            print(f"parent {task['state']}, {len(done)} of {args.n} children SUCCEEDED "
                  f"after {args.timeout:.0f} s")
            return 1
        time.sleep(0.1)  # polling interval of a condition with a deadline
    spawned = json.loads(base64.b64decode(task["output"]["data"]))["children"]
    listed = sorted(c["taskId"] for c in children)
    problems = []
    if sorted(spawned) != listed:
        problems.append(f"spawned {sorted(spawned)} but listed {listed}")
    for c in children:
        echoed = json.loads(base64.b64decode(c["output"]["data"]))
        if c["parentTaskId"] != parent or "i" not in echoed:
            problems.append(f"child {c['taskId']}: parent {c['parentTaskId']}, output {echoed}")
    if args.ids_file:
        with open(args.ids_file, "a") as f:
            f.writelines(i + "\n" for i in [parent] + listed)
    print(f"parent {parent} SUCCEEDED with {len(children)} children listed by parent; "
          + ("; ".join(problems) if problems else "each echoed its payload"))
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
