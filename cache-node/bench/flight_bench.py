"""FlightCache benchmark: flightcache-node vs a pyarrow Flight server vs Redis (+ Arrow IPC).

Everything is measured in one run on this machine with the Python client (pyarrow.flight,
redis-py), side by side, in interleaved rounds so that a burst of outside load hits every
system alike. The program starts the servers itself and stops each of them by PID when it
ends, also on an error, Ctrl-C or SIGTERM (their PIDs are also written to --pidfile so a
caller can clean up after a SIGKILL).

  latency    p50/p99 of a hit (one DoGet with a ticket built from the key; Redis: GET +
             IPC decode), of GetFlightInfo + DoGet, and of a put (DoPut; Redis: IPC encode
             + SET), for each table shape; and the node's own p50/p95/p99/p99.9 per RPC
             and shape (docs/performance.md)
  throughput sustained MB/s reading 50,000x8 with 1 and 4 client processes, and tiny-call
             requests/s (DoAction "ping"; Redis PING) with 1 and 4 client processes
  memory     node RSS vs the Arrow bytes it holds (stats usedBytes), and the node's peak
             RSS during a 4-process put storm vs its budget
  rust       the same servers measured with a Rust client (cache-node/benches/flight_calls.rs,
             built here with `cargo bench --no-run`), where pyarrow's own client would be the
             ceiling: tiny-call requests/s with 1 and 4 clients, and the p50/p99/p99.9 of a
             200x7 hit, idle and while 4 clients put 50,000x8 tables continuously

Usage: python flight_bench.py --node-bin PATH --redis-bin PATH [--quick] [--out FILE]
         [--parts latency,throughput,memory,rust] [--calls-bin PATH]
"""

from __future__ import annotations

import argparse
import atexit
import datetime as dt
import json
import multiprocessing as mp
import os
import math
import platform
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field

import pyarrow as pa
import pyarrow.flight as flight

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
HOST = "127.0.0.1"
MB = 1_000_000
MiB = 1 << 20

SHAPES = [(200, 7), (1_827, 2), (50_000, 2), (10_000, 8), (50_000, 8)]
# Shapes where the node must be no slower than Redis + IPC decode.
REDIS_TARGET_SHAPES = {(50_000, 2), (10_000, 8), (50_000, 8)}
THROUGHPUT_SHAPE = (50_000, 8)
# The entry the Rust client's reader hits while others put THROUGHPUT_SHAPE tables.
HIT_SHAPE = (200, 7)
PARTS = ("latency", "throughput", "memory", "rust")

NODE, PYARROW, REDIS = "node", "pyarrow", "redis"
LABELS = {NODE: "flightcache-node", PYARROW: "pyarrow Flight", REDIS: "Redis + IPC"}


# --------------------------------------------------------------------------- settings


@dataclass
class Settings:
    quick: bool
    # latency: per (op, shape, system), split over `rounds` interleaved rounds
    rounds: int = 3
    cell_seconds: float = 3.0  # measuring time per cell, all rounds together
    cell_min_iters: int = 200  # taken even if the time is up (bounded by cell_hard_seconds)
    cell_max_iters: int = 5_000
    cell_hard_seconds: float = 8.0
    warmup_iters: int = 20
    # throughput
    stream_seconds: float = 8.0
    tiny_seconds: float = 5.0
    worker_warmup_seconds: float = 0.5
    # memory
    mem_budget: int = 512 * MiB
    mem_fill: float = 0.9  # fill this share of the budget with 50,000x8 entries (at most 200)
    storm_budget: int = 256 * MiB
    storm_seconds: float = 20.0
    storm_clients: int = 4
    # rust (the Rust client, benches/flight_calls.rs); tiny calls use tiny_seconds
    hits_seconds: float = 5.0  # per hit-latency run (idle, under puts)
    hits_putters: int = 4

    @classmethod
    def make(cls, quick: bool) -> "Settings":
        if not quick:
            return cls(quick=False)
        return cls(
            quick=True,
            rounds=2,
            cell_seconds=0.5,
            cell_min_iters=50,
            cell_max_iters=1_000,
            cell_hard_seconds=3.0,
            warmup_iters=5,
            stream_seconds=2.0,
            tiny_seconds=1.5,
            worker_warmup_seconds=0.2,
            storm_seconds=5.0,
            hits_seconds=1.5,
        )


# --------------------------------------------------------------------------- data


def make_table(rows: int, cols: int, seed: int = 7) -> pa.Table:
    """A BI-result-shaped table: columns cycle int64, float64, timestamp[us], utf8 (~8 chars)."""
    rng = random.Random(seed + rows * 31 + cols)
    arrays, names = [], []
    for c in range(cols):
        kind = c % 4
        if kind == 0:
            arr = pa.array([rng.randrange(1 << 40) for _ in range(rows)], pa.int64())
            names.append(f"id_{c}")
        elif kind == 1:
            arr = pa.array([rng.gauss(0.0, 1000.0) for _ in range(rows)], pa.float64())
            names.append(f"amount_{c}")
        elif kind == 2:
            base = 1_700_000_000_000_000
            arr = pa.array([base + rng.randrange(86_400_000_000 * 365) for _ in range(rows)], pa.timestamp("us"))
            names.append(f"ts_{c}")
        else:
            arr = pa.array([f"k{rng.randrange(10_000_000):07d}" for _ in range(rows)], pa.utf8())
            names.append(f"label_{c}")
        arrays.append(arr)
    return pa.Table.from_arrays(arrays, names=names)


def shape_name(shape: tuple[int, int]) -> str:
    return f"{shape[0]:,}×{shape[1]}"


def shape_key(shape: tuple[int, int]) -> str:
    return f"bench/{shape[0]}x{shape[1]}"


def ipc_bytes(table: pa.Table) -> pa.Buffer:
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    return sink.getvalue()


# --------------------------------------------------------------------------- clients


def node_ticket(key: str) -> bytes:
    """FlightCache ticket v1 for a path key: b"FCT" 0x01 b"P" + key."""
    return b"FCT\x01P" + key.encode()


