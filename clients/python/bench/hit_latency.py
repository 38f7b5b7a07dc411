"""Hit latency through the ring-aware ``flightcache`` client against plain
``pyarrow.flight`` through one node, side by side in one run, on a local pool of 3 nodes.

    FLIGHTCACHE_NODE_BIN=.../flightcache-node python clients/python/bench/hit_latency.py

What a Kubernetes Service gives a plain Flight client is one connection to one pod: that
pod serves the keys it owns and forwards every other key's DoGet to its owner, so with N
nodes about (N-1)/N of the hits take an extra hop. The ``flightcache`` client reads the
ring and dials each key's owner. This program measures both on real nodes:

1. Starts 3 ``flightcache-node`` processes on 127.0.0.1 (free ports) sharing one static
   topology (members ``local-0`` … ``local-2``), as ``cache-node/scripts/local-cluster``
   forms it, with its glibc settings, and with a client, an admin and a peer token, as
   the operator configures a pod. Logs go to a temporary directory (kept on failure).
2. Puts K keys of each size through the client: ``--small-keys`` (2,000) tables of
   100 rows x 4 columns and ``--large-keys`` (300) of 29,000 x 4 (about 1 MiB of Arrow),
   columns int64, float64, timestamp[us], utf8.
3. Warm-up: every key read once by every path (and compared with the table put).
4. Rounds of ``--round`` keys (100): path (a), ``flightcache.connect(local-0).get(key)``,
   and path (b), a ``pyarrow.flight.FlightClient`` on local-0 (the documented client
   settings, ``generic_options``, as for a Service) doing ``do_get`` of the key's ticket
   (``flightcache.to_key(key).ticket``) with the same token, read the same keys in the
   same order; which path goes first alternates every round (a b, b a, …), so the
   machine's noise hits both alike. Each get is timed with ``time.perf_counter_ns`` around the
   call and ``read_all``; the check of its rows comes after the clock stops. With
   ``--control``, a third path takes its turn in each round: plain pyarrow to each key's
   owner (one ``FlightClient`` per node, the owner looked up before the clock starts), which
   splits what the client saves (the hop) from what it costs (its own Python per call).
5. Between paths, the nodes' ``/metrics`` are read: the forwarded share of a path's gets
   is the growth of ``flightcache_node_doget_seconds_count{outcome="forwarded_hit"}``
   summed over the nodes (docs/metrics.md: a DoGet relayed from the owner), shown beside
   ``flightcache_node_forwarded_total{grpc_method="DoGet"}``, over the path's gets.

Prints a markdown table (p50, p90, p99, mean per size and path; the forwarded share), the
ratio of the plain path to the client, and each path's p50 over the keys local-0 owns and
over the others. Exit status 1 if the run is invalid: a get failed, missed, or returned
other rows than were put; the client held no 3-member ring, fell back to the seed or had
a get forwarded (the control too); or the forwarded count of the plain path is not the
number of its gets of keys local-0 does not own. Never on a speed threshold. The
nodes are stopped by PID (SIGTERM, SIGKILL after 30 s) on exit, Ctrl-C or SIGTERM.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import platform
import random
import re
import secrets
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pyarrow as pa
import pyarrow.flight as flight

import flightcache
from flightcache import settings

MEMBERS = 3
FIXED = "local-0"
SMALL_ROWS = 100
LARGE_ROWS = 29_000
BASE_TIME = datetime(2026, 1, 1)


# -- the pool ----------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _die_with_parent() -> None:
    """In the child before exec: SIGTERM when this program dies, even by SIGKILL (Linux
    PR_SET_PDEATHSIG), so no node outlives the bench."""
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)
    except OSError:
        pass


@dataclass
class Node:
    member: str
    port: int
    metrics_port: int
    proc: subprocess.Popen

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def metrics(self) -> str:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=5) as r:
            return r.read().decode()


@dataclass
class Pool:
    directory: Path
    token: str
    nodes: list[Node] = field(default_factory=list)

    def stop(self) -> None:
        """SIGTERM every node we started, by PID; SIGKILL one that has not exited in 30 s."""
        for node in self.nodes:
            if node.proc.poll() is None:
                node.proc.send_signal(signal.SIGTERM)
        for node in self.nodes:
            try:
                node.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                node.proc.kill()
                node.proc.wait()


def start_pool(binary: str, directory: Path) -> Pool:
    """Three nodes `local-i` sharing topology version 1, with client, admin and peer
    tokens, waiting until each accepts connections."""
    token = secrets.token_hex(16)
    for name, value in [("client-token", token), ("admin-token", secrets.token_hex(16)),
                        ("peer-token", secrets.token_hex(16))]:
        (directory / name).write_text(value + "\n")
    ports = [free_port() for _ in range(MEMBERS)]
    members = [{"id": f"local-{i}", "address": f"127.0.0.1:{p}"} for i, p in enumerate(ports)]
    (directory / "topology.json").write_text(json.dumps({"version": 1, "members": members}))
    env = dict(os.environ, MALLOC_ARENA_MAX="2", MALLOC_MMAP_THRESHOLD_="131072")
    pool = Pool(directory, token)
    try:
        for i, port in enumerate(ports):
            metrics_port = free_port()
            with open(directory / f"local-{i}.log", "ab") as log:
                proc = subprocess.Popen(
                    [binary, "--member-id", f"local-{i}", "--topology", str(directory / "topology.json"),
                     "--listen", f"127.0.0.1:{port}", "--metrics-listen", f"127.0.0.1:{metrics_port}",
                     "--memory-budget", "1GiB",
                     "--auth-token-file", str(directory / "client-token"),
                     "--admin-token-file", str(directory / "admin-token"),
                     "--peer-token-file", str(directory / "peer-token")],
                    stdout=subprocess.DEVNULL, stderr=log, env=env, preexec_fn=_die_with_parent)
            pool.nodes.append(Node(f"local-{i}", port, metrics_port, proc))
        for node in pool.nodes:
            wait_listening(node)
    except BaseException:
        pool.stop()
        raise
    return pool


def wait_listening(node: Node) -> None:
    deadline = time.monotonic() + 30
    while True:
        if node.proc.poll() is not None:
            raise RuntimeError(f"node {node.member} exited with {node.proc.returncode}")
        try:
            socket.create_connection(("127.0.0.1", node.port), timeout=0.2).close()
            return
        except OSError:
            if time.monotonic() > deadline:
                raise RuntimeError(f"node {node.member} did not listen within 30 s") from None
            time.sleep(0.05)


# -- the nodes' counters -----------------------------------------------------------------

_SERIES = re.compile(r"^(\w+)(?:\{([^}]*)\})? (\S+)$", re.M)


def counter(text: str, name: str, **labels: str) -> float:
    """The sum of the series of `name` whose labels include `labels`."""
    total = 0.0
    for metric, label_text, value in _SERIES.findall(text):
        if metric != name:
            continue
        series = dict(re.findall(r'(\w+)="([^"]*)"', label_text))
        if all(series.get(k) == v for k, v in labels.items()):
            total += float(value)
    return total


@dataclass(frozen=True)
class Forwarded:
    """Pool-wide DoGet forwarding counters at one moment."""

    forwarded_hits: float
    relayed_dogets: float

    def __sub__(self, other: Forwarded) -> Forwarded:
        return Forwarded(self.forwarded_hits - other.forwarded_hits,
                         self.relayed_dogets - other.relayed_dogets)

    def __add__(self, other: Forwarded) -> Forwarded:
        return Forwarded(self.forwarded_hits + other.forwarded_hits,
                         self.relayed_dogets + other.relayed_dogets)


def read_forwarded(pool: Pool) -> Forwarded:
    texts = [node.metrics() for node in pool.nodes]
    return Forwarded(
        sum(counter(t, "flightcache_node_doget_seconds_count", outcome="forwarded_hit") for t in texts),
        sum(counter(t, "flightcache_node_forwarded_total", grpc_method="DoGet") for t in texts))


def build_info(pool: Pool) -> str:
    match = re.search(r"^flightcache_node_build_info\{([^}]*)\}", pool.nodes[0].metrics(), re.M)
    return match.group(1) if match else "unknown"


# -- the entries -------------------------------------------------------------------------


def table(rows: int, seed: int) -> pa.Table:
    """`rows` x 4 (int64, float64, timestamp[us], utf8 of 8 characters); `id` starts at
    `seed`, so the first and last id name the key it was put under."""
    return pa.table({
        "id": pa.array(range(seed, seed + rows), pa.int64()),
        "amount": pa.array([i * 0.25 for i in range(rows)], pa.float64()),
        "at": pa.array([BASE_TIME + timedelta(seconds=i) for i in range(rows)], pa.timestamp("us")),
        "region": pa.array([f"r{(seed + i) % 9973:07d}" for i in range(rows)], pa.utf8()),
    })


@dataclass(frozen=True)
class Size:
    name: str
    rows: int
    keys: list[str]
    arrow_bytes: int

    def seed(self, index: int) -> int:
        """The first id of the table put under key `index`."""
        return index * 1_000_000


def put_entries(cache: flightcache.Client, label: str, rows: int, count: int) -> Size:
    size = Size(f"{rows:,} x 4", rows, [f"bench/hit-latency/{label}/{i}" for i in range(count)],
                table(rows, 0).nbytes)
    for i, key in enumerate(size.keys):
        result = cache.put(key, table(rows, size.seed(i)))
        if result.rows != rows:
            raise RuntimeError(f"put {key}: the node stored {result.rows} rows, not {rows}")
    return size


def wrong_rows(got: pa.Table | None, size: Size, index: int) -> str | None:
    """Why `got` is not the table put under key `index` (None: it is). A cheap check,
    made after the clock stops: row and column counts and the first and last id, which
    name the key. (The warm-up compares whole tables.)"""
    if got is None:
        return "a miss"
    if got.num_rows != size.rows or got.num_columns != 4:
        return f"{got.num_rows} rows x {got.num_columns}"
    ids = got.column("id")
    first, last = ids[0].as_py(), ids[size.rows - 1].as_py()
    if first != size.seed(index) or last != size.seed(index) + size.rows - 1:
        return f"ids {first}..{last}, another key's rows"
    return None


# -- the paths ---------------------------------------------------------------------------


@dataclass
class ReadPath:
    name: str
    read: Callable[[str], pa.Table | None]
    samples_ns: list[int] = field(default_factory=list)
    #: The key index of each sample, in the same order.
    sample_keys: list[int] = field(default_factory=list)
    forwarded: Forwarded = field(default_factory=lambda: Forwarded(0.0, 0.0))
    failures: list[str] = field(default_factory=list)


def timed_gets(path: ReadPath, size: Size, indices: list[int]) -> None:
    for index in indices:
        key = size.keys[index]
        started = time.perf_counter_ns()
        try:
            got = path.read(key)
        except Exception as err:  # a failed get makes the run invalid; keep measuring
            path.failures.append(f"{key}: {type(err).__name__}: {err}")
            continue
        path.samples_ns.append(time.perf_counter_ns() - started)
        path.sample_keys.append(index)
        problem = wrong_rows(got, size, index)
        if problem:
            path.failures.append(f"{key}: {problem}")


def measure(pool: Pool, size: Size, paths: list[ReadPath], gets: int, round_len: int,
            rng: random.Random) -> list[int]:
    """`gets` gets per path: passes over the keys in a shuffled order, cut into rounds of
    `round_len`; every path reads each round's keys in turn, the first turn moving on by
    one path every round (a b, b a, … or a b c, b c a, c a b, …); the pool's forwarding
    counters are read around each path's turn."""
    order: list[int] = []
    while len(order) < gets:
        one_pass = list(range(len(size.keys)))
        rng.shuffle(one_pass)
        order += one_pass
    order = order[:gets]
    for number, start in enumerate(range(0, gets, round_len)):
        indices = order[start:start + round_len]
        first = number % len(paths)
        for path in paths[first:] + paths[:first]:
            before = read_forwarded(pool)
            timed_gets(path, size, indices)
            path.forwarded = path.forwarded + (read_forwarded(pool) - before)
    return order


