"""The stubs generated from proto/ by setup.sh (into gen/, or TASKMESH_PY_GEN)."""

import os
import sys

GEN = os.environ.get(
    "TASKMESH_PY_GEN",
    os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "gen"),
)
if GEN not in sys.path:
    sys.path.insert(0, GEN)
try:
    from taskmesh.v1 import dispatcher_pb2 as pb  # noqa: E402
    from taskmesh.v1 import dispatcher_pb2_grpc  # noqa: E402
    from taskmesh.v1 import logs_pb2  # noqa: E402
    from taskmesh.v1 import task_api_pb2  # noqa: E402
    from taskmesh.v1 import task_api_pb2_grpc  # noqa: E402
    from taskmesh.v1 import task_pb2  # noqa: E402
    from taskmesh.v1 import worker_pb2  # noqa: E402
    from taskmesh.v1 import worker_pb2_grpc  # noqa: E402
except ImportError as err:  # a set-up error, not a bug
    sys.exit(f"py-worker: stubs not found in {GEN} ({err}); run setup.sh first")

__all__ = ["pb", "dispatcher_pb2_grpc", "logs_pb2", "task_api_pb2", "task_api_pb2_grpc", "task_pb2",
           "worker_pb2", "worker_pb2_grpc"]
