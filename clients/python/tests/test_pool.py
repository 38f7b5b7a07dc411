"""The client against a local pool of three real node processes sharing one ring (as
cache-node/scripts/local-cluster forms it): it computes each key's owner as the nodes do,
sends every call straight there (the nodes' forwarded-call counters stay exactly where they
were), and follows ring changes — a node added, a node stopped — with no failed call."""

import json
import random
import threading
import time

import pyarrow.flight as flight
import pytest

import flightcache
from conftest import Pool, table

FORWARDED = "flightcache_node_forwarded_total"


def entries(node) -> int:
    return json.loads(node.action("stats"))["entries"]


def test_the_owner_the_client_computes_is_the_nodes_for_every_key(pool):
    keys = [f"owner/{i}" for i in range(600)] + [f"SELECT {i} FROM t".encode() for i in range(100)]
    before = [entries(node) for node in pool.nodes]
    with flightcache.connect(pool.nodes[0].location) as cache:
        assert cache.ring_version == 1
        predicted = {node.address: 0 for node in pool.nodes}
        for i, key in enumerate(keys):
            cache.put(key, table(2, i))
            predicted[cache.address_for(key)] += 1
        via = flight.connect(pool.nodes[0].location)
        for key in keys:
            descriptor = (flight.FlightDescriptor.for_command(key) if isinstance(key, bytes)
                          else flight.FlightDescriptor.for_path(*key.split("/")))
            # In `direct` location mode the node names the key's owner in the endpoint.
            location = via.get_flight_info(descriptor).endpoints[0].locations[0].uri.decode()
            assert location == f"grpc://{cache.address_for(key)}", key
        via.close()
    stored = [entries(node) - b for node, b in zip(pool.nodes, before)]
    print(f"{len(keys)} keys: predicted per node {list(predicted.values())}, stored {stored}")
    assert stored == [predicted[node.address] for node in pool.nodes]


def test_calls_go_straight_to_the_owner_and_nothing_is_forwarded(pool):
    keys = [f"direct/{i}" for i in range(300)]
    with flightcache.connect(pool.nodes[0].location) as cache:
        for i, key in enumerate(keys):  # warm-up: every key cached, every channel open
            cache.put(key, table(50, i))
            assert cache.get(key) is not None
        forwarded, hits = pool.forwarded(), [n.counter("flightcache_node_doget_seconds_count", outcome="local_hit") for n in pool.nodes]
        for i, key in enumerate(keys):
            assert cache.get(key).equals(table(50, i))
        for i, key in enumerate(keys[:100]):
            cache.put(key, table(60, i))
            assert cache.invalidate(key) is True
        delta = pool.forwarded() - forwarded
        local_hits = sum(n.counter("flightcache_node_doget_seconds_count", outcome="local_hit") - h
                         for n, h in zip(pool.nodes, hits))
        print(f"through the client: 300 gets, 100 puts, 100 invalidates: {delta:.0f} forwarded, {local_hits:.0f} local hits")
        assert delta == 0
        assert local_hits == 300
        # The reference: plain pyarrow through node 0 makes it forward every key it does
        # not own, exactly one relay each.
        not_local = sum(1 for key in keys[100:] if cache.owner(key) != "local-0")
    plain = flight.connect(pool.nodes[0].location)
    forwarded = pool.forwarded()
    for key in keys[100:]:
        plain.do_get(flight.Ticket(b"FCT\x01P" + key.encode())).read_all()
    plain.close()
    delta = pool.forwarded() - forwarded
    print(f"plain pyarrow through local-0: 200 gets, {delta:.0f} forwarded ({not_local} keys owned elsewhere)")
    assert delta == not_local > 0


