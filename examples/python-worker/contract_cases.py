#!/usr/bin/env python3
"""The contract's rules from Python: each request of a table is validated
locally with protovalidate (PyPI) against the buf.validate rules compiled
into the generated stubs, and, with --server, sent to a taskmesh server; both
verdicts must equal the table's.

    .venv/bin/python contract_cases.py --cases ../contract/cases.json [--server HOST:PORT]

A verdict is the set of field paths whose rules a request breaks ("" for a
rule of the request message itself); empty means accepted. The server's is
read from its INVALID_ARGUMENT message ("task_id: value must be a valid
UUID; ..."); any other answer means the request passed the rules. The token
in $TASKMESH_TOKEN is sent; $TASKMESH_TLS_CA is trusted. Prints one line per
case and exits non-zero if any verdict differs.
"""

import argparse
import json
import os
import re
import sys

import grpc
from google.protobuf import descriptor_pool, json_format, message_factory

# The generated stubs, buf/validate/validate_pb2 included (protovalidate
# imports it from there).
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "gen"))
import protovalidate  # noqa: E402
from taskmesh.v1 import admin_pb2, task_api_pb2  # noqa: E402,F401  (registers the services)

from tmworker.worker import open_channel  # noqa: E402

SERVER_PATH = re.compile(r'^([A-Za-z_][A-Za-z0-9_.\[\]"]*): ')


def request_class(rpc: str):
    service, method = rpc.split("/")
    desc = descriptor_pool.Default().FindServiceByName(service).methods_by_name[method]
    return message_factory.GetMessageClass(desc.input_type)


def path_of(violation) -> str:
    out = ""
    for element in violation.proto.field.elements:
        out += ("." if out else "") + element.field_name
        kind = element.WhichOneof("subscript")
        if kind == "index":
            out += f"[{element.index}]"
        elif kind == "string_key":
            out += f'["{element.string_key}"]'
        elif kind is not None:
            out += f"[{getattr(element, kind)}]"
    return out


def local_verdict(message) -> list:
    return sorted({path_of(v) for v in protovalidate.collect_violations(message)})


def server_verdict(channel, rpc: str, message, token: str) -> list:
    call = channel.unary_unary(
        "/" + rpc,
        request_serializer=lambda m: m.SerializeToString(),
        response_deserializer=lambda b: b,
    )
    metadata = [("authorization", f"Bearer {token}")] if token else []
    try:
        call(message, metadata=metadata, timeout=10)
        return []
    except grpc.RpcError as err:
        if err.code() != grpc.StatusCode.INVALID_ARGUMENT:
            return []
        paths = set()
        for part in (err.details() or "").split("; "):
            m = SERVER_PATH.match(part)
            paths.add(m.group(1) if m else "")
        return sorted(paths)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cases", required=True, help="the table (JSON)")
    parser.add_argument("--server", help="also ask this server (host:port)")
    args = parser.parse_args()
    cases = json.load(open(args.cases, encoding="utf-8"))["cases"]
    channel = open_channel(args.server) if args.server else None
    token = os.environ.get("TASKMESH_TOKEN", "")
    failed = 0
    for case in cases:
        want = sorted(set(case["refused"]))
        message = json_format.ParseDict(case["request"], request_class(case["rpc"])())
        got = {"python": local_verdict(message)}
        if channel is not None:
            got["server"] = server_verdict(channel, case["rpc"], message, token)
        wrong = {who: v for who, v in got.items() if v != want}
        failed += bool(wrong)
        verdict = "refused " + ", ".join(f"{p!r}" for p in want) if want else "accepted"
        print(f"{'ok' if not wrong else 'FAILED'}: {case['name']}: {verdict}"
              + (f" (got {wrong})" if wrong else f" ({', '.join(got)} agree)"))
    print(f"contract cases from python: {len(cases) - failed} agree, {failed} differ")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
