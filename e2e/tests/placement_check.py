"""Where a pool's copies of each key really are, read from the nodes themselves: every
node is asked for its own entries (`ListFlights` as a peer, `x-flightcache-forwarded`, so
it answers from its store alone and does not fan out), and each key's holders are mapped
to the zones their pods run in. Usage:

    placement_check.py NAMESPACE POOL_PREFIX PEER_TOKEN KEY_PREFIX COPIES POD=ZONE...

Prints how many keys of KEY_PREFIX were found, how many copies each has and in how many
zones. Exits 1 when a key has more or fewer than COPIES holders, or when a key's COPIES
holders share a zone although the pool spans at least COPIES zones (the ring places a
key's second copy in another zone whenever one exists: docs/failure-model.md, placement).
"""

import collections
import os
import sys

import pyarrow.flight as flight

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from flight_client import open_client  # noqa: E402

# Each node lists at most 10,000 entries (docs/cache-node.md, ListFlights).
MAX_LISTED = 10_000


def own_keys(host: str, token: str, prefix: str) -> list[str]:
    client = open_client(host, 50051)
    try:
        options = flight.FlightCallOptions(
            headers=[(b"authorization", f"Bearer {token}".encode()),
                     (b"x-flightcache-forwarded", b"placement-check")],
            timeout=10)
        return ["/".join(p.decode() for p in info.descriptor.path)
                for info in client.list_flights(prefix.encode(), options)]
    finally:
        client.close()


def main() -> int:
    namespace, pool, token, prefix, copies = sys.argv[1:6]
    copies = int(copies)
    zones = dict(arg.split("=", 1) for arg in sys.argv[6:])
    holders = collections.defaultdict(list)
    for pod in sorted(zones):
        keys = own_keys(f"{pod}.{pool}-nodes.{namespace}.svc.cluster.local", token, prefix)
        if len(keys) >= MAX_LISTED:
            print(f"{pod} holds at least {MAX_LISTED} keys of {prefix}: too many to check")
            return 1
        print(f"{pod} ({zones[pod]}): {len(keys)} keys of {prefix}")
        for key in keys:
            holders[key].append(pod)
    spanned = len(set(zones.values()))
    wrong_count = [k for k, pods in holders.items() if len(pods) != copies]
    same_zone = [k for k, pods in holders.items()
                 if len(pods) == copies and len({zones[p] for p in pods}) < min(copies, spanned)]
    by_zones = collections.Counter(len({zones[p] for p in pods}) for pods in holders.values())
    print(f"{len(holders)} keys; copies in distinct zones: "
          + ", ".join(f"{n} zone(s): {count} keys" for n, count in sorted(by_zones.items()))
          + f"; pool spans {spanned} zones")
    for key in (wrong_count + same_zone)[:10]:
        print(f"  {key}: held by {holders[key]} in {[zones[p] for p in holders[key]]}")
    if not holders:
        print(f"BROKEN: no key of {prefix} found on any node")
        return 1
    if wrong_count:
        print(f"BROKEN: {len(wrong_count)} keys do not have exactly {copies} copies")
        return 1
    if same_zone:
        print(f"BROKEN: {len(same_zone)} keys have their {copies} copies in fewer zones than the pool spans")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
