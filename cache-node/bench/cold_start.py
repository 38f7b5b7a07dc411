"""Cold start and memory baseline of flightcache-node, on loopback.

For each run: exec the node binary, then poll (1 ms apart) until
  * its metrics port answers `GET /readyz` with 200 (what the kubelet's readiness probe sees), and
  * its Flight port answers a `ping` action (what a client sees);
then read its resident memory (VmRSS) idle, and stop it with SIGTERM, timing the exit.
Prints a markdown table of min / median / max over the runs.

    python cache-node/bench/cold_start.py --node-bin BIN [--runs 20]

Every node it starts is stopped by its PID, also on failure or Ctrl-C.
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time

import pyarrow.flight as flight

# The benchmark's own helpers and the pods' allocator settings (same folder).
from flight_bench import HOST, NODE_MALLOC_ENV, free_port, rss_bytes

POLL = 0.001
DEADLINE = 30.0


def readyz(port: int) -> bool:
    try:
        with socket.create_connection((HOST, port), timeout=0.5) as s:
            s.sendall(b"GET /readyz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            return s.recv(64).startswith(b"HTTP/1.1 200")
    except OSError:
        return False


def pings(port: int) -> bool:
    try:
        client = flight.FlightClient(f"grpc://{HOST}:{port}")
        try:
            list(client.do_action(flight.Action("ping", b""), options=flight.FlightCallOptions(timeout=0.5)))
            return True
        finally:
            client.close()
    except flight.FlightError:
        return False


def one_run(node_bin: str, workdir: str) -> dict[str, float]:
    port, mport = free_port(), free_port()
    log = open(os.path.join(workdir, "node.log"), "ab")
    t0 = time.monotonic()
    proc = subprocess.Popen(
        [node_bin, "--listen", f"{HOST}:{port}", "--metrics-listen", f"{HOST}:{mport}"],
        stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, cwd=workdir,
        env={**os.environ, **NODE_MALLOC_ENV},
    )
    log.close()
    try:
        ready_at = flight_at = None
        while ready_at is None or flight_at is None:
            if proc.poll() is not None:
                raise RuntimeError(f"the node exited with code {proc.returncode} at start (log: {workdir}/node.log)")
            now = time.monotonic()
            if now - t0 > DEADLINE:
                raise RuntimeError(f"the node was not serving within {DEADLINE:.0f} s")
            if ready_at is None and readyz(mport):
                ready_at = time.monotonic()
            if flight_at is None and pings(port):
                flight_at = time.monotonic()
            time.sleep(POLL)
        time.sleep(1.0)
        rss = rss_bytes(proc.pid)
        t_stop = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=30)
        stopped = time.monotonic() - t_stop
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)
    return {
        "readyz_ms": (ready_at - t0) * 1000,
        "flight_ms": (flight_at - t0) * 1000,
        "rss_mib": rss / 2**20,
        "stop_ms": stopped * 1000,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--node-bin", required=True, help="flightcache-node binary (release build)")
    parser.add_argument("--runs", type=int, default=20)
    args = parser.parse_args()
    runs = []
    with tempfile.TemporaryDirectory(prefix="flightcache-cold-start-") as workdir:
        for _ in range(args.runs):
            runs.append(one_run(args.node_bin, workdir))
    rows = [
        ("exec → `/readyz` 200 (metrics port)", "readyz_ms", "ms"),
        ("exec → first `ping` answered (Flight port, new connection)", "flight_ms", "ms"),
        ("resident memory, idle, 1 s after serving", "rss_mib", "MiB"),
        ("SIGTERM → exit (empty node, no ring)", "stop_ms", "ms"),
    ]
    print(f"| measure ({args.runs} runs) | min | median | max |")
    print("|---|---:|---:|---:|")
    for label, field, unit in rows:
        values = [r[field] for r in runs]
        print(f"| {label} | {min(values):.1f} {unit} | {statistics.median(values):.1f} {unit} | {max(values):.1f} {unit} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