def warm_up(size: Size, paths: list[ReadPath]) -> list[str]:
    """Every key read once by each path and compared with the table put (opens every
    channel); returns the problems."""
    problems = []
    for index, key in enumerate(size.keys):
        expected = table(size.rows, size.seed(index))
        for path in paths:
            try:
                got = path.read(key)
            except Exception as err:
                problems.append(f"warm-up {path.name} {key}: {type(err).__name__}: {err}")
                continue
            if got is None or not got.equals(expected):
                problems.append(f"warm-up {path.name} {key}: not the table put")
    return problems


# -- the report --------------------------------------------------------------------------


def pct(samples_ns: list[int], q: float) -> float:
    """The q-quantile (nearest rank) in ms."""
    ordered = sorted(samples_ns)
    return ordered[min(len(ordered) - 1, max(0, round(q * len(ordered)) - 1))] / 1e6


def ms(value: float) -> str:
    return f"{value:.3f}"


def machine() -> str:
    model = "unknown CPU"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"{os.cpu_count()} cores ({model}), Linux {platform.release()}"


def report_rows(size: Size, paths: list[ReadPath]) -> list[str]:
    rows = []
    for path in paths:
        s = path.samples_ns
        if not s:
            rows.append(f"| {size.name} | {path.name} | 0 | – | – | – | – | – |")
            continue
        share = path.forwarded.forwarded_hits / len(s)
        rows.append(
            f"| {size.name} ({size.arrow_bytes:,} B) | {path.name} | {len(s):,} | {ms(pct(s, 0.5))} | "
            f"{ms(pct(s, 0.9))} | {ms(pct(s, 0.99))} | {ms(statistics.fmean(s) / 1e6)} | "
            f"{path.forwarded.forwarded_hits:,.0f} ({share:.1%}); relayed {path.forwarded.relayed_dogets:,.0f} |")
    return rows


