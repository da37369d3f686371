"""A taskmesh worker library in Python, built from the stubs that setup.sh
generates from proto/. `worker.py` beside this package is its command line.

- `handlers`: what a handler is (Task in, Output out, HandlerError) and the
  built-in ones.
- `session`: one Dispatcher.Connect stream: register, heartbeat, ACK, run,
  report, drain.
- `worker`: connects, fails over across servers and reconnects with backoff.
"""

from .handlers import BUILTIN, Handler, HandlerError, Output, Task
from .worker import Worker

__all__ = ["BUILTIN", "Handler", "HandlerError", "Output", "Task", "Worker"]
