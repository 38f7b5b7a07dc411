"""Miss coalescing on plain reads: N pyarrow clients that miss one key at once, each
asking to coalesce (`flightcache-coalesce: 1`) and filling what it misses, run the
backend query once; the others are answered with the entry that one put."""

import threading
import time

import pyarrow as pa
import pyarrow.flight as flight

from conftest import put

COALESCE = flight.FlightCallOptions(headers=[(b"flightcache-coalesce", b"1")])
CLIENTS = 8


def query_result() -> pa.Table:
    return pa.table({"id": pa.array(range(1000), pa.int64()), "v": pa.array([i * 0.25 for i in range(1000)])})


def read_through(location, key, barrier, computed, results, index, options):
    """A cache-aside reader: DoGet; on a miss, run the (slow) query and put its result."""
    client = flight.connect(location)
    barrier.wait()
    try:
        results[index] = client.do_get(flight.Ticket(b"FCT\x01P" + key.encode()), options).read_all()
    except pa.ArrowKeyError:
        with computed["lock"]:
            computed["count"] += 1
        time.sleep(0.5)  # the backend query
        data = query_result()
        put(client, key, data)
        results[index] = data
    finally:
        client.close()


def run_readers(node, key, options):
    barrier = threading.Barrier(CLIENTS)
    computed = {"count": 0, "lock": threading.Lock()}
    results = [None] * CLIENTS
    threads = [
        threading.Thread(target=read_through, args=(node.location, key, barrier, computed, results, i, options))
        for i in range(CLIENTS)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    assert all(not thread.is_alive() for thread in threads)
    return computed["count"], results


def test_concurrent_coalescing_misses_run_the_query_once(node):
    count, results = run_readers(node, "coalesce/one", COALESCE)
    print(f"{CLIENTS} concurrent coalescing readers: {count} backend query")
    assert count == 1
    assert all(result is not None and result.equals(query_result()) for result in results)


def test_without_the_header_every_concurrent_miss_runs_the_query(node):
    # The reference: plain cache-aside readers each compute the value they missed
    # (how many depends on timing; at least two in practice, and never fewer than one).
    count, results = run_readers(node, "coalesce/plain", flight.FlightCallOptions())
    print(f"{CLIENTS} concurrent plain readers: {count} backend queries")
    assert count >= 2
    assert all(result is not None and result.equals(query_result()) for result in results)
