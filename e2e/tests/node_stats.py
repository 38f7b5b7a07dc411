"""What each node of a pool actually runs and holds, read from the node itself: the
`stats` admin action on every pod through its headless-Service name, from the client
network namespace. Usage:

    node_stats.py NAMESPACE POOL_PREFIX NODES ADMIN_TOKEN [FIELD=VALUE ...]

Prints one line per node: `name entries=N usedBytes=N ttl=… eviction=… maxEntries=N
budgetBytes=N ringVersion=N`. Each FIELD=VALUE (a `stats` field in camelCase) must hold
on every node, else the run fails naming the node and the value it reports — so a live
change is checked where it matters, not only in the operator's status.

A node that was just replaced can be unreachable by its name for a few seconds (the
cluster DNS caches the old pod's address for its TTL), and a value can take a moment to
reach every node: the check is repeated until it holds, for at most WAIT seconds (30).
"""

import json
import os
import sys
import time

import pyarrow.flight as flight

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from flight_client import open_client  # noqa: E402

SHOWN = ["entries", "usedBytes", "ttl", "ttlMode", "eviction", "maxEntries", "budgetBytes", "ringVersion", "replicas"]


def stats(host: str, token: str) -> dict:
    client = open_client(host, 50051)
    try:
        options = flight.FlightCallOptions(headers=[(b"authorization", f"Bearer {token}".encode())], timeout=5)
        results = list(client.do_action(flight.Action("stats", b""), options))
        return json.loads(results[0].body.to_pybytes())
    finally:
        client.close()


WAIT = 30


def report(namespace: str, prefix: str, nodes: int, token: str, wants: dict) -> tuple[list, list]:
    lines, wrong = [], []
    for i in range(nodes):
        name = f"{prefix}-{i}"
        try:
            answer = stats(f"{name}.{prefix}-nodes.{namespace}.svc.cluster.local", token)
        except flight.FlightError as err:
            wrong.append(f"{name}: no answer ({err})")
            continue
        lines.append(f"{name} " + " ".join(f"{field}={answer.get(field)}" for field in SHOWN))
        for field, value in wants.items():
            if str(answer.get(field)) != value:
                wrong.append(f"{name}: {field} is {answer.get(field)!r}, want {value!r}")
    return lines, wrong


def main() -> int:
    namespace, prefix, nodes, token, *expected = sys.argv[1:]
    wants = dict(item.split("=", 1) for item in expected)
    deadline = time.monotonic() + WAIT
    while True:
        lines, wrong = report(namespace, prefix, int(nodes), token, wants)
        if not wrong or time.monotonic() >= deadline:
            break
        time.sleep(1)
    for line in lines:
        print(line)
    for line in wrong:
        print("WRONG:", line)
    return 1 if wrong else 0


if __name__ == "__main__":
    sys.exit(main())
