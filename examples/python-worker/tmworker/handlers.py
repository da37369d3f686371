"""What a handler is, and the handlers this example serves.

A handler is a plain function `Task -> Output` run on a pool thread. It
raises `HandlerError` to fail (retryable or not); any other exception is
reported as a retryable failure. It should watch `task.cancelled`: the
server cancels attempts it took back or that timed out. It may log with
`task.log(message, level)`: the worker sends the lines to the server
(while the task runs and before its result), where they are stored with
the task's attempt (`GetTaskLogs`, `taskmesh logs ID`).
"""

import json
import threading
import time
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Optional, Tuple

# Lines a task keeps while they wait to be sent; past it the oldest go and
# are counted as dropped (the server shows the count).
MAX_BUFFERED_LINES = 10_000
# The contract's limit on one line, in bytes.
MAX_LINE_BYTES = 16 * 1024
LEVELS = ("TRACE", "DEBUG", "INFO", "WARN", "ERROR")


class HandlerError(Exception):
    """A handler's failure; `retryable=False` ends the task FAILED at once."""

    def __init__(self, message: str, retryable: bool = True):
        super().__init__(message)
        self.message = message
        self.retryable = retryable


@dataclass
class Task:
    """What a handler gets: the assignment plus a cancellation flag."""

    task_id: str
    attempt: int
    execution_id: str
    handler: str
    payload: bytes
    content_type: str
    labels: Dict[str, str]
    # A workflow step's name, and its parents' outputs by step name.
    workflow_step: str = ""
    parent_outputs: Dict[str, "Output"] = field(default_factory=dict)
    # For a step run after its parents end (afterParentsEnd): each parent
    # that did not succeed, by step name, as "STATE: message".
    parent_errors: Dict[str, str] = field(default_factory=dict)
    # A shard of a sharding broadcast: its index (from 0) and how many
    # shards there are; shard_total is 0 for any other task.
    shard_index: int = 0
    shard_total: int = 0
    cancelled: threading.Event = field(default_factory=threading.Event)
    # Submits child tasks for `spawn` (set by the worker that runs the task).
    _submit: Optional[Callable[[List[dict]], List[str]]] = None
    _lines: List[Tuple[float, str, str]] = field(default_factory=list)
    _dropped: int = 0
    _lines_lock: threading.Lock = field(default_factory=threading.Lock)

    def log(self, message: str, level: str = "INFO") -> None:
        """Adds a line to this attempt's log; never blocks on the network."""
        if level not in LEVELS:
            level = "INFO"
        data = message.encode()
        if len(data) > MAX_LINE_BYTES:
            message = data[:MAX_LINE_BYTES - 10].decode(errors="ignore") + " …[cut]"
        with self._lines_lock:
            if len(self._lines) >= MAX_BUFFERED_LINES:
                self._lines.pop(0)
                self._dropped += 1
            self._lines.append((time.time(), level, message))

    def spawn(self, children: List[dict]) -> List[str]:
        """Submits child tasks of this task in one call and returns their ids.
        Each child is a dict of SubmitTaskRequest fields (`handler`, and
        `payload` bytes, `content_type`, `client_request_id`, ...); its
        `parent_task_id` is this task, so cancelling this task cancels it
        and `ListTasks(parent_task_id=...)` lists it. Give each child a
        `client_request_id` built from this task's id, so a handler run
        again after a lost attempt adds no second set."""
        if self._submit is None:
            raise HandlerError("this task cannot submit children (no server)", retryable=False)
        return self._submit([dict(c, parent_task_id=self.task_id) for c in children])

    def take_lines(self) -> Tuple[List[Tuple[float, str, str]], int]:
        """The lines logged since the last call, and how many were dropped."""
        with self._lines_lock:
            lines, dropped = self._lines, self._dropped
            self._lines, self._dropped = [], 0
        return lines, dropped


@dataclass
class Output:
    """What a successful handler returns."""

    data: bytes
    content_type: str = ""


Handler = Callable[[Task], Output]


def echo(task: Task) -> Output:
    """Returns the payload unchanged."""
    return Output(task.payload, task.content_type)


def sleep(task: Task) -> Output:
    """Sleeps `{"ms": N}` milliseconds, stopping early when cancelled."""
    ms = int(json.loads(task.payload or b"{}").get("ms", 0))
    task.log(f"sleeping {ms} ms (attempt {task.attempt})")
    if task.cancelled.wait(ms / 1000.0):
        task.log("cancelled while sleeping", "WARN")
        raise HandlerError("cancelled while sleeping", retryable=True)
    task.log(f"slept {ms} ms")
    return Output(json.dumps({"slept_ms": ms}).encode(), "application/json")


def log_lines(task: Task) -> Output:
    """Logs `{"lines": N, "every_ms": M}` lines ("py line 1 of N", ...)."""
    spec = json.loads(task.payload or b"{}")
    n, every = int(spec.get("lines", 1)), int(spec.get("every_ms", 0))
    for i in range(1, n + 1):
        if i > 1 and every and task.cancelled.wait(every / 1000.0):
            raise HandlerError("cancelled while logging", retryable=True)
        task.log(f"py line {i} of {n}")
    return Output(json.dumps({"logged": n}).encode(), "application/json")


def sum_parents(task: Task) -> Output:
    """A workflow step that uses its parents' outputs: adds its payload's
    `{"n": N}` to the `n` of each parent's output (`task.parent_outputs`,
    by step name) and returns `{"n": total, "parents": [names]}`."""
    total = int(json.loads(task.payload or b"{}").get("n", 0))
    for step, out in sorted(task.parent_outputs.items()):
        value = int(json.loads(out.data or b"{}").get("n", 0))
        task.log(f"step {task.workflow_step}: parent {step} gave {value}")
        total += value
    body = {"n": total, "parents": sorted(task.parent_outputs)}
    return Output(json.dumps(body).encode(), "application/json")


def shard(task: Task) -> Output:
    """A shard of a sharding broadcast (each live worker of the handler
    runs one): answers `{"shard": index, "of": total}`."""
    task.log(f"shard {task.shard_index} of {task.shard_total}")
    body = {"shard": task.shard_index, "of": task.shard_total}
    return Output(json.dumps(body, separators=(",", ":")).encode(), "application/json")


def fan_out(task: Task) -> Output:
    """Spawns `{"n": N, "handler": H, "payload": P}` child tasks of handler H
    (default `py.echo`), each with payload P (default `{"i": i}`), and
    returns `{"children": [ids]}`: dynamic fan-out from a handler."""
    spec = json.loads(task.payload or b"{}")
    n, handler = int(spec.get("n", 1)), spec.get("handler", "py.echo")
    children = []
    for i in range(n):
        body = spec.get("payload", {"i": i})
        children.append({"handler": handler, "payload": json.dumps(body).encode(),
                         "content_type": "application/json",
                         "client_request_id": f"{task.task_id}:child:{i}"})
    ids = task.spawn(children)
    task.log(f"spawned {len(ids)} children of {handler}")
    return Output(json.dumps({"children": ids}).encode(), "application/json")


def fail(task: Task) -> Output:
    """Fails with `{"message": ..., "retryable": bool}`."""
    spec = json.loads(task.payload or b"{}")
    raise HandlerError(spec.get("message", "failed on purpose"), bool(spec.get("retryable", False)))


BUILTIN: Dict[str, Handler] = {"echo": echo, "py.echo": echo, "py.sleep": sleep, "py.fail": fail,
                               "py.log": log_lines, "py.sum": sum_parents, "py.fanout": fan_out,
                               "py.shard": shard}
