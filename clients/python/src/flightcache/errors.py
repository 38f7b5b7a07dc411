"""The exceptions a FlightCache call raises, one per thing a user can act on.

Every failed call raises a :class:`FlightCacheError` subclass chosen by the gRPC status
code the node answered (or that gRPC made up for a connection that failed). Its
``message`` is the node's own status message (``"path 'x' is not cached …"``), its
``code`` the gRPC code name (``"UNAVAILABLE"``), its ``address`` the node called. The
pyarrow exception it came from is its ``__cause__``.

======================  ====================  =============================================
exception               gRPC code             what to do
======================  ====================  =============================================
``Unauthenticated``     UNAUTHENTICATED       pass the pool's client token (``token=``)
``PermissionDenied``    PERMISSION_DENIED     the action needs the admin token
``InvalidArgument``     INVALID_ARGUMENT,     fix the key, the TTL or the table
                        FAILED_PRECONDITION,
                        OUT_OF_RANGE
``NotFound``            NOT_FOUND             (``get`` returns ``None`` instead)
``ResourceExhausted``   RESOURCE_EXHAUSTED    the entry is over the node's max entry size
                                              or budget: cache less, or size the pool
``Aborted``             ABORTED               an invalidation raced the put: put again
``Unavailable``         UNAVAILABLE           no node could be reached: retry later
``DeadlineExceeded``    DEADLINE_EXCEEDED     the call outlived ``timeout``
``Unimplemented``       UNIMPLEMENTED         the node does not offer it (older node)
``InternalError``       INTERNAL, UNKNOWN,    a bug; report it with the message
                        DATA_LOSS
``ProtocolError``       (none)                an answer that breaks the wire contract
======================  ====================  =============================================

Pure; no I/O.
"""

from __future__ import annotations

import re

import pyarrow as pa
import pyarrow.flight as flight


class FlightCacheError(Exception):
    """A FlightCache call failed.

    Attributes:
        code: the gRPC status code name (``"NOT_FOUND"``), or ``None`` when no status was
            involved (a client-side check, a malformed answer).
        message: the node's status message (or the client's own, for a client-side check).
        address: the ``host:port`` called, when a call was made.
    """

    code: str | None = None

    def __init__(self, message: str, *, code: str | None = None, address: str | None = None):
        super().__init__(message)
        self.message = message
        if code is not None:
            self.code = code
        self.address = address

    def __str__(self) -> str:
        where = f" (node {self.address})" if self.address else ""
        code = f"{self.code}: " if self.code else ""
        return f"{code}{self.message}{where}"


class Unauthenticated(FlightCacheError):
    """No token, or a wrong one: pass the pool's client token."""

    code = "UNAUTHENTICATED"


class PermissionDenied(FlightCacheError):
    """The token is valid but may not do this (an admin action with a client token)."""

    code = "PERMISSION_DENIED"


class InvalidArgument(FlightCacheError):
    """The request is wrong (a bad key, TTL or table); the message says what to change."""

    code = "INVALID_ARGUMENT"


class NotFound(FlightCacheError):
    """The key is not cached. ``get`` returns ``None`` instead of raising this."""

    code = "NOT_FOUND"


class ResourceExhausted(FlightCacheError):
    """The entry is larger than the node's max entry size, or cannot get room in its
    budget."""

    code = "RESOURCE_EXHAUSTED"


class Aborted(FlightCacheError):
    """An invalidation covering the key arrived while the put was in flight: nothing was
    stored; put again."""

    code = "ABORTED"


class Unavailable(FlightCacheError):
    """No node could be reached, or the node could not reach what it needed."""

    code = "UNAVAILABLE"


class DeadlineExceeded(FlightCacheError):
    """The call did not finish within its timeout."""

    code = "DEADLINE_EXCEEDED"


class Unimplemented(FlightCacheError):
    """The node does not offer this call or action."""

    code = "UNIMPLEMENTED"


class InternalError(FlightCacheError):
    """The node failed internally (or gRPC reported an unknown error)."""

    code = "INTERNAL"


class ProtocolError(FlightCacheError):
    """The node's answer does not follow the wire contract (e.g. a JSON answer that does
    not parse)."""


