"""The client against one real node with a client token and an admin token: round trips,
misses as None, TTLs, invalidation, and errors a user can act on, each carrying the node's
own status message."""

import logging

import pyarrow as pa
import pytest

import flightcache
from conftest import Node, table


def connect(node, **kwargs):
    kwargs.setdefault("token", "client-token")
    return flightcache.connect(node.location, **kwargs)


def test_put_get_invalidate_round_trip_with_the_token(token_node):
    with connect(token_node) as cache:
        data = table(1000, 3)
        summary = cache.put("reports/daily", data)
        assert (summary.rows, summary.batches) == (1000, 1) and summary.bytes > 0
        assert cache.get("reports/daily").equals(data)
        assert cache.get(["reports", "daily"]).equals(data)  # the same key as segments
        assert cache.invalidate("reports/daily") is True
        assert cache.get("reports/daily") is None
        assert cache.invalidate("reports/daily") is False


def test_a_miss_is_none_not_an_exception(token_node):
    with connect(token_node) as cache:
        assert cache.get("never/stored") is None


def test_command_keys_and_empty_results_and_record_batches(token_node):
    with connect(token_node) as cache:
        empty = pa.table({"x": pa.array([], pa.int64())})
        cache.put(b"SELECT 1 WHERE false", empty)
        got = cache.get(b"SELECT 1 WHERE false")
        assert got.num_rows == 0 and got.schema == empty.schema
        batch = pa.record_batch({"x": pa.array([1, 2, 3], pa.int64())})
        cache.put(b"SELECT 3", batch)
        assert cache.get(b"SELECT 3").equals(pa.Table.from_batches([batch]))


def test_ttl_rides_in_the_first_message_and_expires_the_entry(token_node, tmp_path):
    import time
    with connect(token_node) as cache:
        assert cache.put("ttl/long", table(5), ttl="90s").ttl_ms == 90_000
        assert cache.put("ttl/minutes", table(5), ttl=__import__("datetime").timedelta(minutes=2)).ttl_ms == 120_000
        assert cache.put("ttl/empty", pa.table({"x": pa.array([], pa.int64())}), ttl=30).ttl_ms == 30_000
        assert cache.put("ttl/short", table(5), ttl=0.3).ttl_ms == 300
        assert cache.get("ttl/short") is not None
        time.sleep(0.6)
        assert cache.get("ttl/short") is None


def test_invalidate_prefix_removes_every_key_under_it(token_node):
    with connect(token_node) as cache:
        for i in range(12):
            cache.put(f"prefix/{i}", table(3, i))
        cache.put("other/0", table(3))
        assert cache.invalidate_prefix("prefix/") == 12
        assert all(cache.get(f"prefix/{i}") is None for i in range(12))
        assert cache.get("other/0") is not None
        with pytest.raises(flightcache.InvalidArgument):
            cache.invalidate_prefix("")


def test_tags_given_at_put_remove_every_result_of_a_table(token_node):
    with connect(token_node) as cache:
        cache.put("q/revenue", table(3), tags=["sales.orders", "sales.customers"])
        cache.put("q/top", table(3), ttl=600, tags=["sales.orders"])
        cache.get_or_compute("q/churn", lambda: table(4), tags=["crm.users"])
        assert cache.invalidate_tags(["sales.orders"]) == 2
        assert cache.get("q/revenue") is None and cache.get("q/top") is None
        assert cache.get("q/churn") is not None
        assert cache.invalidate_tags(["crm.users", "nobody"]) == 1
        with pytest.raises(flightcache.InvalidArgument, match="given twice"):
            cache.put("q/bad", table(3), tags=["a", "a"])
        with pytest.raises(flightcache.InvalidArgument):
            cache.put("q/bad", table(3), tags="sales.orders")
        with pytest.raises(flightcache.InvalidArgument):
            cache.invalidate_tags([])


def test_a_wrong_token_is_unauthenticated_with_the_nodes_message(token_node):
    with pytest.raises(flightcache.Unauthenticated) as err:
        connect(token_node, token="wrong")
    assert "bearer token" in err.value.message and err.value.code == "UNAUTHENTICATED"
    assert err.value.address == token_node.address
    # Without routing the first call is the one that fails, the same way.
    with connect(token_node, token=None, routing=False) as cache:
        with pytest.raises(flightcache.Unauthenticated, match="bearer token"):
            cache.get("reports/daily")
        with pytest.raises(flightcache.Unauthenticated):
            cache.put("reports/daily", table(3))


def test_the_client_token_reads_the_ring(token_node, caplog):
    # `topology` is a client action: the client token reads the ring (a single node has
    # none: version 0, every call to the seed), with no warning.
    with caplog.at_level(logging.WARNING, logger="flightcache"):
        cache = connect(token_node)
    with cache:
        assert cache.ring_version == 0 and cache.address_for("seed/only") == token_node.address
        assert "cannot read the pool's ring" not in caplog.text
        cache.put("seed/only", table(4))
        assert cache.get("seed/only").num_rows == 4


def test_errors_carry_the_nodes_status_message(tmp_path):
    node = Node(tmp_path, "--max-entry-size", "1MiB")
    try:
        with flightcache.connect(node.location) as cache:
            big = pa.table({"x": pa.array(range(400_000), pa.int64())})
            with pytest.raises(flightcache.ResourceExhausted, match="larger than the max entry size") as err:
                cache.put("too/big", big)
            assert err.value.code == "RESOURCE_EXHAUSTED" and "gRPC" not in err.value.message
            with pytest.raises(flightcache.InvalidArgument, match="is not a duration"):
                cache.put("bad/ttl", table(3), ttl="soon")
            with pytest.raises(flightcache.InvalidArgument, match="at least 1 ms"):
                cache.put("bad/ttl", table(3), ttl=0)
            assert cache.get("too/big") is None and cache.get("bad/ttl") is None
    finally:
        node.stop()


def test_an_unreachable_seed_is_unavailable(tmp_path):
    from conftest import free_port
    with pytest.raises(flightcache.Unavailable) as err:
        flightcache.connect(f"grpc://127.0.0.1:{free_port()}", timeout=5)
    assert "failed to connect" in err.value.message.lower() or "connect" in err.value.message.lower()


def test_close_ends_the_client(token_node):
    cache = connect(token_node)
    cache.close()
    cache.close()  # idempotent
    with pytest.raises(flightcache.FlightCacheError, match="closed"):
        cache.get("reports/daily")
