"""No stale read after a network partition heals (e2e/tests/multi-node, `node-partition`).

    partition_check.py HOST PORT TOKEN PEER_TOKEN NAMESPACE POOL KEYS CONTROL_DIR OUT_JSON POD...

Through the pool's client Service (HOST:PORT, pyarrow with the pool's client settings), it
puts KEYS keys `fresh/<i>` (value 1), then waits for files in CONTROL_DIR written by the
test script:

- `wave1` (just after the cut) and `wave2` (after the operator has taken the cut-off node's
  members out of the key space): the keys of that wave (even i: wave 1, odd i: wave 2) are
  changed, each i % 4 < 2 overwritten with value 2, the others invalidated. A call that
  fails is tried again until it succeeds (an `invalidate` answers `UNAVAILABLE` while one
  of a key's copies cannot be reached, by design: docs/cache-node.md, replicas) and the
  time it took is recorded; from the moment a change succeeded, the key's old value must
  never be read again.
- `stop`: the reads end.

From the first wave on, it reads every key in turn (a new connection every 20 reads, so
the Service spreads them over the pool's pods) and classifies each answer: current (the
value last written, or a miss for an invalidated key), a miss, or STALE (value 1 after
its change succeeded; value 2 of an invalidated key). After `stop` it checks the pods'
own stores (POD...: `ListFlights` and `DoGet` as a peer with `x-flightcache-forwarded`,
so each answers from its own entries): no pod holds an invalidated key, and every copy of
an overwritten key is value 2. Writes OUT_JSON and exits 1 on any stale read or copy.
"""

import json
import os
import sys
import time

import pyarrow as pa
import pyarrow.flight as flight

sys.path.insert(0, os.path.dirname(__file__))
from flight_client import dial, open_client, put, ticket  # noqa: E402

ROWS = 20
OLD, NEW = 1, 2
CHANGE_DEADLINE_S = 90.0


def value(i: int, version: int) -> pa.Table:
    return pa.table({"key": pa.array([i] * ROWS, pa.int64()),
                     "version": pa.array([version] * ROWS, pa.int64()),
                     "row": pa.array(range(ROWS), pa.int64())})


def version_of(got: pa.Table, i: int) -> int:
    versions = set(got.column("version").to_pylist())
    keys = set(got.column("key").to_pylist())
    if len(versions) != 1 or keys != {i} or got.num_rows != ROWS:
        raise SystemExit(f"fresh/{i}: corrupt answer ({got.num_rows} rows, keys {keys}, versions {versions})")
    return versions.pop()


class Session:
    """A client Service connection, renewed every 20 calls. The token goes as a bearer
    header on each call (no Handshake: gRPC's retries of the client settings cover DoGet
    and DoPut, not a Handshake that lands on a cut-off pod)."""

    def __init__(self, host, port, token):
        self.host, self.port, self.token = host, port, token
        self.client, self.options, self.calls = None, None, 0

    def get(self):
        if self.client is None or self.calls >= 20:
            if self.client is not None:
                self.client.close()
            self.client = dial(self.host, self.port)
            self.options = flight.FlightCallOptions(
                headers=[(b"authorization", f"Bearer {self.token}".encode())], timeout=20)
            self.calls = 0
        self.calls += 1
        return self.client, self.options

    def drop(self):
        if self.client is not None:
            self.client.close()
        self.client = None


def read(session: Session, i: int):
    """The key's version, None for a miss; an error propagates."""
    client, options = session.get()
    try:
        return version_of(client.do_get(ticket(f"fresh/{i}"), options).read_all(), i)
    except pa.ArrowKeyError:  # NOT_FOUND: a miss
        return None


def change(session: Session, i: int, overwrite: bool) -> dict:
    """Overwrites (value 2) or invalidates fresh/i, trying again until it succeeds."""
    began, tries, errors = time.monotonic(), 0, []
    while True:
        tries += 1
        try:
            client, options = session.get()
            if overwrite:
                put(client, options, f"fresh/{i}", value(i, NEW))
            else:
                list(client.do_action(flight.Action("invalidate", f"fresh/{i}".encode()), options))
            return {"tries": tries, "seconds": round(time.monotonic() - began, 3),
                    "errors": errors[:3]}
        except flight.FlightError as err:
            errors.append(f"{type(err).__name__}: {str(err).splitlines()[0][:160]}")
            session.drop()
            if time.monotonic() - began > CHANGE_DEADLINE_S:
                raise SystemExit(f"fresh/{i}: change still failing after {CHANGE_DEADLINE_S} s: {errors[-3:]}")
            time.sleep(0.5)