_BY_CODE: dict[str, type[FlightCacheError]] = {
    "UNAUTHENTICATED": Unauthenticated,
    "PERMISSION_DENIED": PermissionDenied,
    "INVALID_ARGUMENT": InvalidArgument,
    "FAILED_PRECONDITION": InvalidArgument,
    "OUT_OF_RANGE": InvalidArgument,
    "NOT_FOUND": NotFound,
    "RESOURCE_EXHAUSTED": ResourceExhausted,
    "ABORTED": Aborted,
    "UNAVAILABLE": Unavailable,
    "CANCELLED": Unavailable,
    "DEADLINE_EXCEEDED": DeadlineExceeded,
    "UNIMPLEMENTED": Unimplemented,
    "INTERNAL": InternalError,
    "UNKNOWN": InternalError,
    "DATA_LOSS": InternalError,
    "ALREADY_EXISTS": InternalError,
}

# pyarrow's message: "Flight returned <what> error, with message: <msg>. gRPC client debug
# context: <CODE>:<msg>. Client context: ..." (or "gRPC returned <what> error, ..." for
# codes Flight has no status of its own for). The debug context carries the exact code.
_DEBUG_CONTEXT = re.compile(r"gRPC client debug context: ([A-Z_]+):(.*?)(?:\. Client context:|$)", re.S)
_WITH_MESSAGE = re.compile(r"returned ([a-z ]+) error, with message: (.*?)(?:\. gRPC client debug context:|\. Detail:|$)", re.S)
_WORDS_TO_CODE = {
    "resource exhausted": "RESOURCE_EXHAUSTED", "precondition failed": "FAILED_PRECONDITION",
    "aborted": "ABORTED", "out of range": "OUT_OF_RANGE", "not found": "NOT_FOUND",
    "invalid argument": "INVALID_ARGUMENT", "unavailable": "UNAVAILABLE",
    "unauthenticated": "UNAUTHENTICATED", "unauthorized": "PERMISSION_DENIED",
    "permission denied": "PERMISSION_DENIED", "unimplemented": "UNIMPLEMENTED",
    "internal": "INTERNAL", "cancelled": "CANCELLED", "timed out": "DEADLINE_EXCEEDED",
    "deadline exceeded": "DEADLINE_EXCEEDED", "data loss": "DATA_LOSS", "unknown": "UNKNOWN",
}


def _code_of_class(err: BaseException) -> str:
    checks: list[tuple[type[BaseException], str]] = [
        (flight.FlightUnauthenticatedError, "UNAUTHENTICATED"),
        (flight.FlightUnauthorizedError, "PERMISSION_DENIED"),
        (flight.FlightUnavailableError, "UNAVAILABLE"),
        (flight.FlightTimedOutError, "DEADLINE_EXCEEDED"),
        (flight.FlightCancelledError, "CANCELLED"),
        (flight.FlightInternalError, "INTERNAL"),
        (pa.ArrowKeyError, "NOT_FOUND"),
        (pa.ArrowInvalid, "INVALID_ARGUMENT"),
        (pa.ArrowNotImplementedError, "UNIMPLEMENTED"),
    ]
    for cls, code in checks:
        if isinstance(err, cls):
            return code
    return "UNKNOWN"


def status_of(err: BaseException) -> tuple[str, str]:
    """The gRPC code name and the node's status message behind a pyarrow exception."""
    text = str(err)
    if text.startswith("'") and text.endswith("'") and isinstance(err, KeyError):
        text = text[1:-1]  # KeyError's str() quotes its argument
    debug = _DEBUG_CONTEXT.search(text)
    words = _WITH_MESSAGE.search(text)
    if debug:
        code = debug.group(1)
    elif words and words.group(1) in _WORDS_TO_CODE:
        code = _WORDS_TO_CODE[words.group(1)]
    else:
        code = _code_of_class(err)
    message = words.group(2) if words else (debug.group(2) if debug else text)
    return code, message.strip()


def from_flight(err: BaseException, address: str | None) -> FlightCacheError:
    """The :class:`FlightCacheError` for a pyarrow Flight exception (keep ``err`` as the
    new one's cause: ``raise from_flight(err, address) from err``)."""
    code, message = status_of(err)
    cls = _BY_CODE.get(code, FlightCacheError)
    return cls(message, code=code, address=address)


#: The pyarrow exceptions a Flight call raises for a gRPC status.
FLIGHT_ERRORS: tuple[type[BaseException], ...] = (flight.FlightError, pa.ArrowException)
