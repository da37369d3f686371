#!/usr/bin/env python3
"""Checks a taskmesh server's operational services from Python, with the
standard packages grpcio-health-checking and grpcio-reflection only (no
taskmesh stubs): health answers SERVING for the server and each service, and
reflection lists the contract's services and resolves their descriptors.

    .venv/bin/python check_server.py --server 127.0.0.1:50051 --wait 30

Prints one line per check (ok or FAILED) and exits non-zero if any failed.
"""

import argparse
import sys
import time

import grpc
from google.protobuf import descriptor_pool
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha.proto_reflection_descriptor_database import (
    ProtoReflectionDescriptorDatabase,
)

from tmworker.worker import open_channel

CONTRACT = ["taskmesh.v1.TaskApi", "taskmesh.v1.Dispatcher", "taskmesh.v1.Worker"]
SERVED = ["", "taskmesh.v1.TaskApi", "taskmesh.v1.Dispatcher"]
SERVING = health_pb2.HealthCheckResponse.SERVING


def wait_serving(stub, deadline: float) -> str:
    """Polls Check("") until SERVING or the deadline; returns the last status."""
    last = "no answer"
    while True:
        try:
            status = stub.Check(health_pb2.HealthCheckRequest(service=""), timeout=2).status
            last = health_pb2.HealthCheckResponse.ServingStatus.Name(status)
            if status == SERVING:
                return last
        except grpc.RpcError as err:
            last = f"{err.code().name}: {err.details()}"
        if time.monotonic() >= deadline:
            return last
        time.sleep(0.1)  # polling interval of a condition with a deadline


def check_health(channel, wait: float):
    stub = health_pb2_grpc.HealthStub(channel)
    first = wait_serving(stub, time.monotonic() + wait)
    if first != "SERVING":
        return False, f'"" is {first} after {wait:.0f} s'
    answers = {}
    for service in SERVED:
        status = stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=5).status
        answers[service or '""'] = health_pb2.HealthCheckResponse.ServingStatus.Name(status)
    ok = all(v == "SERVING" for v in answers.values())
    return ok, ", ".join(f"{k}={v}" for k, v in answers.items())


def check_reflection(channel):
    db = ProtoReflectionDescriptorDatabase(channel)
    services = sorted(db.get_services())
    missing = [s for s in CONTRACT if s not in services]
    if missing:
        return False, f"missing {missing} from {services}"
    # Resolving every method's types through the reflected files proves the
    # descriptors (with their imports) are complete, not just the names.
    pool = descriptor_pool.DescriptorPool(db)
    methods = 0
    for name in CONTRACT:
        service = pool.FindServiceByName(name)
        for method in service.methods:
            assert method.input_type.full_name and method.output_type.full_name
            methods += 1
    submit = pool.FindMethodByName("taskmesh.v1.TaskApi.SubmitTask")
    if submit.input_type.full_name != "taskmesh.v1.SubmitTaskRequest":
        return False, f"SubmitTask takes {submit.input_type.full_name}"
    return True, f"{len(services)} services listed ({', '.join(services)}); {methods} methods resolved"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--server", default="127.0.0.1:50051")
    p.add_argument("--wait", type=float, default=30.0,
                   help="seconds to wait for the server to answer SERVING")
    p.add_argument("--only", choices=["health", "reflection"], help="run one check")
    args = p.parse_args(argv)
    failed = 0
    with open_channel(args.server) as channel:
        checks = (("health", lambda: check_health(channel, args.wait)),
                  ("reflection", lambda: check_reflection(channel)))
        for name, check in checks:
            if args.only and name != args.only:
                continue
            try:
                ok, detail = check()
            except Exception as err:  # report any failure as a FAIL line
                ok, detail = False, f"{type(err).__name__}: {err}"
            print(f"check_server: {name} {'ok' if ok else 'FAILED'}: {detail}", flush=True)
            failed += not ok
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