def ratio_row(size: Size, client: ReadPath, plain: ReadPath) -> str:
    if not client.samples_ns or not plain.samples_ns:
        return f"| {size.name} | – | – | – | – |"
    cells = [pct(plain.samples_ns, q) / pct(client.samples_ns, q) for q in (0.5, 0.9, 0.99)]
    mean = statistics.fmean(plain.samples_ns) / statistics.fmean(client.samples_ns)
    return f"| {size.name} | " + " | ".join(f"{c:.2f}x" for c in cells) + f" | {mean:.2f}x |"


def split_rows(size: Size, paths: list[ReadPath], owned: set[int]) -> list[str]:
    """p50 of each path over the keys FIXED owns (every path direct to that node) and over
    the others (plain pyarrow forwarded, the rest direct to their owners); the last
    column is plain pyarrow over the client."""
    rows = []
    for label, wanted in [(f"{FIXED} owns", True), (f"{FIXED} does not own", False)]:
        picked = [[ns for ns, index in zip(p.samples_ns, p.sample_keys) if (index in owned) == wanted]
                  for p in paths]
        if not all(picked):
            continue
        p50s = [pct(samples, 0.5) for samples in picked]
        rows.append(f"| {size.name} | {label} | {len(picked[1]):,} | "
                    + " | ".join(ms(v) for v in p50s) + f" | {p50s[1] / p50s[0]:.2f}x |")
    return rows


