"""Forwarded hit vs direct hit: one DoGet of a 50,000x8 entry through its owner and
through another node of a 2-node local cluster (release build, static topology).

    FLIGHTCACHE_NODE_BIN=.../release/flightcache-node python cache-node/bench/forward_bench.py

Rounds alternate direct and forwarded reads (which goes first alternates too), after a
warm-up; prints p50 / p90 / mean per path and the forwarded/direct ratio of the medians.
The nodes run with the pods' glibc settings (MALLOC_ARENA_MAX=2,
MALLOC_MMAP_THRESHOLD_=131072; GLIBC_DEFAULTS=1 leaves glibc's defaults), the client
without them. The nodes are stopped by PID at the end.
"""

import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timedelta

import pyarrow as pa
import pyarrow.flight as flight

ROUNDS = int(os.environ.get("ROUNDS", "300"))


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def table(rows=50_000, cols=8):
    base = datetime(2026, 1, 1)
    makers = [
        lambda: pa.array(range(rows), pa.int64()),
        lambda: pa.array([i * 0.25 for i in range(rows)], pa.float64()),
        lambda: pa.array([base + timedelta(seconds=i) for i in range(rows)], pa.timestamp("us")),
        lambda: pa.array([f"r{i % 9973:07d}" for i in range(rows)], pa.utf8()),
    ]
    return pa.table({f"c{i}": makers[i % 4]() for i in range(cols)})


def main():
    binary = os.environ["FLIGHTCACHE_NODE_BIN"]
    ports = [free_port(), free_port()]
    tmp = tempfile.mkdtemp()
    topo = os.path.join(tmp, "topology.json")
    with open(topo, "w") as f:
        json.dump({"version": 1, "members": [
            {"id": f"local-{i}", "address": f"127.0.0.1:{p}"} for i, p in enumerate(ports)]}, f)
    node_env = dict(os.environ)
    if not os.environ.get("GLIBC_DEFAULTS"):
        node_env.update(MALLOC_ARENA_MAX="2", MALLOC_MMAP_THRESHOLD_="131072")
    procs = []
    try:
        for i, port in enumerate(ports):
            procs.append(subprocess.Popen(
                [binary, "--member-id", f"local-{i}", "--topology", topo,
                 "--listen", f"127.0.0.1:{port}", "--metrics-listen", f"127.0.0.1:{free_port()}",
                 "--memory-budget", "1GiB"],
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=node_env))
        for port in ports:
            for _ in range(300):
                try:
                    socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
                    break
                except OSError:
                    time.sleep(0.05)
        clients = [flight.connect(f"grpc://127.0.0.1:{p}") for p in ports]
        data = table()
        key = "bench/forward"
        writer, reader = clients[0].do_put(flight.FlightDescriptor.for_path(*key.split("/")), data.schema)
        writer.write_table(data)
        writer.done_writing()
        reader.read()
        writer.close()
        info = clients[0].get_flight_info(flight.FlightDescriptor.for_path(*key.split("/")))
        owner_uri = info.endpoints[0].locations[0].uri.decode()
        owner = [f"grpc://127.0.0.1:{p}" for p in ports].index(owner_uri)
        direct, forwarded = clients[owner], clients[1 - owner]
        ticket = flight.Ticket(b"FCT\x01P" + key.encode())
        for _ in range(20):
            assert direct.do_get(ticket).read_all().equals(data)
            assert forwarded.do_get(ticket).read_all().equals(data)
        times = {"direct": [], "forwarded": []}
        for r in range(ROUNDS):
            order = [("direct", direct), ("forwarded", forwarded)]
            if r % 2:
                order.reverse()
            for name, client in order:
                t0 = time.perf_counter()
                client.do_get(ticket).read_all()
                times[name].append(time.perf_counter() - t0)
        mb = data.nbytes / 1e6
        print(f"entry: 50,000x8, {mb:.1f} MB Arrow; {ROUNDS} interleaved rounds")
        for name, samples in times.items():
            samples.sort()
            p50 = samples[len(samples) // 2] * 1e3
            p90 = samples[int(len(samples) * 0.9)] * 1e3
            mean = statistics.mean(samples) * 1e3
            print(f"{name:>9}: p50 {p50:.2f} ms  p90 {p90:.2f} ms  mean {mean:.2f} ms")
        ratio = statistics.median(times["forwarded"]) / statistics.median(times["direct"])
        print(f"forwarded/direct (p50): {ratio:.2f}x (target <= 1.3x)")
    finally:
        for proc in procs:
            proc.send_signal(signal.SIGTERM)
        for proc in procs:
            proc.wait(timeout=30)


if __name__ == "__main__":
    sys.exit(main())