class FlightSystem:
    def __init__(self, kind: str, port: int):
        self.kind = kind
        self.port = port
        self.client = flight.connect(f"grpc://{HOST}:{port}")

    def ticket(self, key: str) -> flight.Ticket:
        return flight.Ticket(node_ticket(key) if self.kind == NODE else key.encode())

    def hit(self, key: str) -> pa.Table:
        return self.client.do_get(self.ticket(key)).read_all()

    def info_get(self, key: str) -> pa.Table:
        info = self.client.get_flight_info(flight.FlightDescriptor.for_path(*key.split("/")))
        return self.client.do_get(info.endpoints[0].ticket).read_all()

    def put(self, key: str, table: pa.Table) -> None:
        writer, reader = self.client.do_put(flight.FlightDescriptor.for_path(*key.split("/")), table.schema)
        writer.write_table(table)
        writer.close()

    def tiny(self) -> None:
        for _ in self.client.do_action(flight.Action("ping", b"")):
            pass

    def action_json(self, name: str, body: bytes = b"") -> dict:
        results = list(self.client.do_action(flight.Action(name, body)))
        return json.loads(results[0].body.to_pybytes()) if results else {}

    def close(self) -> None:
        self.client.close()


class RedisSystem:
    kind = REDIS

    def __init__(self, port: int):
        import redis

        self.port = port
        self.r = redis.Redis(host=HOST, port=port)

    def hit(self, key: str) -> pa.Table:
        data = self.r.get(key)
        if data is None:
            raise KeyError(key)
        return pa.ipc.open_stream(pa.py_buffer(data)).read_all()

    def put(self, key: str, table: pa.Table) -> None:
        self.r.set(key, memoryview(ipc_bytes(table)))

    def tiny(self) -> None:
        self.r.ping()

    def close(self) -> None:
        self.r.close()


def connect(kind: str, port: int):
    return RedisSystem(port) if kind == REDIS else FlightSystem(kind, port)


# --------------------------------------------------------------------------- processes


class Processes:
    """Servers started by this program; each is stopped by its PID."""

    def __init__(self, workdir: str, pidfile: str | None):
        self.workdir = workdir
        self.pidfile = pidfile
        self.procs: dict[str, subprocess.Popen] = {}

    def start(self, name: str, argv: list[str], env: dict[str, str] | None = None) -> subprocess.Popen:
        log = open(os.path.join(self.workdir, f"{name}.log"), "wb")
        full_env = {**os.environ, **(env or {})}
        proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                cwd=self.workdir, env=full_env)
        log.close()
        self.procs[name] = proc
        self._write_pidfile()
        return proc

    def stop(self, name: str) -> None:
        proc = self.procs.pop(name, None)
        if proc is None:
            return
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=10)
        self._write_pidfile()

    def stop_all(self) -> None:
        for name in list(self.procs):
            self.stop(name)

    def log_tail(self, name: str, lines: int = 20) -> str:
        try:
            with open(os.path.join(self.workdir, f"{name}.log"), errors="replace") as f:
                return "".join(f.readlines()[-lines:])
        except OSError:
            return ""

    def _write_pidfile(self) -> None:
        if self.pidfile:
            with open(self.pidfile, "w") as f:
                f.write("".join(f"{p.pid}\n" for p in self.procs.values()))


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((HOST, 0))
        return s.getsockname()[1]


def wait_ready(procs: Processes, name: str, kind: str, port: int, timeout: float = 60.0):
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        proc = procs.procs[name]
        if proc.poll() is not None:
            raise RuntimeError(f"{name} exited with code {proc.returncode} at start:\n{procs.log_tail(name)}")
        try:
            system = connect(kind, port)
            system.tiny()
            return system
        except Exception as e:  # not up yet
            last = e
            time.sleep(0.1)
    raise RuntimeError(f"{name} did not answer ping on {HOST}:{port} within {timeout:.0f}s: {last}\n{procs.log_tail(name)}")


# The allocator settings every deployment of the node runs with (the operator's pod
# template and scripts/run-node set them; see docs/cache-node.md, "Memory accounting").
NODE_MALLOC_ENV = {"MALLOC_ARENA_MAX": "2", "MALLOC_MMAP_THRESHOLD_": "131072"}


def start_node(procs: Processes, name: str, node_bin: str, budget: int, max_entry: int):
    port, mport = free_port(), free_port()
    procs.start(
        name,
        [
            node_bin,
            "--listen", f"{HOST}:{port}",
            "--metrics-listen", f"{HOST}:{mport}",
            "--memory-budget", format_size(budget),
            "--max-entry-size", format_size(max_entry),
        ],
        env=NODE_MALLOC_ENV,
    )
    return port, wait_ready(procs, name, NODE, port)


def format_size(n: int) -> str:
    return f"{n // MiB}MiB" if n % MiB == 0 else str(n)


