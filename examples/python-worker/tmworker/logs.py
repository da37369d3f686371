"""A task's log lines as `TaskLogs` messages (proto/taskmesh/v1/logs.proto),
at most 1,000 lines each (the contract's limit). The stream session sends
them on the stream while the task runs and before its result; push mode
sends them with `Dispatcher.ReportLogs` before `ReportResult`."""

from typing import List

from google.protobuf.timestamp_pb2 import Timestamp

from .handlers import Task
from .stubs import logs_pb2

LINES_PER_MESSAGE = 1000


def log_messages(task: Task) -> List["logs_pb2.TaskLogs"]:
    """Takes the task's buffered lines; empty when there are none."""
    lines, dropped = task.take_lines()
    if not lines and not dropped:
        return []
    messages = []
    for start in range(0, max(len(lines), 1), LINES_PER_MESSAGE):
        m = logs_pb2.TaskLogs(task_id=task.task_id, execution_id=task.execution_id,
                              dropped=dropped if start == 0 else 0)
        for at, level, text in lines[start:start + LINES_PER_MESSAGE]:
            ts = Timestamp()
            ts.FromNanoseconds(int(at * 1e9))
            m.lines.add(time=ts, level=logs_pb2.LogLevel.Value("LOG_LEVEL_" + level),
                        message=text)
        messages.append(m)
    return messages
