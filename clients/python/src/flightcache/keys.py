"""Cache keys: what a user names an entry with, and the node's byte forms of it.

A key is a **path** (segments joined by ``/``: ``"reports/daily"`` and
``["reports", "daily"]`` are the same key) or a **command** (opaque bytes, e.g. a
normalised SQL text). On the wire (``docs/cache-node.md``, "Keys and tickets"):

- the key's *store bytes* are ``b"P" + path`` or ``b"C" + command``; the ring hashes them;
- the *ticket* is ``b"FCT\\x01" + store bytes``;
- the *descriptor* is a PATH ``FlightDescriptor`` (one segment per ``/`` part) or a CMD one.

Pure; no I/O.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Union

import pyarrow.flight as flight

from .errors import InvalidArgument

#: Longest key the node accepts, in bytes (``cache_node::key::MAX_KEY_BYTES``).
MAX_KEY_BYTES = 64 * 1024

#: The ticket prefix: magic ``FCT`` and version 1.
TICKET_PREFIX = b"FCT\x01"

#: What a key may be given as: a path string, path segments, command bytes, or a
#: ``pyarrow.flight.FlightDescriptor``.
KeyLike = Union["CacheKey", str, Sequence[str], bytes, bytearray, memoryview, flight.FlightDescriptor]


@dataclass(frozen=True)
class CacheKey:
    """A validated key: ``kind`` is ``"P"`` (path) or ``"C"`` (command), ``body`` the
    path's UTF-8 bytes or the command bytes."""

    kind: str
    body: bytes

    @property
    def store_bytes(self) -> bytes:
        """The key as the node stores and hashes it: kind byte + key bytes."""
        return self.kind.encode() + self.body

    @property
    def ticket(self) -> bytes:
        """The DoGet ticket that names this key (version 1)."""
        return TICKET_PREFIX + self.store_bytes

    @property
    def descriptor(self) -> flight.FlightDescriptor:
        """The FlightDescriptor a DoPut names this key with."""
        if self.kind == "P":
            return flight.FlightDescriptor.for_path(*self.body.decode().split("/"))
        return flight.FlightDescriptor.for_command(self.body)

    def __str__(self) -> str:
        if self.kind == "P":
            return self.body.decode()
        return f"command {self.body[:40]!r}"


def to_key(key: KeyLike) -> CacheKey:
    """Reads a key from what a user passed.

    ``str``: a path; a list or tuple of ``str``: path segments (joined by ``/``);
    ``bytes``: a command; a ``FlightDescriptor``: its path or command; a
    :class:`CacheKey`: itself.

    Raises:
        InvalidArgument: an empty key, a key longer than 64 KiB, or another type.
    """
    if isinstance(key, CacheKey):
        return key
    if isinstance(key, flight.FlightDescriptor):
        if key.descriptor_type == flight.DescriptorType.PATH:
            return to_key([p.decode() if isinstance(p, bytes) else p for p in key.path])
        if key.descriptor_type == flight.DescriptorType.CMD:
            return to_key(bytes(key.command))
        raise InvalidArgument("the descriptor is neither a PATH nor a CMD descriptor")
    if isinstance(key, str):
        parsed = CacheKey("P", key.encode())
    elif isinstance(key, (bytes, bytearray, memoryview)):
        parsed = CacheKey("C", bytes(key))
    elif isinstance(key, Sequence) and all(isinstance(part, str) for part in key):
        parsed = CacheKey("P", "/".join(key).encode())
    else:
        raise InvalidArgument(
            f"a key is a path str, a sequence of str segments, command bytes or a "
            f"FlightDescriptor, not {type(key).__name__}")
    if parsed.kind == "P" and not parsed.body.strip(b"/"):
        raise InvalidArgument("the key's path is empty; name the entry, e.g. 'reports/daily'")
    if not parsed.body:
        raise InvalidArgument("the key's command is empty; use the query text or another key")
    if len(parsed.body) > MAX_KEY_BYTES:
        raise InvalidArgument(
            f"the key is {len(parsed.body)} bytes; keys are at most {MAX_KEY_BYTES} bytes")
    return parsed