def rss_bytes(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError(f"no VmRSS for pid {pid}")


# --------------------------------------------------------------------------- latency


@dataclass
class Samples:
    ns: list[int] = field(default_factory=list)
    # CPU the client process (all threads, gRPC's included) spent per call, ns.
    cpu_ns: list[int] = field(default_factory=list)

    def cpu_median_us(self) -> float:
        data = sorted(self.cpu_ns)
        return data[len(data) // 2] / 1000.0 if data else 0.0

    def p(self, q: float) -> float:
        """Percentile q (0..100) in microseconds, nearest-rank."""
        data = sorted(self.ns)
        idx = min(len(data) - 1, max(0, math.ceil(q / 100.0 * len(data)) - 1))
        return data[idx] / 1000.0


def timed(fn, out: "Samples", seconds: float, max_iters: int, min_iters: int, hard_seconds: float) -> None:
    """Appends the duration (ns) and client CPU (ns) of fn() calls to out: about `seconds`
    of calls, at least min_iters of them unless hard_seconds run out first, never more
    than max_iters."""
    start = time.perf_counter()
    soft, hard = start + seconds, start + max(seconds, hard_seconds)
    n = 0
    while n < max_iters:
        c0 = time.process_time_ns()
        t0 = time.perf_counter_ns()
        fn()
        out.ns.append(time.perf_counter_ns() - t0)
        out.cpu_ns.append(time.process_time_ns() - c0)
        n += 1
        now = time.perf_counter()
        if now >= hard or (now >= soft and n >= min_iters):
            break


def measure_latency(systems: dict, tables: dict, settings: Settings, log) -> dict:
    """results[op][shape][kind] = Samples; ops: hit, info_get, put."""
    results: dict = {"hit": {}, "info_get": {}, "put": {}}
    kinds = list(systems)
    for shape in SHAPES:
        key = shape_key(shape)
        table = tables[shape]
        for op in ("hit", "info_get", "put"):
            op_kinds = [k for k in kinds if op != "info_get" or k != REDIS]
            if not op_kinds:
                continue
            cell = {k: Samples() for k in op_kinds}

            def fn_for(kind):
                system = systems[kind]
                if op == "hit":
                    return lambda: system.hit(key)
                if op == "info_get":
                    return lambda: system.info_get(key)
                put_key = f"bench/put/{shape[0]}x{shape[1]}"
                return lambda: system.put(put_key, table)

            fns = {k: fn_for(k) for k in op_kinds}
            for k in op_kinds:  # warm-up
                for _ in range(settings.warmup_iters):
                    fns[k]()
            rounds = settings.rounds
            for r in range(rounds):
                order = op_kinds[r % len(op_kinds):] + op_kinds[: r % len(op_kinds)]
                for k in order:
                    timed(fns[k], cell[k], settings.cell_seconds / rounds, settings.cell_max_iters // rounds,
                          -(-settings.cell_min_iters // rounds), settings.cell_hard_seconds / rounds)
            for k in op_kinds:
                results[op].setdefault(shape, {})[k] = cell[k]
            log(
                f"  {op:8s} {shape_name(shape):>9s}  "
                + "  ".join(f"{k}: p50 {cell[k].p(50):8.0f}µs p99 {cell[k].p(99):8.0f}µs n={len(cell[k].ns)}" for k in op_kinds)
            )
    return results


# --------------------------------------------------------------------------- throughput


def _worker(kind, port, op, key, seconds, warmup, barrier, queue):
    try:
        system = connect(kind, port)
        fn = (lambda: system.hit(key)) if op == "stream" else system.tiny
        nbytes_per = system.hit(key).nbytes if op == "stream" else 0
        t_end = time.perf_counter() + warmup
        while time.perf_counter() < t_end:
            fn()
        barrier.wait(timeout=60)
        count = 0
        start = time.perf_counter()
        # CPU of this client process (all its threads, gRPC's included): the client's
        # own cost per call, a ceiling on calls/s no server can lift.
        cpu_start = time.process_time()
        deadline = start + seconds
        while True:
            fn()
            count += 1
            if time.perf_counter() >= deadline:
                break
        elapsed = time.perf_counter() - start
        cpu = time.process_time() - cpu_start
        queue.put(("ok", count, count * nbytes_per, elapsed, cpu))
    except Exception as e:  # reported to the parent
        queue.put(("error", repr(e), 0, 0.0, 0.0))


def run_workers(kind, port, op, key, clients, seconds, settings: Settings):
    ctx = mp.get_context("spawn")
    barrier = ctx.Barrier(clients)
    queue = ctx.Queue()
    workers = [
        ctx.Process(target=_worker, args=(kind, port, op, key, seconds, settings.worker_warmup_seconds, barrier, queue), daemon=True)
        for _ in range(clients)
    ]
    for w in workers:
        w.start()
    results = []
    try:
        for _ in workers:
            results.append(queue.get(timeout=seconds + 120))
    finally:
        for w in workers:
            w.join(timeout=10)
            if w.is_alive():
                w.kill()
                w.join()
    errors = [r[1] for r in results if r[0] != "ok"]
    if errors:
        raise RuntimeError(f"{kind} {op} worker failed: {errors[0]}")
    calls_per_s = sum(r[1] / r[3] for r in results)
    bytes_per_s = sum(r[2] / r[3] for r in results)
    client_cpu_per_call = sum(r[4] for r in results) / max(1, sum(r[1] for r in results))
    return calls_per_s, bytes_per_s, client_cpu_per_call


def measure_throughput(ports: dict, settings: Settings, log) -> dict:
    """results[(op, clients)][kind] = (calls/s, bytes/s)."""
    results: dict = {}
    key = shape_key(THROUGHPUT_SHAPE)
    for op, seconds in (("stream", settings.stream_seconds), ("tiny", settings.tiny_seconds)):
        for clients in (1, 4):
            row = {}
            for kind, port in ports.items():
                row[kind] = run_workers(kind, port, op, key, clients, seconds, settings)
            results[(op, clients)] = row
            log(
                f"  {op:6s} {clients} client(s)  "
                + "  ".join(f"{k}: {v[0]:9.0f} calls/s" + (f" {v[1] / MB:8.1f} MB/s" if op == "stream" else "") for k, v in row.items())
            )
    return results


# --------------------------------------------------------------------------- memory


def _storm_worker(port, wid, seconds, barrier, queue):
    try:
        system = FlightSystem(NODE, port)
        table = make_table(*THROUGHPUT_SHAPE, seed=100 + wid)
        ok = refused = other = 0
        first_other = ""
        barrier.wait(timeout=60)
        deadline = time.perf_counter() + seconds
        seq = 0
        while time.perf_counter() < deadline:
            seq += 1
            try:
                system.put(f"storm/{wid}/{seq}", table)
                ok += 1
            except (pa.ArrowException, OSError) as e:
                # pyarrow turns gRPC RESOURCE_EXHAUSTED into ArrowInvalid("gRPC returned
                # resource exhausted error, with message: ...")
                text = str(e)
                if "resource exhausted" in text.lower() or "RESOURCE_EXHAUSTED" in text:
                    refused += 1
                else:
                    other += 1
                    first_other = first_other or text[:300]
        queue.put(("ok", ok, refused, other, first_other))
    except Exception as e:
        queue.put(("error", repr(e), 0, 0, ""))


def measure_memory(procs: Processes, node_bin: str, settings: Settings, log) -> dict:
    out: dict = {}
    # 1. RSS vs held Arrow bytes
    port, node = start_node(procs, "node-mem", node_bin, settings.mem_budget, settings.mem_budget)
    pid = procs.procs["node-mem"].pid
    time.sleep(0.5)
    base = rss_bytes(pid)
    table = make_table(*THROUGHPUT_SHAPE, seed=42)
    entries = max(1, min(200, int(settings.mem_fill * settings.mem_budget / table.nbytes)))
    for i in range(entries):
        node.put(f"mem/{i}", table)
    time.sleep(1.0)
    stats = node.action_json("stats")
    rss = rss_bytes(pid)
    used = int(stats.get("usedBytes", 0))
    out["mem"] = dict(base=base, rss=rss, used=used, entries_put=entries, entries=stats.get("entries"),
                      budget=settings.mem_budget, entry_bytes=table.nbytes)
    log(f"  memory: base {base / MiB:.1f} MiB, rss {rss / MiB:.1f} MiB, used {used / MiB:.1f} MiB, entries {stats.get('entries')}")
    node.close()
    procs.stop("node-mem")

    # 2. put storm under a small budget
    max_entry = min(512 * MiB, settings.storm_budget)
    port, node = start_node(procs, "node-storm", node_bin, settings.storm_budget, max_entry)
    pid = procs.procs["node-storm"].pid
    time.sleep(0.5)
    base = rss_bytes(pid)
    ctx = mp.get_context("spawn")
    barrier = ctx.Barrier(settings.storm_clients + 1)
    queue = ctx.Queue()
    workers = [ctx.Process(target=_storm_worker, args=(port, w, settings.storm_seconds, barrier, queue), daemon=True)
               for w in range(settings.storm_clients)]
    for w in workers:
        w.start()
    samples = []
    results = []
    try:
        barrier.wait(timeout=120)
        t_end = time.perf_counter() + settings.storm_seconds + 1.0
        while time.perf_counter() < t_end:
            samples.append(rss_bytes(pid))
            time.sleep(0.1)
        for _ in workers:
            results.append(queue.get(timeout=120))
    finally:
        for w in workers:
            w.join(timeout=10)
            if w.is_alive():
                w.kill()
                w.join()
    errors = [r[1] for r in results if r[0] != "ok"]
    if errors:
        raise RuntimeError(f"storm worker failed: {errors[0]}")
    stats = node.action_json("stats")
    samples.append(rss_bytes(pid))
    ok = sum(r[1] for r in results)
    refused = sum(r[2] for r in results)
    other = sum(r[3] for r in results)
    first_other = next((r[4] for r in results if r[4]), "")
    out["storm"] = dict(base=base, clients=settings.storm_clients, max_rss=max(samples), budget=settings.storm_budget, max_entry=max_entry,
                        puts_ok=ok, refused=refused, other_errors=other, first_other=first_other,
                        used_after=int(stats.get("usedBytes", 0)), entries_after=stats.get("entries"),
                        seconds=settings.storm_seconds, samples=len(samples), entry_bytes=table.nbytes)
    log(f"  storm: base {base / MiB:.1f} MiB, max rss {max(samples) / MiB:.1f} MiB, puts ok {ok}, refused {refused}, other {other}")
    node.close()
    procs.stop("node-storm")
    return out


# --------------------------------------------------------------------------- rust client


def locate_calls_bin(override: str | None, log) -> str:
    """The Rust client (benches/flight_calls.rs): --calls-bin, else built (or found fresh)
    with `cargo bench --no-run` in the repository, in CARGO_TARGET_DIR (default: the
    target directory cache-node/bench/run builds the node in)."""
    if override:
        if not (os.path.isfile(override) and os.access(override, os.X_OK)):
            raise RuntimeError(f"--calls-bin {override} is not an executable file")
        return override
    env = dict(os.environ)
    if not env.get("CARGO_TARGET_DIR"):
        cache = env.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
        env["CARGO_TARGET_DIR"] = os.path.join(cache, "flightcache", "target")
    argv = ["cargo", "bench", "-p", "cache-node", "--bench", "flight_calls", "--no-run", "--message-format=json"]
    log(f"bench: building the Rust client: {' '.join(argv)} (CARGO_TARGET_DIR={env['CARGO_TARGET_DIR']})")
    # Built before any server starts; at the lowest priority so it never slows a
    # neighbour on a shared machine (CARGO_BUILD_JOBS limits its parallelism).
    nice = ["nice", "-n", "19"] if shutil.which("nice") else []
    try:
        proc = subprocess.run(nice + argv, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=None, text=True)
    except FileNotFoundError:
        raise RuntimeError("cargo not found: install Rust or pass --calls-bin PATH") from None
    exe = None
    for line in proc.stdout.splitlines():
        try:
            msg = json.loads(line)
        except ValueError:
            continue
        if msg.get("reason") == "compiler-artifact" and msg.get("target", {}).get("name") == "flight_calls":
            exe = msg.get("executable") or exe
    if proc.returncode != 0 or not exe:
        raise RuntimeError(f"building the Rust client failed (cargo exit code {proc.returncode}; no flight_calls executable reported)")
    return exe


def run_calls(calls_bin: str, args: list[str], timeout: float) -> dict:
    """Runs the Rust client once; its one JSON line as a dict."""
    argv = [calls_bin, *args]
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        raise RuntimeError(f"{' '.join(argv)} took more than {timeout:.0f} s") from None
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} exited with code {proc.returncode}: {proc.stderr.strip()}")
    lines = [line for line in proc.stdout.splitlines() if line.strip()]
    if not lines:
        raise RuntimeError(f"{' '.join(argv)} printed nothing")
    return json.loads(lines[-1])


def measure_rust(calls_bin: str, ports: dict, systems: dict, tables: dict, settings: Settings, log,
                 control_port: int | None = None) -> dict:
    """tiny[clients][kind] and hits[kind]["idle" | "load" | "load_niced" | "control"]: the Rust
    client's JSON lines. `load_niced`: the putter threads at nice 19, standing in for putters on
    other machines (on 2 shared cores their CPU otherwise delays the reader and the server);
    `control` (node only, needs `control_port`, a second node process): the same niced putters
    sending to that other process, so the machine carries the same put load and the node serving
    the hits none of it."""
    kinds = [k for k in (NODE, PYARROW) if k in ports]
    out: dict = {"tiny": {}, "hits": {}}
    for clients in (1, 4):
        row = {}
        for kind in kinds:
            row[kind] = run_calls(calls_bin, [
                "tiny", "--target", f"{HOST}:{ports[kind]}", "--clients", str(clients),
                "--seconds", str(settings.tiny_seconds), "--warmup-seconds", str(settings.worker_warmup_seconds),
            ], timeout=settings.tiny_seconds + 120)
        out["tiny"][clients] = row
        log(f"  tiny   {clients} client(s), Rust client  "
            + "  ".join(f"{k}: {v['calls_per_s']:9.0f} calls/s (p50 {v['p50_us']:.0f}µs, p99 {v['p99_us']:.0f}µs)" for k, v in row.items()))

    key = shape_key(HIT_SHAPE)
    table = tables[HIT_SHAPE]
    tickets = {}
    for kind in kinds:  # (re)store the entry the reader hits, and check it
        systems[kind].put(key, table)
        if not systems[kind].hit(key).equals(table):
            raise RuntimeError(f"{kind} returned a different table for {key}")
        tickets[kind] = (node_ticket(key) if kind == NODE else key.encode()).hex()
    rows, cols = THROUGHPUT_SHAPE
    # Idle first on every system, then under puts: a storm's leftovers (memory, evictions)
    # never precede an idle measurement.
    phases = (("idle", 0, []), ("load", settings.hits_putters, []),
              ("load_niced", settings.hits_putters, ["--putter-nice", "19"]))
    for phase, putters, extra in phases + (("control", settings.hits_putters, ["--putter-nice", "19"]),):
        for kind in kinds:
            if phase == "control":
                if kind != NODE or control_port is None:
                    continue
                extra = extra + ["--put-target", f"{HOST}:{control_port}"]
            res = run_calls(calls_bin, [
                "hits", "--target", f"{HOST}:{ports[kind]}", "--ticket-hex", tickets[kind],
                "--seconds", str(settings.hits_seconds), "--warmup-seconds", str(settings.worker_warmup_seconds),
                "--putters", str(putters), "--put-rows", str(rows), "--put-cols", str(cols),
                "--put-path-prefix", f"bench/rust-storm/{kind}", *extra,
            ], timeout=settings.hits_seconds + 300)
            if res.get("rows") != HIT_SHAPE[0]:
                raise RuntimeError(f"{kind}: the Rust client's hits returned {res.get('rows')} rows, not {HIT_SHAPE[0]}")
            out["hits"].setdefault(kind, {})[phase] = res
            log(f"  hits   {shape_name(HIT_SHAPE)} {phase:10s} ({putters} putters) {kind}: p50 {res['p50_us']:.0f}µs "
                f"p99 {res['p99_us']:.0f}µs p99.9 {res['p999_us']:.0f}µs n={res['hits']} puts {res['puts']} "
                f"(errors {res['put_errors']})")
    return out


# --------------------------------------------------------------------------- report


def us(v: float) -> str:
    return f"{v:,.0f}"


def verdict(ok: bool) -> str:
    return "PASS" if ok else "MISS"


def render(meta: dict, lat: dict, thr: dict, mem: dict | None, kinds: list[str], tables: dict,
           rust: dict | None = None) -> str:
    L: list[str] = []
    summary: list[tuple[str, str, str]] = []  # (target, figure, PASS/MISS)
    both = NODE in kinds and PYARROW in kinds
    L.append(f"Mode: {'quick' if meta['quick'] else 'full'} · {meta['date']} · {meta['machine']}")
    L.append("")
    L.append(f"Versions: {meta['versions']}")
    L.append("")
    L.append(f"Load average (1 min) at start {meta['load_start']}, at end {meta['load_end']} · bench time {meta['elapsed']:.0f} s")
    L.append("")

    def cell(op, shape, kind):
        s = lat.get(op, {}).get(shape, {}).get(kind)
        return f"{us(s.p(50))} / {us(s.p(99))}" if s else "n/a"

    if lat:
        L.append("Latency in µs (p50 / p99), Python client on loopback. `hit` = one DoGet with a ticket built from the key")
        L.append("(Redis: GET + IPC decode); `info+get` = GetFlightInfo + DoGet; `put` = DoPut of the whole table (Redis: IPC encode + SET).")
        L.append("")
    for op, title in (("hit", "hit"), ("info_get", "info+get"), ("put", "put")) if lat else ():
        op_kinds = [k for k in kinds if op != "info_get" or k != REDIS]
        if not op_kinds:
            continue
        head = ["shape", "Arrow bytes"] + [f"{LABELS[k]} {title}" for k in op_kinds]
        if both:
            head.append("node/pyarrow p50")
        if op == "hit" and NODE in kinds:
            if PYARROW in kinds:
                head.append("target ≤ 0.67× pyarrow")
            if REDIS in kinds:
                head.append("target ≤ Redis+IPC")
        L.append("| " + " | ".join(head) + " |")
        L.append("|" + "|".join(["---"] * len(head)) + "|")
        for shape in SHAPES:
            row = [shape_name(shape), f"{tables[shape].nbytes:,}"] + [cell(op, shape, k) for k in op_kinds]
            if both:
                row.append(f"{lat[op][shape][NODE].p(50) / lat[op][shape][PYARROW].p(50):.2f}×")
            if op == "hit" and NODE in kinds:
                n = lat[op][shape][NODE].p(50)
                if PYARROW in kinds:
                    p = lat[op][shape][PYARROW].p(50)
                    v = verdict(n <= 0.67 * p)
                    row.append(f"{v} ({n / p:.2f}×)")
                    summary.append((f"hit p50 {shape_name(shape)} ≤ 0.67× pyarrow", f"{us(n)} vs {us(p)} µs ({n / p:.2f}×)", v))
                if REDIS in kinds:
                    r = lat[op][shape][REDIS].p(50)
                    if shape in REDIS_TARGET_SHAPES:
                        v = verdict(n <= r)
                        row.append(f"{v} ({n / r:.2f}×)")
                        summary.append((f"hit p50 {shape_name(shape)} ≤ Redis+IPC", f"{us(n)} vs {us(r)} µs ({n / r:.2f}×)", v))
                    else:
                        row.append(f"— ({n / r:.2f}×)")
            L.append("| " + " | ".join(row) + " |")
        L.append("")

    if lat and NODE in kinds:
        # The node's own tail, per RPC and shape (what docs/performance.md sizes from);
        # p99.9 of a cell with fewer than 1,000 calls is its maximum.
        L.append("flightcache-node latency in µs per RPC and shape, p50 / p95 / p99 / p99.9 (n calls):")
        L.append("")
        L.append("| RPC | shape | Arrow bytes | p50 | p95 | p99 | p99.9 | n |")
        L.append("|---|---|---|---:|---:|---:|---:|---:|")
        for op, title in (("hit", "DoGet hit"), ("info_get", "GetFlightInfo + DoGet"), ("put", "DoPut")):
            for shape in SHAPES:
                s = lat.get(op, {}).get(shape, {}).get(NODE)
                if not s:
                    continue
                L.append(f"| {title} | {shape_name(shape)} | {tables[shape].nbytes:,} | "
                         + " | ".join(us(s.p(q)) for q in (50, 95, 99, 99.9)) + f" | {len(s.ns):,} |")
        L.append("")

    if lat and both and "hit" in lat:
        # The client's own CPU per hit bounds how fast any server can look: a server that
        # answered in zero time would still leave the client this much work per call.
        L.append("Client CPU per hit: median CPU time of the client process (all its threads, gRPC's included) per")
        L.append("DoGet + read_all, from the latency runs above. `floor / pyarrow p50` is that CPU for the node's answer")
        L.append("over the pyarrow server's p50: above 0.67 the 0.67× target cannot be met by any server with this client.")
        L.append("")
        L.append("| shape | client CPU µs, node hit | client CPU µs, pyarrow hit | floor / pyarrow p50 |")
        L.append("|---|---|---|---|")
        for shape in SHAPES:
            n_cell, p_cell = lat["hit"][shape][NODE], lat["hit"][shape][PYARROW]
            floor = n_cell.cpu_median_us() / p_cell.p(50) if p_cell.p(50) else 0.0
            L.append(f"| {shape_name(shape)} | {us(n_cell.cpu_median_us())} | {us(p_cell.cpu_median_us())} | {floor:.2f} |")
        L.append("")

    if thr:
        L.append(f"Throughput: {shape_name(THROUGHPUT_SHAPE)} ({tables[THROUGHPUT_SHAPE].nbytes:,} Arrow bytes) read in a loop (one DoGet; Redis: GET + decode)")
        L.append("by N client processes; tiny calls = DoAction `ping` (Redis: PING). MB = 10^6 bytes of Arrow data received.")
        L.append("")
        head = ["measure"] + [LABELS[k] for k in kinds] + (["target", "result"] if both else [])
        L.append("| " + " | ".join(head) + " |")
        L.append("|" + "|".join(["---"] * len(head)) + "|")
        for (op, clients), row in thr.items():
            plural = "s" if clients > 1 else ""
            if op == "stream":
                name = f"read MB/s, {clients} client{plural}"
                vals = [f"{row[k][1] / MB:,.0f}" for k in kinds]
                extra = ["—", "—"] if both else []
            else:
                name = f"tiny calls/s, {clients} client{plural}"
                vals = [f"{row[k][0]:,.0f}" for k in kinds]
                extra = []
                if both:
                    ratio = row[NODE][0] / row[PYARROW][0]
                    v = verdict(ratio >= 3.0)
                    extra = ["≥ 3× pyarrow", f"{v} ({ratio:.2f}×)"]
                    summary.append((f"tiny calls/s, {clients} client{plural} ≥ 3× pyarrow (Python client)",
                                    f"{row[NODE][0]:,.0f} vs {row[PYARROW][0]:,.0f} ({ratio:.2f}×)", v))
            L.append("| " + " | ".join([name] + vals + extra) + " |")
            if op == "tiny":
                # What the client processes themselves burn per call, and the calls/s
                # they could make if the server answered in zero time on this machine.
                cores = os.cpu_count() or 1
                cpu = [f"{row[k][2] * 1e6:,.0f}" for k in kinds]
                L.append("| " + " | ".join([f"client CPU µs per call, {clients} client{plural}"] + cpu
                                            + (["—", "—"] if both else [])) + " |")
                ceiling = [f"{min(clients, cores) / row[k][2]:,.0f}" if row[k][2] > 0 else "—" for k in kinds]
                L.append("| " + " | ".join([f"client-bound ceiling calls/s, {clients} client{plural}"] + ceiling
                                            + (["—", "—"] if both else [])) + " |")
        L.append("")

    if rust:
        render_rust(L, summary, rust, tables)

    if mem:
        m, s = mem["mem"], mem["storm"]
        L.append("Node memory: RSS = VmRSS from /proc/PID/status; used = stats `usedBytes` (Arrow bytes held); base = RSS of the same node, empty.")
        L.append("")
        L.append("| measure | figures | target | result |")
        L.append("|---|---|---|---|")
        limit = 1.05 * m["used"] + m["base"]
        v = verdict(m["rss"] <= limit)
        L.append(f"| RSS vs held bytes: budget {m['budget'] // MiB} MiB, {m['entries_put']} puts of {shape_name(THROUGHPUT_SHAPE)} "
                 f"→ {m['entries']} entries | RSS {m['rss'] / MiB:,.1f} MiB, used {m['used'] / MiB:,.1f} MiB, base {m['base'] / MiB:,.1f} MiB; "
                 f"RSS/used {m['rss'] / max(1, m['used']):.3f}, (RSS−base)/used {(m['rss'] - m['base']) / max(1, m['used']):.3f} "
                 f"| RSS ≤ 1.05×used + base = {limit / MiB:,.1f} MiB | {v} |")
        summary.append(("RSS ≤ 1.05×used + base", f"{m['rss'] / MiB:,.1f} MiB vs {limit / MiB:,.1f} MiB", v))
        limit = s["budget"] + s["base"]
        v = verdict(s["max_rss"] <= limit)
        L.append(f"| put storm: {s['clients']} processes putting distinct keys of {shape_name(THROUGHPUT_SHAPE)} for {s['seconds']:.0f} s, "
                 f"budget {s['budget'] // MiB} MiB (max entry {s['max_entry'] // MiB} MiB), RSS sampled every 100 ms ({s['samples']} samples) "
                 f"| max RSS {s['max_rss'] / MiB:,.1f} MiB (base {s['base'] / MiB:,.1f} MiB); puts ok {s['puts_ok']:,}, "
                 f"RESOURCE_EXHAUSTED {s['refused']:,}, other errors {s['other_errors']:,}; afterwards used {s['used_after'] / MiB:,.1f} MiB "
                 f"in {s['entries_after']} entries | max RSS ≤ budget + base = {limit / MiB:,.1f} MiB | {v} |")
        summary.append(("storm max RSS ≤ budget + base", f"{s['max_rss'] / MiB:,.1f} MiB vs {limit / MiB:,.1f} MiB", v))
        if s["first_other"]:
            L.append("")
            L.append(f"First put error in the storm other than RESOURCE_EXHAUSTED: `{s['first_other']}`")
        L.append("")

    if summary:
        passed = sum(1 for _, _, v in summary if v == "PASS")
        L.append(f"Targets: {passed} of {len(summary)} met.")
        L.append("")
        L.append("| target | figure | result |")
        L.append("|---|---|---|")
        for target, figure, v in summary:
            L.append(f"| {target} | {figure} | {v} |")
        L.append("")
    return "\n".join(L)


def render_rust(L: list[str], summary: list, rust: dict, tables: dict) -> None:
    """The Rust client's section of the report, and its two targets in the summary."""
    tiny, hits = rust["tiny"], rust["hits"]
    kinds = [k for k in (NODE, PYARROW) if k in hits]
    both = NODE in kinds and PYARROW in kinds

    def ratio(a: float, b: float) -> str:
        return f"{a / b:.2f}×" if b else "—"

    L.append("Rust client (cache-node/benches/flight_calls.rs, tokio + tonic, one HTTP/2 connection per client): tiny calls =")
    L.append("DoAction `ping` in a loop by N concurrent clients; client CPU = CPU time of the client process (all threads) per call.")
    L.append("")
    head = ["measure"] + [LABELS[k] for k in kinds] + ["node/pyarrow", "target", "result"]
    L.append("| " + " | ".join(head) + " |")
    L.append("|" + "|".join(["---"] * len(head)) + "|")
    verdicts, figures = [], []
    for clients, row in tiny.items():
        plural = "s" if clients > 1 else ""
        vals = [f"{row[k]['calls_per_s']:,.0f}" for k in kinds]
        if both:
            r = row[NODE]["calls_per_s"] / row[PYARROW]["calls_per_s"] if row[PYARROW]["calls_per_s"] else 0.0
            v = verdict(r >= 3.0)
            verdicts.append(v)
            figures.append(f"{clients} client{plural}: {row[NODE]['calls_per_s']:,.0f} vs {row[PYARROW]['calls_per_s']:,.0f} ({r:.2f}×)")
            extra = [f"{r:.2f}×", "≥ 3× pyarrow", v]
        else:
            extra = ["—", "≥ 3× pyarrow", "—"]
        L.append("| " + " | ".join([f"tiny calls/s, {clients} client{plural}"] + vals + extra) + " |")
        lat = [f"{us(row[k]['p50_us'])} / {us(row[k]['p99_us'])}" for k in kinds]
        p50 = ratio(row[NODE]["p50_us"], row[PYARROW]["p50_us"]) if both else "—"
        L.append("| " + " | ".join([f"call µs p50 / p99, {clients} client{plural}"] + lat + [p50, "—", "—"]) + " |")
        cpu = [f"{row[k]['client_cpu_us_per_call']:,.1f}" if row[k].get("client_cpu_us_per_call") is not None else "n/a"
               for k in kinds]
        L.append("| " + " | ".join([f"client CPU µs per call, {clients} client{plural}"] + cpu + ["—", "—", "—"]) + " |")
    L.append("")
    if both and verdicts:
        v = "PASS" if all(x == "PASS" for x in verdicts) else "MISS"
        summary.append(("tiny calls ≥ 3× pyarrow (Rust client), 1 and 4 clients", "; ".join(figures), v))

    putters = next((h["load"]["putters"] for h in hits.values() if "load" in h), 4)
    L.append(f"Hits under puts, Rust client: one reader does DoGet of {shape_name(HIT_SHAPE)} ({tables[HIT_SHAPE].nbytes:,} Arrow bytes)")
    L.append(f"one call at a time on its own connection and thread; `under puts` = while {putters} clients (own connections) DoPut")
    L.append(f"{shape_name(THROUGHPUT_SHAPE)} tables under distinct keys continuously (measured once each has finished one put). µs, exact percentiles.")
    L.append("")
    head = ["system", "idle p50 / p99 / p99.9 (n)", f"under {putters} putters p50 / p99 / p99.9 (n)", "max µs idle / under",
            "puts during (errors)", "p99 under / idle", "target", "result"]
    L.append("| " + " | ".join(head) + " |")
    L.append("|" + "|".join(["---"] * len(head)) + "|")
    ratios = {}
    for kind in kinds:
        idle, load = hits[kind]["idle"], hits[kind]["load"]
        r = load["p99_us"] / idle["p99_us"] if idle["p99_us"] else float("inf")
        ratios[kind] = r
        cells = [f"{us(x['p50_us'])} / {us(x['p99_us'])} / {us(x['p999_us'])} ({x['hits']:,})" for x in (idle, load)]
        puts = f"{load['puts']:,} ({load['put_errors']:,})"
        if kind == NODE:
            tv = ["≤ 1.5× idle", verdict(r <= 1.5)]
        else:
            tv = ["reference", "—"]
        L.append("| " + " | ".join([LABELS[kind]] + cells + [f"{us(idle['max_us'])} / {us(load['max_us'])}", puts, f"{r:.2f}×"] + tv) + " |")
    L.append("")
    phases = [("idle", "idle"), ("load", f"{putters} putters, same priority as the reader"),
              ("load_niced", f"{putters} putters at nice 19 (as if on other machines)"),
              ("control", f"control: the same niced putters sending to another node process")]
    if any(phase in hits[k] for k in kinds for phase, _ in phases[2:]):
        L.append("Where a hit's time goes under puts: the same reader with the putters' CPU out of the way (nice 19), and with")
        L.append("their puts sent to another node process on the same cores (the control: what the machine's load alone costs).")
        L.append("")
        head = ["hits of " + shape_name(HIT_SHAPE)] + [f"{LABELS[k]} p50 / p95 / p99 / p99.9" for k in kinds] + \
               [f"{LABELS[k]} p99 / idle p99" for k in kinds] + ["puts during"]
        L.append("| " + " | ".join(head) + " |")
        L.append("|" + "|".join(["---"] * len(head)) + "|")
        for phase, title in phases:
            cells, ratio_cells, puts = [], [], []
            for k in kinds:
                x = hits[k].get(phase)
                if x is None:
                    cells.append("—")
                    ratio_cells.append("—")
                    continue
                cells.append(f"{us(x['p50_us'])} / {us(x['p95_us'])} / {us(x['p99_us'])} / {us(x['p999_us'])}")
                idle_p99 = hits[k]["idle"]["p99_us"]
                ratio_cells.append(f"{x['p99_us'] / idle_p99:.2f}×" if idle_p99 else "—")
                puts.append(f"{LABELS[k]} {x['puts']:,} ({x['put_errors']:,} errors)")
            L.append("| " + " | ".join([title] + cells + ratio_cells + ["; ".join(puts) or "—"]) + " |")
        L.append("")
    errors = [(k, hits[k][phase]["put_error_first"]) for k in kinds for phase in ("load", "load_niced", "control")
              if hits[k].get(phase, {}).get("put_error_first")]
    for kind, text in errors:
        L.append(f"First put error from the putters against {LABELS[kind]}: `{text}`")
        L.append("")
    if NODE in kinds:
        idle, load = hits[NODE]["idle"], hits[NODE]["load"]
        ref = f"; pyarrow server {ratios[PYARROW]:.2f}×" if PYARROW in ratios else "; pyarrow server —"
        niced = hits[NODE].get("load_niced")
        niced_text = (f"; putters at nice 19: {us(niced['p99_us'])} µs ({niced['p99_us'] / idle['p99_us']:.2f}×)"
                      if niced and idle["p99_us"] else "")
        summary.append((f"hit p99 under {putters} putters ≤ 1.5× idle p99 (node)",
                        f"{us(load['p99_us'])} vs {us(idle['p99_us'])} µs ({ratios[NODE]:.2f}×){ref}{niced_text}",
                        verdict(ratios[NODE] <= 1.5)))


# --------------------------------------------------------------------------- main


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def load1() -> str:
    try:
        return open("/proc/loadavg").read().split()[0]
    except OSError:
        return "?"


def tool_version(argv: list[str]) -> str:
    try:
        out = subprocess.run(argv, capture_output=True, text=True, timeout=10)
        return (out.stdout or out.stderr).strip().splitlines()[0]
    except Exception:
        return "unknown"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--node-bin", help="flightcache-node binary (release build)")
    parser.add_argument("--redis-bin", default="redis-server")
    parser.add_argument("--systems", default="node,pyarrow,redis", help="comma list of node, pyarrow, redis")
    parser.add_argument("--quick", action="store_true", help="short run (~1-2 min) for CI smoke")
    parser.add_argument("--parts", default=",".join(PARTS),
                        help="comma list of latency, throughput, memory, rust (default: all)")
    parser.add_argument("--calls-bin", help="the Rust client (benches/flight_calls.rs) to use instead of building it")
    parser.add_argument("--out", help="also write the markdown table to this file")
    parser.add_argument("--pidfile", help="keep the PIDs of the started servers in this file")
    parser.add_argument("--workdir", help="server logs go here (default: a temporary directory)")
    args = parser.parse_args()

    kinds = [k for k in (NODE, PYARROW, REDIS) if k in args.systems.split(",")]
    if NODE in kinds and not args.node_bin:
        parser.error("--node-bin is required when the node is benchmarked")
    parts = set(args.parts.split(","))
    if parts - set(PARTS):
        parser.error(f"unknown part(s) in --parts: {sorted(parts - set(PARTS))}")
    settings = Settings.make(args.quick)
    workdir = args.workdir or tempfile.mkdtemp(prefix="flightcache-bench-")
    os.makedirs(workdir, exist_ok=True)
    procs = Processes(workdir, args.pidfile)
    atexit.register(procs.stop_all)

    def on_signal(signum, frame):
        raise SystemExit(128 + signum)

    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, on_signal)

    def log(msg: str) -> None:
        print(msg, file=sys.stderr, flush=True)

    calls_bin = None  # built before the clock and the load average start
    if "rust" in parts:
        if NODE in kinds or PYARROW in kinds:
            calls_bin = locate_calls_bin(args.calls_bin, log)
            log(f"bench: Rust client {calls_bin}")
        else:
            log("bench: part rust skipped: it measures the Flight servers (node, pyarrow) only")

    started = time.monotonic()
    load_start = load1()
    try:
        log(f"bench: building tables; server logs in {workdir}")
        tables = {shape: make_table(*shape) for shape in SHAPES}

        ports, systems = {}, {}
        if NODE in kinds:
            port, sysm = start_node(procs, "node", args.node_bin, 2 << 30, 512 * MiB)
            ports[NODE], systems[NODE] = port, sysm
        if PYARROW in kinds:
            port = free_port()
            procs.start("pyarrow", [sys.executable, os.path.join(HERE, "pyarrow_server.py"), "--port", str(port)])
            ports[PYARROW], systems[PYARROW] = port, wait_ready(procs, "pyarrow", PYARROW, port)
        if REDIS in kinds:
            port = free_port()
            procs.start("redis", [args.redis_bin, "--bind", HOST, "--port", str(port), "--save", "", "--appendonly", "no",
                                  "--dir", workdir, "--daemonize", "no", "--protected-mode", "yes"])
            ports[REDIS], systems[REDIS] = port, wait_ready(procs, "redis", REDIS, port)
        log(f"bench: servers up: {ports}")

        for kind, system in systems.items():  # load and check every table
            for shape, table in tables.items():
                system.put(shape_key(shape), table)
                got = system.hit(shape_key(shape))
                if not got.equals(table):
                    raise RuntimeError(f"{kind} returned a different table for {shape_key(shape)}")
                if kind != REDIS and not system.info_get(shape_key(shape)).equals(table):
                    raise RuntimeError(f"{kind} GetFlightInfo + DoGet returned a different table for {shape_key(shape)}")
        if NODE in systems:
            stats = systems[NODE].action_json("stats")
            log(f"bench: node stats after load: {stats}")

        lat, thr = {}, {}
        if "latency" in parts:
            log("bench: latency")
            lat = measure_latency(systems, tables, settings, log)
        if "throughput" in parts:
            log("bench: throughput")
            thr = measure_throughput(ports, settings, log)
        rust = None
        if calls_bin:
            log("bench: Rust client")
            control_port = None
            if NODE in ports:  # a second node: where the control's puts go
                control_port, control = start_node(procs, "node-control", args.node_bin, 2 << 30, 512 * MiB)
                control.close()
            rust = measure_rust(calls_bin, ports, systems, tables, settings, log, control_port)
            if control_port is not None:
                procs.stop("node-control")
        for system in systems.values():
            system.close()
        for kind in list(ports):
            procs.stop(kind)

        mem = None
        if NODE in kinds and "memory" in parts:
            log("bench: node memory")
            mem = measure_memory(procs, args.node_bin, settings, log)

        versions = [f"pyarrow {pa.__version__}", f"Python {platform.python_version()}"]
        try:
            import redis

            versions.append(f"redis-py {redis.__version__}")
        except ImportError:
            pass
        if REDIS in kinds:
            versions.append(tool_version([args.redis_bin, "--version"]))
        if NODE in kinds:
            commit = tool_version(["git", "-C", HERE, "describe", "--always", "--dirty"])
            versions.append(f"{tool_version([args.node_bin, '--version'])} (work tree {commit})")
        meta = dict(
            quick=settings.quick,
            date=dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
            machine=f"{os.cpu_count()} cores, {cpu_model()}, {platform.system()} {platform.release()}",
            versions=", ".join(versions),
            load_start=load_start,
            load_end=load1(),
            elapsed=time.monotonic() - started,
        )
        report = render(meta, lat, thr, mem, kinds, tables, rust)
        print(report)
        if args.out:
            with open(args.out, "w") as f:
                f.write(report + "\n")
        return 0
    finally:
        procs.stop_all()


if __name__ == "__main__":
    sys.exit(main())
