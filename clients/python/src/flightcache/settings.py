"""The gRPC client settings of ``docs/failure-model.md`` ("Client settings"), built in.

Two channel kinds:

- the **seed** channel (the address given to :func:`flightcache.connect`: in a cluster
  the pool's Service) gets the documented settings exactly: the service config of
  ``docs/examples/grpc-service-config.json`` (DoGet and DoPut wait for a connection and
  are tried again on UNAVAILABLE, up to 5 tries, 50 ms doubling to 400 ms apart), retries
  on, a 1 s / 1 s HTTP/2 keepalive with gRPC-core's own ping timeout at 1 s, and a
  reconnect backoff of 100 ms to 1 s;
- an **owner** channel (a ring member dialled directly) gets the same keepalive and
  reconnect settings but no service config (no ``waitForReady``, no retry policy): a call
  to an owner that is gone must fail at once so that the client sends it through the
  seed instead (where the retry policy and the nodes' own failover apply), not wait or
  retry against a dead address. Retries stay enabled, so gRPC's transparent retry of
  calls no server processed (a GOAWAY from a node that stops) still applies.

Pure; no I/O.
"""

from __future__ import annotations

import json
from typing import Any

#: The service config of ``docs/examples/grpc-service-config.json`` (a test keeps the two
#: equal).
SERVICE_CONFIG: dict[str, Any] = {
    "methodConfig": [
        {
            "name": [
                {"service": "arrow.flight.protocol.FlightService", "method": "DoGet"},
                {"service": "arrow.flight.protocol.FlightService", "method": "DoPut"},
            ],
            "waitForReady": True,
            "retryPolicy": {
                "maxAttempts": 5,
                "initialBackoff": "0.05s",
                "maxBackoff": "0.4s",
                "backoffMultiplier": 2,
                "retryableStatusCodes": ["UNAVAILABLE"],
            },
        }
    ]
}

#: Keepalive and reconnect options shared by every channel (``failure-model.md``).
CONNECTION_OPTIONS: list[tuple[str, Any]] = [
    ("grpc.keepalive_time_ms", 1000),
    ("grpc.keepalive_timeout_ms", 1000),
    ("grpc.http2.ping_timeout_ms", 1000),
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 1000),
    ("grpc.min_reconnect_backoff_ms", 1000),
]


def seed_options() -> list[tuple[str, Any]]:
    """``generic_options`` for the seed channel: the documented settings, unchanged."""
    return [("grpc.service_config", json.dumps(SERVICE_CONFIG)), ("grpc.enable_retries", 1),
            *CONNECTION_OPTIONS]


def owner_options() -> list[tuple[str, Any]]:
    """``generic_options`` for a channel to one ring member: keepalive and reconnect
    settings, no waiting for a connection and no retry policy (the client falls back to
    the seed instead)."""
    return [("grpc.enable_retries", 1), *CONNECTION_OPTIONS]