def validate(size: Size, paths: list[ReadPath], gets_not_owned: int,
             cache: flightcache.Client) -> list[str]:
    """Why the run of `size` is invalid (empty: it is valid). `paths[1]` is plain pyarrow
    through FIXED; every other path goes to the owner and must forward nothing."""
    problems = [f"{p.name}: {f}" for p in paths for f in p.failures[:5]]
    problems += [f"{p.name}: {len(p.failures) - 5} more failed gets" for p in paths if len(p.failures) > 5]
    for number, path in enumerate(paths):
        if number == 1:
            if path.forwarded.forwarded_hits != gets_not_owned:
                problems.append(f"{size.name}: {path.name} had {path.forwarded.forwarded_hits:.0f} forwarded "
                                f"hits, but {gets_not_owned} of its gets were of keys {FIXED} does not own")
        elif path.forwarded.forwarded_hits or path.forwarded.relayed_dogets:
            problems.append(f"{size.name}: {path.name}: gets forwarded ({path.forwarded.forwarded_hits:.0f} "
                            f"hits, {path.forwarded.relayed_dogets:.0f} relays)")
    if cache.fallbacks:
        problems.append(f"the client sent {cache.fallbacks} calls through the seed (an owner failed)")
    return problems


# -- main --------------------------------------------------------------------------------


