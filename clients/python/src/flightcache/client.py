"""The FlightCache client: cache reads and writes routed to each key's owner.

:func:`connect` dials the address it is given (the *seed*: in a cluster the pool's client
Service, locally any node), asks it for the pool's ring (the ``topology`` action) and from
then on sends each key's calls straight to the key's owner, computed with the node's own
hash (:mod:`flightcache.ring`). A background thread asks for the ring again every
``ring_refresh_interval`` seconds, and at once after a call to an owner failed; a newer ring
version replaces the one held, an older one is ignored. A call whose owner cannot be
reached (connection refused or lost, a hung node ended by the keepalive, the owner's own
``UNAVAILABLE``) is sent once more through the seed, whose node forwards it (and answers a
read of a key on a dead node as a miss); the owner is then skipped for
``owner_retry_after`` seconds. Without a ring (a single node, a node without a topology,
or a token that may not read the ring) every call goes to the seed.

Does network I/O (pyarrow Flight calls); holds the ring, one Flight client per address
and one daemon thread that refreshes the ring.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Literal, TypeVar, Union, cast

import pyarrow as pa
import pyarrow.flight as flight

from . import settings
from .errors import (
    FLIGHT_ERRORS,
    Aborted,
    FlightCacheError,
    InvalidArgument,
    NotFound,
    PermissionDenied,
    ProtocolError,
    ResourceExhausted,
    Unavailable,
    Unimplemented,
    from_flight,
)
from .keys import CacheKey, KeyLike, to_key
from .ring import Ring

log = logging.getLogger("flightcache")

T = TypeVar("T")

#: A TTL: seconds (``int``/``float``), a ``timedelta``, or a duration string the node
#: reads (``"30s"``, ``"15m"``, ``"1h 30m"``).
TTL = Union[int, float, timedelta, str]

#: What the ``lease`` action answers (``docs/cache-node.md``, "Miss coalescing").
LeaseOutcome = Literal["granted", "hit", "filled", "timeout"]

#: How long the node makes a lease waiter wait for the holder's put, at most (10 s), plus
#: room for the answer: the deadline of a ``lease`` call is at least this.
LEASE_CALL_SECONDS = 15.0

#: How many times ``get_or_compute`` asks for the lease before it computes regardless.
LEASE_ROUNDS = 8

_SCHEMES = {"grpc": "grpc", "grpc+tcp": "grpc", "grpc+tls": "grpc+tls"}


@dataclass(frozen=True)
class PutResult:
    """What the node stored (the DoPut's ``PutResult`` JSON)."""

    rows: int
    batches: int
    #: The entry's weight charged to the node's byte budget.
    bytes: int
    #: The entry's TTL in milliseconds.
    ttl_ms: int


def _parse_uri(uri: str) -> tuple[str, str]:
    """``(scheme, host:port)`` of ``grpc://h:p``, ``grpc+tcp://h:p``, ``grpc+tls://h:p``
    or a bare ``h:p`` (plaintext)."""
    scheme, sep, rest = uri.partition("://")
    if not sep:
        scheme, rest = "grpc", uri
    if scheme not in _SCHEMES:
        raise InvalidArgument(f"unsupported scheme {scheme!r} in {uri!r}; use grpc:// or grpc+tls://")
    address = rest.rstrip("/")
    host, colon, port = address.rpartition(":")
    if not colon or not host or not port.isdigit():
        raise InvalidArgument(f"{uri!r} names no host:port")
    return _SCHEMES[scheme], address


def _ttl_text(ttl: TTL) -> str:
    """A TTL as the node's duration syntax (whole milliseconds)."""
    if isinstance(ttl, str):
        if not ttl.strip():
            raise InvalidArgument("the TTL is empty; use e.g. 30, timedelta(minutes=5) or '1h'")
        return ttl
    seconds = ttl.total_seconds() if isinstance(ttl, timedelta) else float(ttl)
    millis = round(seconds * 1000)
    if millis <= 0:
        raise InvalidArgument(f"the TTL must be at least 1 ms, not {seconds} s")
    return f"{millis}ms"


def _json_answer(body: bytes, what: str, address: str) -> dict[str, Any]:
    try:
        answer = json.loads(body)
    except ValueError as err:
        raise ProtocolError(f"the {what} answer is not JSON: {body[:200]!r}", address=address) from err
    if not isinstance(answer, dict):
        raise ProtocolError(f"the {what} answer is not a JSON object: {body[:200]!r}", address=address)
    return answer


class Client:
    """A connection to a FlightCache pool. Make one with :func:`connect`.

    Thread-safe: one client may serve many threads. Not fork-safe: make one per process
    (after the fork). Close it with :meth:`close` or use it as a context manager.
    """

    def __init__(
        self,
        uri: str,
        *,
        token: str | None = None,
        tls_root_certs: bytes | str | None = None,
        cert_chain: bytes | str | None = None,
        private_key: bytes | str | None = None,
        override_hostname: str | None = None,
        timeout: float | None = 30.0,
        routing: bool = True,
        ring_refresh_interval: float = 5.0,
        owner_retry_after: float = 1.0,
    ) -> None:
        self._scheme, self.seed = _parse_uri(uri)
        if self._scheme == "grpc" and (tls_root_certs or cert_chain or private_key):
            raise InvalidArgument(f"TLS settings given for the plaintext address {uri!r}; use grpc+tls://")
        self._tls: dict[str, Any] = {}
        if tls_root_certs is not None:
            self._tls["tls_root_certs"] = tls_root_certs
        if cert_chain is not None:
            self._tls["cert_chain"] = cert_chain
        if private_key is not None:
            self._tls["private_key"] = private_key
        if override_hostname is not None:
            self._tls["override_hostname"] = override_hostname
        self.timeout = timeout
        self._headers = [(b"authorization", b"Bearer " + token.encode())] if token else []
        self._routing = routing
        self._refresh_interval = ring_refresh_interval
        self._owner_retry_after = owner_retry_after
        self._lock = threading.Lock()
        self._clients: dict[str, flight.FlightClient] = {}
        self._down: dict[str, float] = {}
        self._ring: Ring | None = None
        self._closed = False
        self._fallbacks = 0
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None
        if routing:
            try:
                self.refresh_ring()
            except BaseException:
                self.close()
                raise
            if self._routing:
                self._thread = threading.Thread(
                    target=self._refresh_loop, name="flightcache-ring", daemon=True)
                self._thread.start()

    # -- connections -------------------------------------------------------------------

    def _options(self, timeout: float | None = None) -> flight.FlightCallOptions:
        return flight.FlightCallOptions(headers=self._headers, timeout=timeout or self.timeout)

    def _client(self, address: str) -> flight.FlightClient:
        with self._lock:
            if self._closed:
                raise FlightCacheError("the client is closed")
            client = self._clients.get(address)
            if client is None:
                options = settings.seed_options() if address == self.seed else settings.owner_options()
                client = flight.FlightClient(f"{self._scheme}://{address}",
                                             generic_options=options, **self._tls)
                self._clients[address] = client
            return client

    # -- the ring ----------------------------------------------------------------------

    @property
    def ring(self) -> Ring | None:
        """The ring calls are routed by (``None``: every call goes to the seed)."""
        return self._ring

    @property
    def ring_version(self) -> int:
        """The version of the ring calls are routed by (0: none, all calls to the seed)."""
        ring = self._ring
        return ring.version if ring else 0

    def refresh_ring(self) -> int:
        """Asks for the ring (``DoAction topology``) now: from the seed, else from any
        known member. A newer version replaces the ring held; returns the version held.

        A node without a topology answers version 0: calls keep going to the seed. The
        client token reads the ring; a node that refuses it (``PERMISSION_DENIED``: images
        before ``topology`` was a client action) or lacks the action turns routing off with
        one warning: every call then goes to the seed, which forwards.

        Raises:
            FlightCacheError: no node answered (the error of the seed).
        """
        ring = self._ring
        candidates = [self.seed]
        if ring is not None:
            candidates += [m.address for m in ring.members if m.address != self.seed]
        first_error: FlightCacheError | None = None
        for address in candidates:
            try:
                results = list(self._client(address).do_action(
                    flight.Action("topology", b""),
                    flight.FlightCallOptions(headers=self._headers, timeout=self.timeout)))
            except FLIGHT_ERRORS as err:
                error = from_flight(err, address)
                if isinstance(error, (PermissionDenied, Unimplemented)):
                    log.warning("cannot read the pool's ring (%s); every call goes to %s, which forwards",
                                error, self.seed)
                    self._routing = False
                    self._stop.set()
                    return self.ring_version
                first_error = first_error or error
                continue
            body = results[0].body.to_pybytes() if results else b""
            answer = _json_answer(body, "topology", address)
            fetched = Ring.from_topology_answer(answer)
            with self._lock:
                if fetched.version > 0 and (self._ring is None or fetched.version > self._ring.version):
                    if self._ring is not None:
                        log.info("ring version %d -> %d", self._ring.version, fetched.version)
                    self._ring = fetched
            return self.ring_version
        assert first_error is not None
        raise first_error

    def _refresh_loop(self) -> None:
        while not self._stop.is_set():
            self._wake.wait(self._refresh_interval)
            self._wake.clear()
            if self._stop.is_set():
                return
            try:
                self.refresh_ring()
            except FlightCacheError as err:
                log.debug("ring refresh failed: %s", err)
            except Exception:  # the thread must not die: routing would freeze
                log.exception("ring refresh failed")

    @property
    def fallbacks(self) -> int:
        """How many calls were sent through the seed because the key's owner could not be
        reached (a count since the client was made)."""
        return self._fallbacks

    def owner(self, key: KeyLike) -> str | None:
        """The member id that owns ``key`` under the ring held (``None`` without a ring)."""
        ring = self._ring
        member = ring.owner(to_key(key).store_bytes) if ring else None
        return member.id if member else None

    def address_for(self, key: KeyLike) -> str:
        """The ``host:port`` a call for ``key`` goes to now: its owner, or the seed
        (no ring, or the owner failed less than ``owner_retry_after`` seconds ago)."""
        return self._route(to_key(key))

    def _route(self, key: CacheKey) -> str:
        ring = self._ring
        if ring is None or not self._routing:
            return self.seed
        owner = ring.owner(key.store_bytes)
        if owner is None:
            return self.seed
        until = self._down.get(owner.address)
        if until is not None:
            if time.monotonic() < until:
                return self.seed
            self._down.pop(owner.address, None)
        return owner.address

    def _routed(self, key: CacheKey, call: Callable[[flight.FlightClient, str], T]) -> T:
        """Runs ``call`` against the key's owner; if the owner is unreachable, once more
        against the seed."""
        address = self._route(key)
        try:
            return call(self._client(address), address)
        except FLIGHT_ERRORS as err:
            error = from_flight(err, address)
            if address == self.seed or not isinstance(error, Unavailable):
                raise error from err
            log.debug("owner %s failed (%s); sending the call through %s", address, error, self.seed)
            self._down[address] = time.monotonic() + self._owner_retry_after
            self._fallbacks += 1
            self._wake.set()
        try:
            return call(self._client(self.seed), self.seed)
        except FLIGHT_ERRORS as err:
            raise from_flight(err, self.seed) from err

    def _seed_call(self, call: Callable[[flight.FlightClient, str], T]) -> T:
        try:
            return call(self._client(self.seed), self.seed)
        except FLIGHT_ERRORS as err:
            raise from_flight(err, self.seed) from err

    # -- cache calls -------------------------------------------------------------------

    def get(self, key: KeyLike) -> pa.Table | None:
        """The table cached under ``key``, or ``None`` on a miss.

        One ``DoGet`` with the ticket built from the key (``FCT\\x01`` + kind + key), sent
        to the key's owner. A key whose node is down is a miss too.

        Raises:
            FlightCacheError: any failure but a miss (e.g. :class:`Unauthenticated`).
        """
        parsed = to_key(key)
        ticket = flight.Ticket(parsed.ticket)
        try:
            return self._routed(parsed, lambda c, _: c.do_get(ticket, self._options()).read_all())
        except NotFound:
            return None

    def put(self, key: KeyLike, table: pa.Table | pa.RecordBatch, ttl: TTL | None = None,
            tags: Sequence[str] | None = None) -> PutResult:
        """Stores ``table`` under ``key`` (replacing what was there), on the key's owner.

        One ``DoPut``: the descriptor names the key; with ``ttl`` or ``tags`` the first
        batch carries ``{"ttl": "<ms>ms", "tags": [...]}`` as its ``app_metadata`` (a
        table without rows sends one batch of 0 rows for it). An empty table (a schema,
        no rows) is a result too. ``tags`` (e.g. the tables the result was computed
        from; at most 16, each 1 to 128 printable ASCII characters) let
        :meth:`invalidate_tags` remove it without knowing its key.

        Raises:
            ResourceExhausted: the entry is larger than the node's max entry size or budget.
            Aborted: an invalidation of the key arrived while the put was in flight.
            InvalidArgument: a bad key, TTL or tag.
            FlightCacheError: any other failure.
        """
        parsed = to_key(key)
        if isinstance(table, pa.RecordBatch):
            table = pa.Table.from_batches([table])
        if not isinstance(table, pa.Table):
            raise InvalidArgument(f"put takes a pyarrow.Table or RecordBatch, not {type(table).__name__}")
        options: dict[str, Any] = {}
        if ttl is not None:
            options["ttl"] = _ttl_text(ttl)
        if tags is not None:
            if isinstance(tags, str) or not all(isinstance(tag, str) for tag in tags):
                raise InvalidArgument("tags is a list of strings, e.g. ['sales.orders']")
            options["tags"] = list(tags)
        metadata = json.dumps(options).encode() if options else None
        descriptor = parsed.descriptor
        batches = table.to_batches()
        if metadata is not None and not batches:
            # The node reads options only from a message with an IPC header (a schema or a
            # batch; a metadata-only message is skipped), and pyarrow's schema message has
            # no app_metadata: an empty result carries its TTL on one batch of 0 rows.
            batches = [pa.RecordBatch.from_pylist([], schema=table.schema)]

        def call(client: flight.FlightClient, address: str) -> PutResult:
            writer, reader = client.do_put(descriptor, table.schema, self._options())
            try:
                for index, batch in enumerate(batches):
                    if index == 0 and metadata is not None:
                        writer.write_with_metadata(batch, pa.py_buffer(metadata))
                    else:
                        writer.write_batch(batch)
                writer.done_writing()
                answer = reader.read()
            finally:
                writer.close()
            body = answer.to_pybytes() if answer is not None else b""
            summary = _json_answer(body, "DoPut", address)
            return PutResult(rows=int(summary.get("rows", 0)), batches=int(summary.get("batches", 0)),
                             bytes=int(summary.get("bytes", 0)), ttl_ms=int(summary.get("ttlMs", 0)))

        return self._routed(parsed, call)

    def _action(self, client: flight.FlightClient, kind: str, body: bytes,
                timeout: float | None = None) -> bytes:
        results = list(client.do_action(flight.Action(kind, body), self._options(timeout)))
        return results[0].body.to_pybytes() if results else b""

    def invalidate(self, key: KeyLike) -> bool:
        """Removes the entry under ``key``; ``True`` if there was one.

        One ``DoAction invalidate`` whose body is the key's ticket, sent to the owner
        (which removes every copy).
        """
        parsed = to_key(key)
        answer = self._routed(parsed, lambda c, a: _json_answer(
            self._action(c, "invalidate", parsed.ticket), "invalidate", a))
        return bool(answer.get("removed", False))

    def invalidate_prefix(self, prefix: str) -> int:
        """Removes every path entry whose key starts with ``prefix`` (``"reports/"``) on
        every member of the pool; returns how many.

        One ``DoAction invalidate-prefix`` to the seed, which runs it on every member.

        Raises:
            InvalidArgument: an empty prefix (use a non-empty one; clearing the pool is
                the admin's ``clear``).
            Unavailable: a member could not be reached (the others removed theirs).
        """
        if not isinstance(prefix, str) or not prefix:
            raise InvalidArgument("invalidate_prefix takes a non-empty path prefix such as 'reports/'")
        answer = self._seed_call(lambda c, a: _json_answer(
            self._action(c, "invalidate-prefix", prefix.encode()), "invalidate-prefix", a))
        return int(answer.get("removed", 0))

    def invalidate_tags(self, tags: Sequence[str]) -> int:
        """Removes every entry put with one of ``tags``, on every member of the pool
        (copies included); returns how many entries went.

        One ``DoAction invalidate-tag`` (body ``{"tags": [...]}``) to the seed, which runs
        it on every member. A put of a tagged entry still in flight when it arrives is
        refused (:class:`Aborted`), whenever its tags were sent.

        Raises:
            InvalidArgument: no tag, more than 64, or a tag that breaks the rules.
            Unavailable: a member could not be reached (the others removed theirs).
        """
        if isinstance(tags, str) or not tags or not all(isinstance(tag, str) for tag in tags):
            raise InvalidArgument("invalidate_tags takes a non-empty list of tags, e.g. ['sales.orders']")
        body = json.dumps({"tags": list(tags)}).encode()
        answer = self._seed_call(lambda c, a: _json_answer(
            self._action(c, "invalidate-tag", body), "invalidate-tag", a))
        return int(answer.get("removed", 0))

    def lease(self, key: KeyLike) -> LeaseOutcome:
        """Asks the key's owner for its fill lease (``DoAction lease``, body the ticket):

        - ``"granted"``: this caller computes the value and puts it (within 10 s);
        - ``"filled"``: another caller's put arrived while this one waited: ``get`` it;
        - ``"hit"``: the entry is cached: ``get`` it;
        - ``"timeout"``: the holder did not put within 10 s: compute it yourself.

        The call waits up to 10 s on the node while another caller holds the lease.
        """
        parsed = to_key(key)
        timeout = max(self.timeout or 0.0, LEASE_CALL_SECONDS)
        answer = self._routed(parsed, lambda c, a: _json_answer(
            self._action(c, "lease", parsed.ticket, timeout), "lease", a))
        outcome = answer.get("lease")
        if outcome not in ("granted", "hit", "filled", "timeout"):
            raise ProtocolError(f"unknown lease answer {answer!r}", address=self.address_for(parsed))
        return cast(LeaseOutcome, outcome)

    def get_or_compute(self, key: KeyLike, compute: Callable[[], pa.Table],
                       ttl: TTL | None = None, tags: Sequence[str] | None = None) -> pa.Table:
        """Cache-aside with miss coalescing: the cached table, or ``compute()``'s, put.

        1. ``get``: a hit is returned.
        2. On a miss, ``lease``: the first of any number of concurrent callers (in any
           process) is ``granted``, calls ``compute()``, puts the result (with ``ttl``)
           and returns it; the others wait on the node for that put and then ``get`` it.
        3. If the lease holder fails (its ``compute`` raises, its process dies, its put is
           refused), the lease ends with its put or after 10 s; the waiters then ask again
           and one of them is granted. A ``timeout`` answer (the caller waited 10 s and a
           later holder has not put yet) makes the caller ask again; after
           ``LEASE_ROUNDS`` answers without the table it computes for itself.

        The computed table is returned even when its put fails with
        :class:`ResourceExhausted` (too large to cache) or :class:`Aborted` (invalidated
        meanwhile); those are logged at warning. Other errors are raised; ``compute``'s own
        exceptions propagate unchanged.
        """
        parsed = to_key(key)
        hit = self.get(parsed)
        if hit is not None:
            return hit
        for _ in range(LEASE_ROUNDS):
            outcome = self.lease(parsed)
            if outcome == "granted":
                return self._compute_and_put(parsed, compute, ttl, tags)
            if outcome == "timeout":
                # Another caller took the lease after the one this caller waited on ran
                # out (its holder failed), and has not put yet: wait on that one.
                continue
            got = self.get(parsed)
            if got is not None:
                return got
            # Filled or hit, yet gone again (evicted, invalidated): ask for the lease anew.
        return self._compute_and_put(parsed, compute, ttl, tags)

    def _compute_and_put(self, key: CacheKey, compute: Callable[[], pa.Table], ttl: TTL | None,
                         tags: Sequence[str] | None = None) -> pa.Table:
        table = compute()
        if isinstance(table, pa.RecordBatch):
            table = pa.Table.from_batches([table])
        if not isinstance(table, pa.Table):
            raise InvalidArgument(f"compute() returned {type(table).__name__}, not a pyarrow.Table")
        try:
            self.put(key, table, ttl, tags)
        except (ResourceExhausted, Aborted) as err:
            log.warning("computed %s but could not cache it: %s", key, err)
        return table

    # -- lifecycle ---------------------------------------------------------------------

    def close(self) -> None:
        """Stops the ring refresh and closes every connection. Idempotent."""
        self._stop.set()
        self._wake.set()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=5)
        with self._lock:
            self._closed = True
            clients, self._clients = list(self._clients.values()), {}
        for client in clients:
            client.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:  # pragma: no cover - best effort at interpreter exit
        try:
            self.close()
        except Exception:
            pass


