"""The owner computation matches the node's byte for byte: the golden values of the
node's own ring tests (cache-node/src/routing/ring.rs: hash_is_stable,
zone_diverse_choices_are_stable), and keys, tickets and descriptors as the node reads them.
Pure; no node needed."""

import json
from pathlib import Path

import pyarrow.flight as flight
import pytest

from flightcache import InvalidArgument, settings
from flightcache.keys import to_key
from flightcache.ring import Member, Ring, key_hash

REPO = Path(__file__).resolve().parents[3]


def pool(n, zones=None):
    return Ring(1, [Member(f"pool-{i}", f"127.0.0.1:{i}", zone=zones[i] if zones else None) for i in range(n)])


def test_hash_matches_the_nodes_golden_values():
    assert key_hash(b"") == 0x9CA066F1A4AB2EEA
    assert key_hash(b"Preports/daily") == 0x2A3CC39FEF2D98C4
    assert pool(3).owner(b"Preports/daily").id == "pool-1"


def test_zone_diverse_choices_match_the_nodes_golden_values():
    ring = pool(6, ["zone-a", "zone-a", "zone-b", "zone-c", "zone-a", "zone-b"])
    got = [[m.id for m in ring.owners(key.encode(), 3)] for key in ["Preports/daily", "Pa", "Pb", "Pc"]]
    assert got == [
        ["pool-3", "pool-1", "pool-2"],
        ["pool-1", "pool-3", "pool-5"],
        ["pool-0", "pool-3", "pool-5"],
        ["pool-1", "pool-5", "pool-3"],
    ]


def test_only_active_members_own_keys_and_the_owner_is_the_first_choice():
    ring = Ring(2, [Member("a", "x:1", state="joining"), Member("b", "x:2", state="draining")])
    assert ring.owner(b"Pa") is None and ring.owners(b"Pa", 2) == []
    ring = pool(5)
    for i in range(500):
        key = f"Preports/7/{i}".encode()
        owners = ring.owners(key, 3)
        assert owners[0] == ring.owner(key) and len({m.id for m in owners}) == 3


def test_adding_a_member_moves_about_a_quarter_of_the_keys_to_it():
    before, after = pool(3), pool(4)
    keys = [f"Pk/{i}".encode() for i in range(4000)]
    moved = [k for k in keys if before.owner(k).id != after.owner(k).id]
    assert all(after.owner(k).id == "pool-3" for k in moved)
    assert 800 < len(moved) < 1200, len(moved)


def test_keys_tickets_and_descriptors_are_the_nodes():
    assert to_key("reports/daily").ticket == b"FCT\x01Preports/daily"
    assert to_key(["reports", "daily"]) == to_key("reports/daily")
    assert to_key(b"SELECT 1").ticket == b"FCT\x01CSELECT 1"
    assert to_key(flight.FlightDescriptor.for_path("a", "b")).store_bytes == b"Pa/b"
    assert to_key(flight.FlightDescriptor.for_command(b"q")).store_bytes == b"Cq"
    assert to_key("a/b").descriptor == flight.FlightDescriptor.for_path("a", "b")
    for bad in ["", "/", b"", 7, "x" * (64 * 1024 + 1)]:
        with pytest.raises(InvalidArgument):
            to_key(bad)


def test_the_built_in_service_config_is_the_documented_one():
    documented = json.loads((REPO / "docs" / "examples" / "grpc-service-config.json").read_text())
    assert settings.SERVICE_CONFIG == documented
