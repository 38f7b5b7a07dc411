"""Three node processes sharing a static topology: any node serves any key, plain pyarrow."""

import json

import pyarrow as pa
import pyarrow.flight as flight
import pytest

from conftest import Node, free_port, put


def table(rows: int, seed: int) -> pa.Table:
    return pa.table({
        "id": pa.array(range(seed, seed + rows), pa.int64()),
        "amount": pa.array([i * 0.5 for i in range(rows)], pa.float64()),
        "region": pa.array([f"r{i % 11}" for i in range(rows)], pa.utf8()),
    })


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    ports = [free_port() for _ in range(3)]
    topology = {
        "version": 1,
        "members": [{"id": f"local-{i}", "address": f"127.0.0.1:{port}"} for i, port in enumerate(ports)],
    }
    path = tmp_path_factory.mktemp("cluster") / "topology.json"
    path.write_text(json.dumps(topology))
    nodes = []
    try:
        for i, port in enumerate(ports):
            nodes.append(Node("--member-id", f"local-{i}", "--topology", str(path), port=port))
        yield nodes
    finally:
        for node in nodes:
            if node.proc.poll() is None:
                node.stop()


def test_put_through_node_0_and_get_through_node_2_across_processes(cluster):
    via0 = flight.connect(cluster[0].location)
    via1 = flight.connect(cluster[1].location)
    via2 = flight.connect(cluster[2].location)
    owners = set()
    for i in range(24):
        key = f"reports/{i}"
        data = table(2000 + i, i)
        put(via0, key, data)
        got = via2.do_get(flight.Ticket(b"FCT\x01P" + key.encode())).read_all()
        assert got.equals(data)
        # GetFlightInfo through any node names the owner's location.
        info = via1.get_flight_info(flight.FlightDescriptor.for_path(*key.split("/")))
        owners.add(info.endpoints[0].locations[0].uri.decode())
        assert info.total_records == 2000 + i
    assert owners == {node.location for node in cluster}
    # Each entry is stored once, on its owner.
    total = 0
    for node in cluster:
        client = flight.connect(node.location)
        stats = json.loads(list(client.do_action(flight.Action("stats", b"")))[0].body.to_pybytes())
        assert stats["ringVersion"] == 1
        assert 0 < stats["entries"] < 24
        total += stats["entries"]
    assert total == 24


def test_list_flights_on_any_node_lists_every_nodes_keys_once(cluster):
    via0 = flight.connect(cluster[0].location)
    expected = []
    for i in range(15):
        key = f"listed/{i:02}"
        put(via0, key, table(3, i))
        expected.append(key)
    for node in cluster:
        client = flight.connect(node.location)
        infos = list(client.list_flights(b"listed/"))
        keys = ["/".join(p.decode() for p in info.descriptor.path) for info in infos]
        assert keys == expected
        assert all(info.total_records == 3 for info in infos)


def test_proxy_location_mode_sends_no_location_and_the_node_asked_serves_the_ticket(cluster):
    via0 = flight.connect(cluster[0].location)
    key = "proxied/0"
    data = table(50, 4)
    put(via0, key, data)

    def configure(body):
        return json.loads(list(via0.do_action(flight.Action("configure", body)))[0].body.to_pybytes())

    configure(b'{"locationMode": "proxy"}')
    try:
        for i in range(10):
            key = f"proxied/{i}"
            put(via0, key, table(5, i))
            info = via0.get_flight_info(flight.FlightDescriptor.for_path(*key.split("/")))
            assert list(info.endpoints[0].locations) == []
            assert via0.do_get(info.endpoints[0].ticket).read_all().equals(table(5, i))
    finally:
        configure(b'{"locationMode": "direct"}')


def test_a_stopped_owners_keys_are_served_from_its_handoff_and_the_rest_are_misses_naming_it(cluster):
    via0 = flight.connect(cluster[0].location)
    keys_by_owner = {}
    for i in range(60):
        key = f"dash/{i}"
        put(via0, key, table(10, i))
        info = via0.get_flight_info(flight.FlightDescriptor.for_path(*key.split("/")))
        keys_by_owner.setdefault(info.endpoints[0].locations[0].uri.decode(), []).append(key)
    handed, removed = keys_by_owner[cluster[1].location][:2]
    assert json.loads(b"".join(r.body.to_pybytes() for r in via0.do_action(flight.Action("invalidate", removed.encode())))) == {"removed": True}
    # SIGTERM: local-1 copies what it holds to each key's next candidate before it stops.
    cluster[1].stop()
    got = via0.do_get(flight.Ticket(b"FCT\x01P" + handed.encode())).read_all()
    assert got.equals(table(10, int(handed.split("/")[1])))
    # A key it did not hold is a miss for the client (it computes it), naming the owner.
    with pytest.raises(pa.ArrowKeyError, match=r"owner local-1 \(127\.0\.0\.1:\d+\) is unreachable.*answered as a miss"):
        via0.do_get(flight.Ticket(b"FCT\x01P" + removed.encode())).read_all()
    kept = keys_by_owner[cluster[2].location][0]
    assert via0.do_get(flight.Ticket(b"FCT\x01P" + kept.encode())).read_all().num_rows == 10


def test_a_put_whose_owner_is_down_is_stored_on_the_next_candidate_and_read_back(cluster):
    via0 = flight.connect(cluster[0].location)
    if cluster[1].proc.poll() is None:
        cluster[1].stop()
    # About a third of 200 keys are owned by the stopped node: every put succeeds (those
    # go to the key's next candidate) and reads back byte-identical through two nodes.
    written = 0
    for i in range(200):
        key = f"fallback/{i}"
        data = table(20, i)
        put(via0, key, data)  # never UNAVAILABLE: the owner's keys go to the next candidate
        got = via0.do_get(flight.Ticket(b"FCT\x01P" + key.encode())).read_all()
        assert got.equals(data), key
        via2 = flight.connect(cluster[2].location)
        assert via2.do_get(flight.Ticket(b"FCT\x01P" + key.encode())).read_all().equals(data), key
        via2.close()
        written += 1
    assert written == 200