def default_binary() -> str:
    explicit = os.environ.get("FLIGHTCACHE_NODE_BIN")
    if explicit:
        return explicit
    target = os.environ.get("CARGO_TARGET_DIR", str(Path.home() / ".cache" / "flightcache" / "target"))
    return str(Path(target) / "release" / "flightcache-node")


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--node-bin", default=default_binary(),
                        help="flightcache-node binary (default: $FLIGHTCACHE_NODE_BIN, else the "
                             "release build in $CARGO_TARGET_DIR or ~/.cache/flightcache/target)")
    parser.add_argument("--small-keys", type=int, default=2000, help="keys of 100 x 4 (default 2000)")
    parser.add_argument("--large-keys", type=int, default=300, help="keys of 29,000 x 4, ~1 MiB (default 300)")
    parser.add_argument("--small-gets", type=int, default=6000, help="timed gets per path of the small size")
    parser.add_argument("--large-gets", type=int, default=3000, help="timed gets per path of the large size")
    parser.add_argument("--round", type=int, default=100, help="gets per path per round (default 100)")
    parser.add_argument("--seed", type=int, default=1, help="seed of the read order")
    parser.add_argument("--control", action="store_true",
                        help="a third path: plain pyarrow to each key's owner (one FlightClient per node), "
                             "which separates the client's own cost from the hop")
    return parser.parse_args()


