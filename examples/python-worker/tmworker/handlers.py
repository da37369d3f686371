"""What a handler is, and the handlers this example serves.

A handler is a plain function `Task -> Output` run on a pool thread. It
raises `HandlerError` to fail (retryable or not); any other exception is
reported as a retryable failure. It should watch `task.cancelled`: the
server cancels attempts it took back or that timed out.
"""

import json
import threading
from dataclasses import dataclass, field
from typing import Callable, Dict


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
    cancelled: threading.Event = field(default_factory=threading.Event)


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
    if task.cancelled.wait(ms / 1000.0):
        raise HandlerError("cancelled while sleeping", retryable=True)
    return Output(json.dumps({"slept_ms": ms}).encode(), "application/json")


def fail(task: Task) -> Output:
    """Fails with `{"message": ..., "retryable": bool}`."""
    spec = json.loads(task.payload or b"{}")
    raise HandlerError(spec.get("message", "failed on purpose"), bool(spec.get("retryable", False)))


BUILTIN: Dict[str, Handler] = {"echo": echo, "py.echo": echo, "py.sleep": sleep, "py.fail": fail}
