"""get_or_compute from several processes at once, against the 3-node pool: the node's fill
lease makes one of them compute, the others wait for its put and read it; when the lease
holder fails, one waiter computes once its lease has run out. Each computation appends a
byte to a file, so the count spans processes."""

import hashlib
import multiprocessing
import os
import time

import pyarrow as pa

import flightcache
from conftest import table

PROCESSES = 8


def digest(t: pa.Table) -> str:
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, t.schema) as writer:
        writer.write_table(t)
    return hashlib.sha256(sink.getvalue().to_pybytes()).hexdigest()


def count(path: str) -> int:
    return os.path.getsize(path) if os.path.exists(path) else 0


def worker(seed: str, key: str, counter: str, barrier, results, index: int, fail: bool = False) -> None:
    """One process: connect through `seed`, wait for the others, get_or_compute."""
    def compute() -> pa.Table:
        with open(counter, "ab") as f:  # O_APPEND: one byte per computation
            f.write(b"F" if fail else b"x")
        time.sleep(1.0)  # the backend query
        if fail:
            raise RuntimeError("the backend query failed")
        return table(5000, 42)

    try:
        with flightcache.connect(seed) as cache:
            if barrier is not None:
                barrier.wait(timeout=60)
            started = time.monotonic()
            got = cache.get_or_compute(key, compute, ttl=300)
            results.put((index, digest(got), time.monotonic() - started))
    except Exception as err:  # noqa: BLE001 - reported to the test
        results.put((index, f"error: {type(err).__name__}: {err}", 0.0))


def test_concurrent_processes_compute_once_and_all_get_the_same_table(pool, tmp_path):
    ctx = multiprocessing.get_context("spawn")
    counter = str(tmp_path / "computations")
    barrier, results = ctx.Barrier(PROCESSES), ctx.Queue()
    # Each process dials another node of the pool: the lease lives on the key's owner.
    procs = [ctx.Process(target=worker, args=(pool.nodes[i % 3].location, "coalesced/report", counter,
                                              barrier, results, i)) for i in range(PROCESSES)]
    for p in procs:
        p.start()
    answers = [results.get(timeout=120) for _ in procs]
    for p in procs:
        p.join(timeout=30)
    print(f"{PROCESSES} processes: {count(counter)} computation(s); seconds each: "
          f"{sorted(round(a[2], 2) for a in answers)}")
    assert all(p.exitcode == 0 for p in procs)
    assert count(counter) == 1
    assert {a[1] for a in answers} == {digest(table(5000, 42))}
    with flightcache.connect(pool.nodes[0].location) as cache:
        assert cache.get("coalesced/report").equals(table(5000, 42))


def test_when_the_lease_holder_fails_one_waiter_computes_after_the_lease_runs_out(pool, tmp_path):
    ctx = multiprocessing.get_context("spawn")
    counter = str(tmp_path / "computations")
    results = ctx.Queue()
    key = "coalesced/after-failure"
    holder = ctx.Process(target=worker, args=(pool.nodes[0].location, key, counter, None, results, 0, True))
    holder.start()
    deadline = time.monotonic() + 60
    while count(counter) == 0:  # the holder has the lease and is computing
        assert time.monotonic() < deadline
        time.sleep(0.01)
    waiters = [ctx.Process(target=worker, args=(pool.nodes[i % 3].location, key, counter, None, results, i))
               for i in range(1, 4)]
    for p in waiters:
        p.start()
    answers = sorted(results.get(timeout=120) for _ in range(4))
    for p in [holder, *waiters]:
        p.join(timeout=30)
    with open(counter, "rb") as f:
        computations = f.read()
    print(f"holder failed; computations {computations!r}; answers {[(a[0], a[1][:24], round(a[2], 1)) for a in answers]}")
    assert answers[0][1] == "error: RuntimeError: the backend query failed"
    assert computations == b"Fx"  # the holder's failed one, then exactly one waiter's
    assert {a[1] for a in answers[1:]} == {digest(table(5000, 42))}
