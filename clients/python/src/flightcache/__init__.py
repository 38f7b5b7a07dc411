"""FlightCache's Python client: a ring-aware cache client over ``pyarrow.flight``.

.. code-block:: python

    import flightcache

    with flightcache.connect("grpc://127.0.0.1:50051", token="...") as cache:
        cache.put("reports/daily", table, ttl=600)
        table = cache.get("reports/daily")            # None on a miss
        table = cache.get_or_compute("reports/daily", run_query, ttl=600)

Modules: :mod:`flightcache.client` (the client and :func:`connect`),
:mod:`flightcache.ring` (the node's hash and ring), :mod:`flightcache.keys` (keys and
tickets), :mod:`flightcache.errors` (the exceptions), :mod:`flightcache.settings` (the
gRPC client settings). Reference: ``docs/clients.md``.
"""

from .client import TTL, Client, LeaseOutcome, PutResult, connect
from .errors import (
    Aborted,
    DeadlineExceeded,
    FlightCacheError,
    InternalError,
    InvalidArgument,
    NotFound,
    PermissionDenied,
    ProtocolError,
    ResourceExhausted,
    Unauthenticated,
    Unavailable,
    Unimplemented,
)
from .keys import CacheKey, KeyLike, to_key
from .ring import Member, Ring

__version__ = "0.1.0"

__all__ = [
    "Aborted", "CacheKey", "Client", "DeadlineExceeded", "FlightCacheError", "InternalError",
    "InvalidArgument", "KeyLike", "LeaseOutcome", "Member", "NotFound", "PermissionDenied",
    "ProtocolError", "PutResult", "ResourceExhausted", "Ring", "TTL", "Unauthenticated",
    "Unavailable", "Unimplemented", "connect", "to_key",
]
