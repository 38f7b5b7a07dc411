"""The cache node as a Python user meets it: plain pyarrow.flight, no FlightCache library."""

import json
import struct
import urllib.request
from datetime import datetime

import pyarrow as pa
import pyarrow.flight as flight
import pytest

from conftest import Node


def bi_table(rows: int) -> pa.Table:
    return pa.table({
        "id": pa.array(range(rows), pa.int64()),
        "amount": pa.array([i * 0.25 for i in range(rows)], pa.float64()),
        "at": pa.array([datetime(2026, 1, 1, 0, 0, i % 60) for i in range(rows)], pa.timestamp("us")),
        "region": pa.array([f"r{i % 13}" for i in range(rows)], pa.utf8()),
    })


def put(client, key, table, metadata=None):
    descriptor = flight.FlightDescriptor.for_path(*key.split("/"))
    writer, reader = client.do_put(descriptor, table.schema)
    if metadata is not None:
        writer.write_with_metadata(table.to_batches()[0], metadata.encode())
        for batch in table.to_batches()[1:]:
            writer.write_batch(batch)
    else:
        writer.write_table(table)
    writer.done_writing()
    result = reader.read()
    writer.close()
    return json.loads(result.to_pybytes()) if result is not None else None


def action(client, kind, body=b""):
    results = list(client.do_action(flight.Action(kind, body)))
    return results[0].body.to_pybytes()


def test_put_and_get_with_a_ticket_built_from_the_key(client):
    table = bi_table(1827)
    summary = put(client, "reports/daily", table)
    assert summary["rows"] == 1827
    # A hit is one DoGet: the ticket is built from the key (documented format).
    got = client.do_get(flight.Ticket(b"FCT\x01P" + b"reports/daily")).read_all()
    assert got.equals(table)


def test_get_flight_info_then_do_get(client):
    table = bi_table(200)
    put(client, "dash/sales", table)
    info = client.get_flight_info(flight.FlightDescriptor.for_path("dash", "sales"))
    assert info.schema == table.schema
    assert info.total_records == 200
    assert info.endpoints[0].ticket.ticket == b"FCT\x01Pdash/sales"
    got = client.do_get(info.endpoints[0].ticket).read_all()
    assert got.equals(table)
    assert client.get_schema(flight.FlightDescriptor.for_path("dash", "sales")).schema == table.schema


def test_command_keys(client):
    sql = b"SELECT region, sum(amount) FROM t GROUP BY 1"
    table = bi_table(13)
    writer, reader = client.do_put(flight.FlightDescriptor.for_command(sql), table.schema)
    writer.write_table(table)
    writer.close()
    info = client.get_flight_info(flight.FlightDescriptor.for_command(sql))
    assert client.do_get(info.endpoints[0].ticket).read_all().equals(table)


def test_list_flights_by_prefix(client):
    for key in ["list/a", "list/b", "other/c"]:
        put(client, key, bi_table(3))
    listed = sorted("/".join(p.decode() for p in f.descriptor.path) for f in client.list_flights(b"list/"))
    assert listed == ["list/a", "list/b"]
    everything = ["/".join(p.decode() for p in f.descriptor.path) for f in client.list_flights()
                  if f.descriptor.descriptor_type == flight.DescriptorType.PATH]
    assert {"list/a", "list/b", "other/c"} <= set(everything)


def test_every_action(client):
    assert {a.type for a in client.list_actions()} == {
        "ping", "invalidate", "invalidate-prefix", "invalidate-tag", "clear", "stats", "configure",
        "topology", "lease", "rebalance", "held", "invalidate-local"}
    assert action(client, "ping") == b"pong"
    # Without a topology a node owns every key: rebalance keeps everything.
    report = json.loads(action(client, "rebalance", b'{"dryRun": true}'))
    assert report["moved"] == 0 and report["failed"] == 0 and report["ringVersion"] == 0
    for key in ["act/1", "act/2", "act/3"]:
        put(client, key, bi_table(5))
    assert json.loads(action(client, "invalidate", b"act/1")) == {"removed": True}
    # `held`: each key's store bytes (b"P" + a path) after its length, u32 big-endian.
    batch = b"".join(struct.pack(">I", len(k)) + k for k in [b"Pact/1", b"Pact/2", b"Pact/3"])
    assert json.loads(action(client, "held", batch)) == {"held": [False, True, True]}
    with pytest.raises(pa.ArrowInvalid, match="ends inside key 0"):
        action(client, "held", b"\x00\x00\x00\x09Pact")
    with pytest.raises(pa.ArrowKeyError, match="act/1"):
        client.do_get(flight.Ticket(b"FCT\x01Pact/1")).read_all()
    assert json.loads(action(client, "invalidate-prefix", b"act/")) == {"removed": 2}
    stats = json.loads(action(client, "stats"))
    assert stats["evictions"]["explicit"] >= 3
    applied = json.loads(action(client, "configure", json.dumps({"ttl": "30m", "ttlMode": "sliding"}).encode()))
    assert applied["generation"] == stats["generation"] + 1
    stats = json.loads(action(client, "stats"))
    assert stats["ttl"] == "30m" and stats["ttlMode"] == "sliding"
    removed = json.loads(action(client, "clear"))["removed"]
    assert removed >= 0
    assert json.loads(action(client, "stats"))["entries"] == 0


