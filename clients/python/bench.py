"""Hit latency through the flightcache client (straight to each key's owner) against plain
pyarrow through one fixed node (which forwards the keys it does not own), side by side in
one run, on a local pool of 3 nodes (static topology on 127.0.0.1, as
cache-node/scripts/local-cluster forms it).

    FLIGHTCACHE_NODE_BIN=.../flightcache-node python clients/python/bench.py

Environment: ROUNDS (reads per path and entry size, default 2000), KEYS (entries per
size, default 60). For each entry size, a warm-up, then rounds that alternate the two paths
(which goes first alternates too) over the same keys in the same random order; prints p50,
p99 and mean per path, and the nodes' forwarded-call counter over each path's reads
(`flightcache_node_forwarded_total`, docs/metrics.md). The nodes run with the pods' glibc
settings (as cache-node/scripts/local-cluster sets them) and are stopped by PID at the end.
"""

from __future__ import annotations

import json
import os
import random
import re
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request

import pyarrow as pa
import pyarrow.flight as flight

import flightcache

ROUNDS = int(os.environ.get("ROUNDS", "2000"))
KEYS = int(os.environ.get("KEYS", "60"))
SIZES = [100, 10_000]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def table(rows: int, seed: int) -> pa.Table:
    return pa.table({
        "id": pa.array(range(seed, seed + rows), pa.int64()),
        "amount": pa.array([i * 0.5 for i in range(rows)], pa.float64()),
        "region": pa.array([f"r{(i + seed) % 7}" for i in range(rows)], pa.utf8()),
    })


def forwarded(metrics_ports: list[int]) -> float:
    total = 0.0
    for port in metrics_ports:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
            text = r.read().decode()
        total += sum(float(v) for v in re.findall(r"^flightcache_node_forwarded_total\{[^}]*\} (\S+)$", text, re.M))
    return total


def start_pool(binary: str, directory: str) -> tuple[list[subprocess.Popen], list[int], list[int]]:
    ports = [free_port() for _ in range(3)]
    metrics = [free_port() for _ in range(3)]
    topology = os.path.join(directory, "topology.json")
    with open(topology, "w") as f:
        json.dump({"version": 1, "members": [
            {"id": f"local-{i}", "address": f"127.0.0.1:{p}"} for i, p in enumerate(ports)]}, f)
    env = dict(os.environ, MALLOC_ARENA_MAX="2", MALLOC_MMAP_THRESHOLD_="131072")
    procs = []
    for i, (port, mport) in enumerate(zip(ports, metrics)):
        log = open(os.path.join(directory, f"local-{i}.log"), "ab")
        procs.append(subprocess.Popen(
            [binary, "--member-id", f"local-{i}", "--topology", topology, "--listen", f"127.0.0.1:{port}",
             "--metrics-listen", f"127.0.0.1:{mport}", "--memory-budget", "1GiB"],
            stdout=subprocess.DEVNULL, stderr=log, env=env))
    for port in ports:
        deadline = time.monotonic() + 30
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise RuntimeError("a node did not start")
                time.sleep(0.05)
    return procs, ports, metrics


def pct(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def main() -> int:
    binary = os.environ["FLIGHTCACHE_NODE_BIN"]
    directory = tempfile.mkdtemp(prefix="flightcache-client-bench-")
    procs, ports, metrics = start_pool(binary, directory)
    try:
        cache = flightcache.connect(f"grpc://127.0.0.1:{ports[0]}")
        plain = flight.connect(f"grpc://127.0.0.1:{ports[0]}")
        rng = random.Random(1)
        print(f"node: {binary}; pool of 3 on 127.0.0.1; client and plain pyarrow both seeded with "
              f"local-0 (127.0.0.1:{ports[0]}); {ROUNDS} reads per path and size over {KEYS} keys; "
              f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs")
        print("| entry | path | p50 | p99 | mean | forwarded calls |")
        print("|---|---|---|---|---|---|")
        for rows in SIZES:
            keys = [f"bench/{rows}/{i}" for i in range(KEYS)]
            weights = [cache.put(key, table(rows, i)).bytes for i, key in enumerate(keys)]
            label = f"{rows:,} rows x 3 ({statistics.fmean(weights) / 1000:.1f} kB)"
            local = sum(1 for key in keys if cache.owner(key) == "local-0")
            tickets = {key: flight.Ticket(b"FCT\x01P" + key.encode()) for key in keys}
            for key in keys * 3:  # warm-up: both paths, every channel open
                cache.get(key)
                plain.do_get(tickets[key]).read_all()
            samples: dict[str, list[float]] = {"client": [], "plain": []}
            fwd = {"client": 0.0, "plain": 0.0}
            order = [rng.choice(keys) for _ in range(ROUNDS)]

            def read(path: str, key: str) -> None:
                started = time.perf_counter()
                got = cache.get(key) if path == "client" else plain.do_get(tickets[key]).read_all()
                samples[path].append(time.perf_counter() - started)
                assert got is not None and got.num_rows == rows

            for block in range(0, ROUNDS, 100):
                paths = ["client", "plain"] if (block // 100) % 2 == 0 else ["plain", "client"]
                for path in paths:
                    before = forwarded(metrics)
                    for key in order[block:block + 100]:
                        read(path, key)
                    fwd[path] += forwarded(metrics) - before
            for path, name in [("client", "flightcache client (to the owner)"),
                               ("plain", "plain pyarrow via local-0")]:
                s = samples[path]
                print(f"| {label} | {name} | {pct(s, 0.5) * 1e3:.2f} ms | {pct(s, 0.99) * 1e3:.2f} ms | "
                      f"{statistics.fmean(s) * 1e3:.2f} ms | {fwd[path]:.0f} of {len(s)} |")
            print(f"|  | ({local} of {KEYS} keys owned by local-0) | | | | |")
        cache.close()
        plain.close()
    finally:
        for proc in procs:
            proc.send_signal(signal.SIGTERM)
        for proc in procs:
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
    return 0


if __name__ == "__main__":
    sys.exit(main())