class Load:
    """A thread of cache-aside calls (get; on a miss put) over `keys` until stopped;
    every exception is a failed call."""

    def __init__(self, cache, keys):
        self.cache, self.keys = cache, keys
        self.calls = self.misses = 0
        self.failures: list[BaseException] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self):
        rng = random.Random(7)
        while not self._stop.is_set():
            key = rng.choice(self.keys)
            try:
                self.calls += 1
                if self.cache.get(key) is None:
                    self.misses += 1
                    self.calls += 1
                    self.cache.put(key, table(20, int(key.rsplit("/", 1)[1])))
            except Exception as err:  # noqa: BLE001 - every failure counts
                self.failures.append(err)

    def stop(self):
        self._stop.set()
        self._thread.join(timeout=60)
        assert not self._thread.is_alive()


def wait_for(predicate, within_s=20.0):
    deadline = time.monotonic() + within_s
    while not predicate():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.05)


def hits_forwarded(pool, cache, keys):
    """Forwarded calls over one get of each key that is a hit (the keys are read once
    first, so misses — which the nodes look up on peers during their first 120 s — are
    left out)."""
    present = [key for key in keys if cache.get(key) is not None]
    before = pool.forwarded()
    for key in present:
        assert cache.get(key) is not None
    return pool.forwarded() - before, len(present)


@pytest.fixture()
def changing_pool(tmp_path):
    p = Pool(tmp_path, 3)
    yield p
    p.stop()


def test_a_node_added_to_the_ring_is_followed_with_no_failed_call(changing_pool):
    pool = changing_pool
    keys = [f"ring/{i}" for i in range(200)]
    with flightcache.connect(pool.nodes[0].location, ring_refresh_interval=0.5) as cache:
        for i, key in enumerate(keys):
            cache.put(key, table(20, i))
        load = Load(cache, keys)
        time.sleep(0.5)
        new = pool.add_node()
        pool.publish(pool.members + [{"id": "local-3", "address": new.address}], 2)
        for node in pool.nodes[:3]:
            node.action("rebalance")
        wait_for(lambda: cache.ring_version == 2)
        time.sleep(1.0)
        load.stop()
        moved = [key for key in keys if cache.owner(key) == "local-3"]
        forwarded, present = hits_forwarded(pool, cache, keys)
    print(f"scale-out: {load.calls} calls, {load.misses} misses, {len(load.failures)} failed; "
          f"{len(moved)} keys now owned by local-3; {forwarded:.0f} forwarded over {present} hits")
    assert load.failures == []
    assert 20 < len(moved) < 90
    assert forwarded == 0 and present > 150


@pytest.mark.parametrize("how", ["SIGTERM", "SIGKILL"])
def test_a_stopped_node_is_followed_with_no_failed_call(changing_pool, how):
    pool = changing_pool
    keys = [f"ring/{i}" for i in range(200)]
    with flightcache.connect(pool.nodes[0].location, ring_refresh_interval=0.5) as cache:
        for i, key in enumerate(keys):
            cache.put(key, table(20, i))
        gone = [key for key in keys if cache.owner(key) == "local-2"]
        load = Load(cache, keys)
        time.sleep(0.5)
        # SIGTERM: it hands its entries to each key's next choice first; SIGKILL: its
        # entries are gone (misses, which the load fills again).
        pool.nodes[2].stop() if how == "SIGTERM" else pool.nodes[2].kill()
        time.sleep(1.5)  # its keys meanwhile: refused at its address, sent through the seed
        fallbacks = cache.fallbacks
        assert fallbacks > 0
        pool.publish(pool.members[:2], 2)
        wait_for(lambda: cache.ring_version == 2)
        assert all(cache.owner(key) in ("local-0", "local-1") for key in keys)
        time.sleep(1.0)
        load.stop()
        forwarded, present = hits_forwarded(pool, cache, keys)
    print(f"node stopped ({how}): {load.calls} calls, {load.misses} misses, {len(load.failures)} failed; "
          f"{len(gone)} keys were on local-2, {fallbacks} calls sent through the seed before the ring "
          f"changed; {forwarded:.0f} forwarded over {present} hits")
    assert load.failures == []
    assert forwarded == 0 and present > 150