def test_per_entry_ttl_and_bad_metadata(client):
    table = bi_table(10)
    assert put(client, "ttl/short", table, metadata='{"ttl": "45s"}')["ttlMs"] == 45_000
    with pytest.raises(pa.ArrowInvalid, match="app_metadata"):
        put(client, "ttl/bad", table, metadata="not json")
    with pytest.raises(pa.ArrowKeyError):
        client.do_get(flight.Ticket(b"FCT\x01Pttl/bad")).read_all()


def test_tags_given_at_put_invalidate_every_result_of_a_table(client):
    # What a query engine does: tag each result with the tables it read, then drop every
    # result of a table when an ETL job rewrites it. The tags ride with the first batch
    # (write_with_metadata), the way pyarrow sends options.
    table = bi_table(300)
    put(client, "q/revenue", table, metadata='{"tags": ["sales.orders", "sales.customers"]}')
    put(client, "q/top", table, metadata='{"tags": ["sales.orders"], "ttl": "10m"}')
    put(client, "q/churn", table, metadata='{"tags": ["crm.users"]}')
    removed = action(client, "invalidate-tag", json.dumps({"tags": ["sales.orders"]}).encode())
    assert json.loads(removed) == {"removed": 2}
    for gone in [b"q/revenue", b"q/top"]:
        with pytest.raises(pa.ArrowKeyError):
            client.do_get(flight.Ticket(b"FCT\x01P" + gone)).read_all()
    assert client.do_get(flight.Ticket(b"FCT\x01Pq/churn")).read_all().equals(table)
    with pytest.raises(pa.ArrowInvalid, match="given twice"):
        put(client, "q/bad", table, metadata='{"tags": ["a", "a"]}')
    with pytest.raises(pa.ArrowInvalid, match="at least one tag"):
        action(client, "invalidate-tag", b'{"tags": []}')


def test_invalidate_local_removes_keys_prefixes_and_tags_in_one_call(client):
    # The operator's call for a CacheInvalidation, as any Flight client sends it.
    table = bi_table(20)
    put(client, "loc/a", table)
    put(client, "loc/old/1", table)
    put(client, "loc/old/2", table)
    put(client, "loc/t", table, metadata='{"tags": ["loc.tag"]}')
    put(client, "loc/kept", table)
    body = {"keys": ["loc/a"], "prefixes": ["loc/old/"], "tags": ["loc.tag"]}
    assert json.loads(action(client, "invalidate-local", json.dumps(body).encode())) == {"removed": 4}
    for gone in [b"loc/a", b"loc/old/1", b"loc/old/2", b"loc/t"]:
        with pytest.raises(pa.ArrowKeyError):
            client.do_get(flight.Ticket(b"FCT\x01P" + gone)).read_all()
    assert client.do_get(flight.Ticket(b"FCT\x01Ploc/kept")).read_all().equals(table)
    with pytest.raises(pa.ArrowInvalid, match="at least one key, prefix or tag"):
        action(client, "invalidate-local", b"{}")
    with pytest.raises(pa.ArrowInvalid, match="prefix 0 is empty"):
        action(client, "invalidate-local", b'{"prefixes": [""]}')


def test_bad_tickets_and_unknown_keys(client):
    with pytest.raises(pa.ArrowInvalid, match="not a FlightCache ticket"):
        client.do_get(flight.Ticket(b"whatever")).read_all()
    with pytest.raises(pa.ArrowKeyError, match="is not cached"):
        client.get_flight_info(flight.FlightDescriptor.for_path("never", "put"))
    with pytest.raises(pa.ArrowNotImplementedError, match="unknown action"):
        action(client, "reboot")
    assert action(client, "ping") == b"pong"


