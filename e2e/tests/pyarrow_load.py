"""A pyarrow reader/writer beside flightcache-load during e2e/tests/changes: the same
cache-aside loop a Python service runs, through the pool's client Service by DNS name.

    pyarrow_load.py HOST PORT TOKEN KEYS OUT_JSON PHASE_FILE

Puts KEYS tables under `py/<i>`, then reads random keys until SIGTERM or the phase `end`: a hit must equal
what was put (else `corrupt`), a miss (NOT_FOUND) is refilled, any other error is
counted and followed by a 1 s pause (the backend query a cache-aside client falls back to). Each call is tagged with the phase named in PHASE_FILE. On SIGTERM it writes
{"phases": {phase: {"gets", "hits", "misses", "errors", "corrupt"}}, "error_samples": [...]}.
TLS and client certificates as in flight_client.py (FLIGHTCACHE_TLS_CA, _CLIENT_CERT,
_CLIENT_KEY).
"""

import json
import os
import random
import signal
import sys
import time

import pyarrow as pa
import pyarrow.flight as flight

from flight_client import dial

stop = False
# The backend query a failed cache call falls back to (see the loop).
BACKEND_FALLBACK_S = 1.0
# How long the first puts may wait for the pool's Service to be served (see main).
STARTUP_S = 60.0


def on_term(*_):
    global stop
    stop = True


def table(i: int) -> pa.Table:
    return pa.table({"id": pa.array(range(i, i + 64), pa.int64()),
                     "v": pa.array([f"py{i}-{j}" for j in range(64)])})


def main() -> None:
    host, port, token, keys, out, phase_file = sys.argv[1:7]
    keys = int(keys)
    signal.signal(signal.SIGTERM, on_term)
    client = dial(host, port)
    # The token goes straight into the Bearer header the node checks on every call. No
    # Handshake first: it fails at once ("Could not finish writing before closing") while
    # the Service refuses connections, as it can for a moment after the pool turned Ready
    # (docs/failure-model.md, "Client settings"), where DoGet and DoPut wait for a
    # connection; the Handshake has its own tests.
    options = flight.FlightCallOptions(
        headers=[(b"authorization", b"Bearer " + token.encode())], timeout=10)

    def put(i: int) -> None:
        t = table(i)
        writer, _ = client.do_put(flight.FlightDescriptor.for_path("py", str(i)), t.schema, options)
        writer.write_table(t)
        writer.close()

    # The first puts wait for the Service name to resolve: a pool can be Ready a moment
    # before the cluster DNS serves its new Service (a CI run's first put failed
    # "address lookup failed"). Up to STARTUP_S in all, then the error stands.
    started = time.monotonic()
    for i in range(keys):
        while True:
            try:
                put(i)
                break
            except flight.FlightUnavailableError:
                if time.monotonic() - started > STARTUP_S:
                    raise
                time.sleep(0.5)
    phases: dict = {}
    samples: list = []
    rng = random.Random(7)
    while not stop:
        try:
            phase = open(phase_file).read().strip() or "none"
        except OSError:
            phase = "none"
        if phase == "end":
            # The test writes "end" and then sends SIGTERM. Stopping on either: in one CI
            # run the interpreter never acted on that SIGTERM (the loop ran on for 9
            # minutes until a second one), and the test waited on it.
            break
        counts = phases.setdefault(phase, {"gets": 0, "hits": 0, "misses": 0, "errors": 0, "corrupt": 0})
        i = rng.randrange(keys)
        counts["gets"] += 1
        try:
            got = client.do_get(flight.Ticket(b"FCT\x01Ppy/" + str(i).encode()), options).read_all()
            if got.equals(table(i)):
                counts["hits"] += 1
            else:
                counts["corrupt"] += 1
        except pa.ArrowKeyError:
            counts["misses"] += 1
            try:
                put(i)
            except Exception as err:  # noqa: BLE001 - counted, the loop goes on
                counts["errors"] += 1
                if len(samples) < 10:
                    samples.append(f"{phase}: put: {err}")
        except Exception as err:  # noqa: BLE001 - counted, the loop goes on
            counts["errors"] += 1
            if len(samples) < 10:
                samples.append(f"{phase}: get: {err}")
            # A cache-aside client whose cache call failed computes the result from its
            # backend instead (seconds, for the queries this cache is for) before its next
            # call; it does not spin. Without this pause, a channel in gRPC's reconnect
            # backoff after a crash (every call fails at once, "failed to connect to all
            # addresses") turned one outage into 667 failed calls in ~2 s (a CI run).
            time.sleep(BACKEND_FALLBACK_S)
    with open(out, "w") as f:
        json.dump({"phases": phases, "error_samples": samples}, f)
    client.close()


if __name__ == "__main__":
    main()
    # Once the summary is written nothing is left to do: leave without the interpreter's
    # teardown, in which gRPC's threads were once seen spinning instead of exiting.
    sys.stdout.flush()
    os._exit(0)