def own_copies(pod_host: str, peer_token: str) -> dict:
    """fresh/<i> -> version of this pod's own copy (None: listed, gone before the read)."""
    client = open_client(pod_host, 50051)
    options = flight.FlightCallOptions(
        headers=[(b"authorization", f"Bearer {peer_token}".encode()),
                 (b"x-flightcache-forwarded", b"partition-check")], timeout=10)
    copies = {}
    try:
        for info in client.list_flights(b"fresh/", options):
            name = "/".join(p.decode() for p in info.descriptor.path)
            i = int(name.split("/")[1])
            try:
                copies[i] = version_of(client.do_get(ticket(name), options).read_all(), i)
            except pa.ArrowKeyError:
                copies[i] = None
    finally:
        client.close()
    return copies


def main() -> int:
    host, port, token, peer_token, namespace, pool, keys, control, out = sys.argv[1:10]
    pods = sys.argv[10:]
    keys = int(keys)
    session = Session(host, port, token)
    for i in range(keys):
        client, options = session.get()
        put(client, options, f"fresh/{i}", value(i, OLD))
    print(f"put {keys} keys fresh/0..{keys - 1} (value {OLD})", flush=True)
    open(os.path.join(control, "seeded"), "w").close()

    # What each key must read as, once its change succeeded: NEW, or None (invalidated).
    expect, changed_at, changes = {}, {}, {}
    reads = {"current": 0, "miss": 0, "stale": 0, "before_change": 0}
    stale = []
    waves = {"wave1": [i for i in range(keys) if i % 2 == 0],
             "wave2": [i for i in range(keys) if i % 2 == 1]}
    pending = list(waves)
    next_key = 0
    while not os.path.exists(os.path.join(control, "stop")):
        if pending and os.path.exists(os.path.join(control, pending[0])):
            wave = pending.pop(0)
            began = time.monotonic()
            for i in waves[wave]:
                overwrite = i % 4 < 2
                changes[i] = {"wave": wave, "overwrite": overwrite, **change(session, i, overwrite)}
                expect[i] = NEW if overwrite else None
                changed_at[i] = time.monotonic()
            print(f"{wave}: {len(waves[wave])} keys changed in {time.monotonic() - began:.1f} s "
                  f"({sum(changes[i]['tries'] - 1 for i in waves[wave])} tries again)", flush=True)
            continue
        if not expect:
            time.sleep(0.2)
            continue
        i = next_key % keys
        next_key += 1
        try:
            got = read(session, i)
        except flight.FlightError as err:
            session.drop()
            reads.setdefault("errors", []).append(f"fresh/{i}: {str(err).splitlines()[0][:160]}")
            continue
        if i not in expect:
            reads["before_change"] += 1
        elif got == expect[i]:
            reads["current"] += 1
        elif got is None:
            reads["miss"] += 1
        else:
            reads["stale"] += 1
            stale.append({"key": f"fresh/{i}", "read": got, "expected": expect[i],
                          "seconds_after_change": round(time.monotonic() - changed_at[i], 1),
                          # to be read beside the nodes' and the operator's logs
                          "at": time.strftime("%H:%M:%S", time.gmtime()) + f".{int(time.time() * 1000) % 1000:03d}Z",
                          "wave": changes[i]["wave"], "change_tries": changes[i]["tries"]})
    session.drop()

    copies = {pod: own_copies(f"{pod}.{pool}-nodes.{namespace}.svc.cluster.local", peer_token) for pod in pods}
    stale_copies = [{"pod": pod, "key": f"fresh/{i}", "holds": v, "expected": expect.get(i)}
                    for pod, held in copies.items() for i, v in sorted(held.items())
                    if i in expect and v is not None and v != expect[i]]
    errors = reads.pop("errors", [])
    report = {"keys": keys, "reads": reads, "read_errors": len(errors), "error_samples": errors[:5],
              "stale_reads": stale[:20], "stale_copies": stale_copies[:20],
              "copies_per_pod": {pod: len(held) for pod, held in copies.items()},
              "change_tries_again": sum(c["tries"] - 1 for c in changes.values()),
              "change_seconds_max": max((c["seconds"] for c in changes.values()), default=0),
              "change_error_samples": [e for c in changes.values() for e in c["errors"]][:5]}
    json.dump(report, open(out, "w"), indent=1)
    print(json.dumps(report, indent=1))
    # Read errors are reported, not judged here: the load generators' failed calls are
    # (changes_report.py); this check is about values.
    ok = not stale and not stale_copies and len(changes) == keys
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