def connect(
    uri: str,
    *,
    token: str | None = None,
    tls_root_certs: bytes | str | None = None,
    cert_chain: bytes | str | None = None,
    private_key: bytes | str | None = None,
    override_hostname: str | None = None,
    timeout: float | None = 30.0,
    routing: bool = True,
    ring_refresh_interval: float = 5.0,
    owner_retry_after: float = 1.0,
) -> Client:
    """Connects to a FlightCache pool and fetches its ring.

    Args:
        uri: ``grpc://host:port`` or ``grpc+tls://host:port`` of any node; in a cluster
            the pool's client Service (``grpc://results-default.<ns>.svc:50051``).
        token: the pool's client token, sent as ``authorization: Bearer <token>`` on
            every call.
        tls_root_certs, cert_chain, private_key, override_hostname: TLS, as
            ``pyarrow.flight.FlightClient`` takes them (PEM): the CA to trust, and a
            client certificate for pools that require one.
        timeout: each call's deadline in seconds (``None``: none); a ``lease`` call
            gets at least 15 s (the node may hold it 10 s).
        routing: ``False`` sends every call to ``uri`` (for clients outside the
            cluster, which cannot reach the members' own addresses).
        ring_refresh_interval: seconds between two ring fetches.
        owner_retry_after: seconds an owner that failed a call is skipped (its keys go
            through ``uri``) before it is tried again.

    Raises:
        Unavailable: the node at ``uri`` could not be reached.
        Unauthenticated: the token is missing or wrong (the ring fetch is the first call).
    """
    return Client(uri, token=token, tls_root_certs=tls_root_certs,
                  cert_chain=cert_chain, private_key=private_key, override_hostname=override_hostname,
                  timeout=timeout, routing=routing, ring_refresh_interval=ring_refresh_interval,
                  owner_retry_after=owner_retry_after)