def run(args: argparse.Namespace, pool: Pool) -> int:
    seed = pool.nodes[0]
    cache = flightcache.connect(f"grpc://{seed.address}", token=pool.token)
    call_options = flight.FlightCallOptions(headers=[(b"authorization", f"Bearer {pool.token}".encode())],
                                            timeout=cache.timeout)
    # Plain pyarrow as a Service gives it: one connection, to FIXED, with the documented settings.
    plain = flight.FlightClient(f"grpc://{seed.address}", generic_options=settings.seed_options())
    # The control: plain pyarrow to each key's owner, channels set up as the client sets its up.
    direct = {node.address: flight.FlightClient(
        f"grpc://{node.address}",
        generic_options=settings.seed_options() if node is seed else settings.owner_options())
        for node in pool.nodes}
    owner_address: dict[str, str] = {}
    problems: list[str] = []
    ring = cache.ring
    if ring is None or len(ring.members) != MEMBERS:
        problems.append(f"the client holds no {MEMBERS}-member ring (version {cache.ring_version})")

    def plain_read(key: str) -> pa.Table:
        return plain.do_get(flight.Ticket(flightcache.to_key(key).ticket), call_options).read_all()

    def direct_read(key: str) -> pa.Table:
        client = direct[owner_address[key]]
        return client.do_get(flight.Ticket(flightcache.to_key(key).ticket), call_options).read_all()

    rng = random.Random(args.seed)
    sizes = [(SMALL_ROWS, args.small_keys, args.small_gets), (LARGE_ROWS, args.large_keys, args.large_gets)]
    load_start = os.getloadavg()[0]
    started = time.monotonic()
    table_rows = ["| entry (Arrow bytes) | path | gets | p50 ms | p90 ms | p99 ms | mean ms "
                  "| forwarded hits (share); relayed DoGets |",
                  "|---|---|---:|---:|---:|---:|---:|---|"]
    ratios = ["| entry | p50 | p90 | p99 | mean |", "|---|---:|---:|---:|---:|"]
    names = ["client", "plain via " + FIXED] + (["plain to owner"] if args.control else [])
    splits = ["| entry | keys | gets per path | " + " | ".join(f"{n} p50 ms" for n in names)
              + " | plain / client |",
              "|---|---|---:|" + "---:|" * len(names) + "---:|"]
    owned_notes = []
    try:
        for rows, count, gets in sizes:
            size = put_entries(cache, "small" if rows == SMALL_ROWS else "large", rows, count)
            owned = {i for i, key in enumerate(size.keys) if cache.owner(key) == FIXED}
            owner_address.update((key, cache.address_for(key)) for key in size.keys)
            paths = [ReadPath("flightcache client (to the owner)", cache.get),
                     ReadPath(f"plain pyarrow, one connection to {FIXED}", plain_read)]
            if args.control:
                paths.append(ReadPath("control: plain pyarrow to the owner", direct_read))
            problems += warm_up(size, paths)
            order = measure(pool, size, paths, gets, args.round, rng)
            # What the plain path should have had forwarded: its gets of keys FIXED does not own.
            not_owned = sum(1 for index in order if index not in owned)
            table_rows += report_rows(size, paths)
            ratios.append(ratio_row(size, paths[0], paths[1]))
            splits += split_rows(size, paths, owned)
            owned_notes.append(f"{size.name}: {FIXED} owns {len(owned)} of {count} keys "
                               f"({len(owned) / count:.1%}), so {not_owned} of the plain path's "
                               f"{gets} gets should be forwarded")
            problems += validate(size, paths, not_owned, cache)
    finally:
        cache.close()
        plain.close()
        for client in direct.values():
            client.close()
    elapsed = time.monotonic() - started
    built = datetime.fromtimestamp(Path(args.node_bin).stat().st_mtime, timezone.utc)
    print(f"{datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC · {machine()} · pyarrow {pa.__version__}, "
          f"Python {platform.python_version()}")
    print(f"node {args.node_bin} ({build_info(pool)}, built {built:%Y-%m-%d %H:%M} UTC)")
    print(f"pool of {MEMBERS} on 127.0.0.1 with tokens; client seeded with {FIXED}; "
          f"rounds of {args.round} gets per path, the first path rotating each round; "
          f"load average (1 min) {load_start:.2f} at start, {os.getloadavg()[0]:.2f} at end; {elapsed:.0f} s\n")
    print("\n".join(table_rows))
    print("\nplain pyarrow via local-0 / flightcache client:\n")
    print("\n".join(ratios))
    print("\nthe same gets split by the key's owner (p50):\n")
    print("\n".join(splits))
    print()
    for note in owned_notes:
        print(f"- {note}")
    if problems:
        print("\nINVALID RUN:", file=sys.stderr)
        for problem in problems:
            print(f"- {problem}", file=sys.stderr)
        return 1
    return 0


def main() -> int:
    args = parse_args()
    if not Path(args.node_bin).is_file():
        print(f"no node binary at {args.node_bin}: build one (cargo build --release -p cache-node "
              f"--bin flightcache-node) or set FLIGHTCACHE_NODE_BIN", file=sys.stderr)
        return 2
    directory = Path(tempfile.mkdtemp(prefix="flightcache-hit-latency-"))
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    pool = start_pool(args.node_bin, directory)
    status = 1
    try:
        status = run(args, pool)
    finally:
        pool.stop()
        if status == 0:
            shutil.rmtree(directory, ignore_errors=True)
        else:
            print(f"node logs kept in {directory}", file=sys.stderr)
    return status


if __name__ == "__main__":
    sys.exit(main())