def test_large_batches_both_ways(client):
    table = bi_table(300_000)  # ~9 MiB in one batch, over gRPC's 4 MiB default
    put(client, "large/one", table.combine_chunks())
    got = client.do_get(flight.Ticket(b"FCT\x01Plarge/one")).read_all()
    assert got.num_rows == 300_000
    assert got.equals(table)


def test_a_batch_received_in_place_is_stored_and_read_back_whole(client):
    # ~1 MiB in one message: the node receives its body straight into the entry's
    # allocation (wire::intake, ADR 0011) and keeps it as sent, with pyarrow's
    # app_metadata on the same message.
    table = bi_table(30_000).combine_chunks()
    descriptor = flight.FlightDescriptor.for_path("large", "in-place")
    writer, reader = client.do_put(descriptor, table.schema)
    writer.write_with_metadata(table.to_batches()[0], pa.py_buffer(b'{"ttl": "90s"}'))
    writer.done_writing()
    summary = json.loads(reader.read().to_pybytes())
    writer.close()
    assert summary["rows"] == 30_000 and summary["ttlMs"] == 90_000
    got = client.do_get(flight.Ticket(b"FCT\x01Plarge/in-place")).read_all()
    assert got.equals(table)


def test_dictionary_columns_are_served_as_their_values(client):
    # pandas categoricals arrive as dictionary columns; the node stores and serves them
    # with the value type, as its DoGet has always sent them.
    table = pa.table({
        "region": pa.array([f"r{i % 5}" for i in range(1000)]).dictionary_encode(),
        "id": pa.array(range(1000), pa.int64()),
    })
    put(client, "dict/regions", table)
    got = client.do_get(flight.Ticket(b"FCT\x01Pdict/regions")).read_all()
    assert got.schema.field("region").type == pa.utf8()
    assert got.column("region").to_pylist() == table.column("region").to_pylist()
    info = client.get_flight_info(flight.FlightDescriptor.for_path("dict", "regions"))
    assert info.schema == got.schema


def test_a_small_slice_is_charged_for_itself_not_its_parent(client):
    parent = bi_table(200_000).combine_chunks()
    summary = put(client, "slice/one", parent.slice(1000, 10))
    assert summary["rows"] == 10
    # Ten rows of four columns plus the stored headers: a few kilobytes, not the
    # parent's ~6 MB.
    assert summary["bytes"] < 8 * 1024, summary
    got = client.do_get(flight.Ticket(b"FCT\x01Pslice/one")).read_all()
    assert got.equals(parent.slice(1000, 10))


def test_oversized_put_is_refused_and_nothing_stored():
    small = Node("--memory-budget", "64MiB", "--max-entry-size", "2MiB")
    try:
        client = flight.connect(small.location)
        # RESOURCE_EXHAUSTED surfaces in pyarrow as ArrowInvalid.
        with pytest.raises(pa.ArrowInvalid, match="max entry size.*nothing was stored"):
            put(client, "too/big", bi_table(200_000))
        stats = json.loads(action(client, "stats"))
        assert stats["entries"] == 0 and stats["reservedBytes"] == 0
        client.close()
    finally:
        assert small.stop() == 0


def test_bearer_token_auth(tmp_path):
    token = tmp_path / "token"
    token.write_text("s3cret\n")
    secured = Node("--auth-token-file", str(token))
    try:
        client = flight.connect(secured.location)
        with pytest.raises(flight.FlightUnauthenticatedError):
            action(client, "ping")
        header = client.authenticate_basic_token(b"anyone", b"s3cret")
        options = flight.FlightCallOptions(headers=[header])
        assert list(client.do_action(flight.Action("ping", b""), options))[0].body.to_pybytes() == b"pong"
        client.close()
    finally:
        assert secured.stop() == 0


def test_metrics_endpoint(node, client):
    put(client, "metrics/x", bi_table(4))
    client.do_get(flight.Ticket(b"FCT\x01Pmetrics/x")).read_all()
    body = urllib.request.urlopen(f"http://127.0.0.1:{node.metrics_port}/metrics", timeout=5).read().decode()
    assert 'flightcache_node_lookups_total{result="hit"}' in body
    assert "flightcache_node_memory_used_bytes" in body
