"""The routing ring: which member owns a key, computed exactly as the node computes it.

Rendezvous (highest random weight) hashing over stable member ids, the hash and the
zone rule of ``docs/cache-node.md`` ("The ring", "Zones") and
``cache-node/src/routing/ring.rs``. All arithmetic wraps on 64 bits. The golden values
of the node's own tests (``hash_is_stable``, ``zone_diverse_choices_are_stable``) are
this module's tests too (``clients/python/tests/test_ring.py``).

Pure; no I/O.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

_MASK = (1 << 64) - 1
_K1 = 0x9E3779B97F4A7C15
_K2 = 0xFF51AFD7ED558CCD
_K3 = 0xC4CEB9FE1A85EC53

#: Member states; only ``active`` members own keys.
ACTIVE, JOINING, DRAINING = "active", "joining", "draining"


def _fmix64(h: int) -> int:
    """murmur3's 64-bit finaliser."""
    h ^= h >> 33
    h = (h * _K2) & _MASK
    h ^= h >> 33
    h = (h * _K3) & _MASK
    h ^= h >> 33
    return h


def key_hash(data: bytes) -> int:
    """The node's stable 64-bit hash of key store bytes (and of member ids).

    ``h = K1 ^ (len * K2)``; for each 8-byte little-endian word (the last one
    zero-padded): ``h = (h ^ w) * K1; h ^= h >> 29``; then ``fmix64(h)``.
    """
    h = _K1 ^ ((len(data) * _K2) & _MASK)
    for start in range(0, len(data), 8):
        word = int.from_bytes(data[start:start + 8].ljust(8, b"\0"), "little")
        h = ((h ^ word) * _K1) & _MASK
        h ^= h >> 29
    return _fmix64(h)


def _rotl32(x: int) -> int:
    return ((x << 32) | (x >> 32)) & _MASK


def score(key_hash_value: int, member_hash: int) -> int:
    """A member's score for a key: ``fmix64(hash(key) ^ (rotl(hash(id), 32) * K1))``."""
    return _fmix64(key_hash_value ^ ((_rotl32(member_hash) * _K1) & _MASK))


@dataclass(frozen=True)
class Member:
    """One ring member, as the ``topology`` action lists it."""

    id: str
    address: str
    state: str = ACTIVE
    zone: str | None = None
    seed: int = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "seed", key_hash(self.id.encode()))


class Ring:
    """A versioned set of members; ``owner`` and ``owners`` as the node computes them."""

    def __init__(self, version: int, members: Iterable[Member], replicas: int = 1):
        self.version = version
        self.replicas = replicas
        self.members: tuple[Member, ...] = tuple(members)
        self._by_id = {member.id: member for member in self.members}
        self._owning = [member for member in self.members if member.state == ACTIVE]
        zones = {member.zone for member in self._owning}
        # Members without a zone count as one zone; one zone in all: plain rank order.
        self._zoned = len(zones) > 1

    @classmethod
    def from_topology_answer(cls, answer: dict[str, Any]) -> Ring:
        """Builds the ring of a ``topology`` action answer
        (``{"memberId", "version", "replicas", "members": [{"id", "address", "state", "zone"}]}``)."""
        members = [
            Member(id=str(m["id"]), address=str(m["address"]),
                   state=str(m.get("state") or ACTIVE), zone=m.get("zone"))
            for m in answer.get("members", [])
        ]
        return cls(int(answer.get("version", 0)), members, int(answer.get("replicas", 1) or 1))

    def member(self, member_id: str) -> Member | None:
        """The member with ``member_id``, if any."""
        return self._by_id.get(member_id)

    def owner(self, store_bytes: bytes) -> Member | None:
        """The owner of a key given by its store bytes: the active member with the highest
        score (ties: the greater id). ``None`` when no member is active."""
        h = key_hash(store_bytes)
        best: Member | None = None
        best_score = -1
        for member in self._owning:
            s = score(h, member.seed)
            if s > best_score or (s == best_score and best is not None and member.id > best.id):
                best, best_score = member, s
        return best

    def _ranked(self, store_bytes: bytes) -> list[Member]:
        h = key_hash(store_bytes)
        return sorted(self._owning, key=lambda m: (score(h, m.seed), m.id), reverse=True)

    def owners(self, store_bytes: bytes, n: int) -> list[Member]:
        """The key's first ``n`` choices, best first: the owner, then zone-diverse
        fallbacks (each member of a zone no earlier choice has, in rank order, then the
        rest in rank order). Only active members."""
        ranked = self._ranked(store_bytes)
        if not self._zoned or n <= 1:
            return ranked[:n]
        chosen: list[int] = []
        zones_used: list[str | None] = []
        for position, member in enumerate(ranked):
            if len(chosen) == n:
                break
            if member.zone not in zones_used:
                chosen.append(position)
                zones_used.append(member.zone)
        for position in range(len(ranked)):
            if len(chosen) == n:
                break
            if position not in chosen:
                chosen.append(position)
        return [ranked[position] for position in chosen]


def owner_ids(ring: Ring, keys: Sequence[bytes]) -> list[str | None]:
    """The owner id of each key (store bytes); a convenience for tests and tools."""
    return [owner.id if (owner := ring.owner(key)) else None for key in keys]
