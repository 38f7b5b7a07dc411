"""The disk tier with plain pyarrow: a node restarted on the same --data-dir serves what
it held, byte-identical, including a dictionary column and a per-entry TTL."""

import time
import urllib.request

import pyarrow as pa
import pyarrow.flight as flight
import pytest

from conftest import Node


def table(rows: int, seed: int) -> pa.Table:
    return pa.table({
        "id": pa.array(range(seed, seed + rows), pa.int64()),
        "amount": pa.array([i * 0.25 for i in range(rows)], pa.float64()),
        "region": pa.array([f"r{i % 7}" for i in range(rows)]).dictionary_encode(),
    })


def put(client, key, data, ttl=None):
    writer, reader = client.do_put(flight.FlightDescriptor.for_path(*key.split("/")), data.schema)
    if ttl:
        writer.write_with_metadata(data.to_batches()[0], f'{{"ttl": "{ttl}"}}'.encode())
        for batch in data.to_batches()[1:]:
            writer.write_batch(batch)
    else:
        writer.write_table(data)
    writer.done_writing()
    reader.read()
    writer.close()


def get(client, key) -> pa.Table:
    ticket = flight.Ticket(b"FCT\x01P" + key.encode())
    return client.do_get(ticket).read_all()


def wait_ready(node: Node):
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{node.metrics_port}/readyz", timeout=1) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.05)
    raise RuntimeError("the node did not report ready within 30 s")


def test_a_restarted_node_serves_what_it_held_from_its_data_dir(tmp_path):
    data_dir = str(tmp_path / "data")
    node = Node("--data-dir", data_dir)
    wait_ready(node)
    client = flight.connect(node.location)
    written = {f"results/{i}": table(200 + 50 * i, i * 1000) for i in range(20)}
    for key, data in written.items():
        put(client, key, data)
    put(client, "results/short", table(10, 7), ttl="1s")
    expected = {key: get(client, key) for key in written}
    client.close()
    assert node.stop() == 0

    time.sleep(1.2)  # the 1 s entry's TTL passes while the node is down
    node = Node("--data-dir", data_dir)
    try:
        wait_ready(node)
        client = flight.connect(node.location)
        for key, data in expected.items():
            assert get(client, key).equals(data), key
        with pytest.raises(pa.ArrowKeyError, match="is not cached"):
            get(client, "results/short")
        metrics = urllib.request.urlopen(f"http://127.0.0.1:{node.metrics_port}/metrics").read().decode()
        assert 'flightcache_node_disk_reload_entries_total{outcome="loaded"} 20' in metrics
        assert 'flightcache_node_disk_reload_entries_total{outcome="expired"} 1' in metrics
        client.close()
    finally:
        node.stop()
