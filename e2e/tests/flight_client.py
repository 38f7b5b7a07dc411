"""pyarrow as a user runs it, from the client network namespace: dial the pool's client
Service by its DNS name, authenticate, put and get. Usage:

    flight_client.py put|get HOST PORT TOKEN KEY ROWS
    flight_client.py put-many|count HOST PORT TOKEN PREFIX COUNT
    flight_client.py action HOST PORT TOKEN ACTION EXPECT
    flight_client.py put-tagged HOST PORT TOKEN PREFIX COUNT
    flight_client.py invalidate-tag HOST PORT TOKEN TAG REMOVED
    flight_client.py count-tagged HOST PORT TOKEN PREFIX COUNT

`put` puts KEY and reads it back; `get` reads KEY and compares it with what `put` wrote.
`put-many` puts PREFIX/0 .. PREFIX/COUNT-1 (each on a new connection, so the Service
spreads them over the pool's nodes); `count` reads them back, each on a new connection,
and prints how many are present and byte-identical (a key that differs fails the run).
`action` runs the DoAction ACTION (empty body) and fails unless its outcome is EXPECT:
`ok` (the result is printed), `unauthenticated` or `permission-denied` (the message is
printed).
`put-tagged` is `put-many` with each key tagged `PREFIX:even` or `PREFIX:odd` (its
put options, `{"tags": [...]}`, on the first batch as pyarrow sends them).
`invalidate-tag` runs `invalidate-tag` for TAG and fails unless the pool answers that it
removed REMOVED entries.
`count-tagged` reads back what `put-tagged` put and prints how many `PREFIX:even` and how
many `PREFIX:odd` keys are present and byte-identical (`EVEN ODD`).
TOKEN "-" means the cluster has no auth. With FLIGHTCACHE_TLS_CA set (a PEM file), the
client speaks TLS (`grpc+tls://`) and trusts that CA; with FLIGHTCACHE_TLS_CLIENT_CERT and
FLIGHTCACHE_TLS_CLIENT_KEY set too, it presents that client certificate.
"""

import json
import os
import socket
import sys
import time

import pyarrow as pa
import pyarrow.flight as flight

# The client settings docs/failure-model.md asks of every gRPC client of a pool: the
# service config (DoGet and DoPut: wait for a connection, and try a call that failed
# UNAVAILABLE again, up to 5 tries, 50 ms doubling to 400 ms apart) and an HTTP/2
# keepalive that ends a connection to a hung process within ~2 s (gRPC-core's own ping
# timeout too: its keepalive waits on an unanswered BDP ping, 1 minute by default). gRPC-core
# does the retries; the cache's calls are idempotent.
SERVICE_CONFIG = os.path.join(os.path.dirname(__file__), "..", "..", "docs", "examples",
                              "grpc-service-config.json")


def grpc_options() -> list:
    with open(SERVICE_CONFIG) as f:
        config = json.dumps(json.load(f))
    return [("grpc.service_config", config), ("grpc.enable_retries", 1),
            ("grpc.keepalive_time_ms", 1000), ("grpc.keepalive_timeout_ms", 1000),
            ("grpc.http2.ping_timeout_ms", 1000),
            ("grpc.initial_reconnect_backoff_ms", 100), ("grpc.max_reconnect_backoff_ms", 1000),
            ("grpc.min_reconnect_backoff_ms", 1000)]


def table(rows: int, seed: int = 0) -> pa.Table:
    return pa.table({
        "id": pa.array(range(seed, seed + rows), pa.int64()),
        "amount": pa.array([i * 0.5 for i in range(rows)], pa.float64()),
        "region": pa.array([f"r{(i + seed) % 7}" for i in range(rows)]),
    })


def dial(host: str, port: str) -> flight.FlightClient:
    """A client for HOST:PORT with the pool's client settings (grpc_options), over TLS as
    `open_client`."""
    return open_client(host, port, generic_options=grpc_options())


def open_client(host: str, port, **options) -> flight.FlightClient:
    """A client for HOST:PORT: TLS trusting FLIGHTCACHE_TLS_CA when it is set (the CA of
    the Secret `status.caSecret` names, by default), presenting the client certificate
    FLIGHTCACHE_TLS_CLIENT_CERT / _KEY when those are set too; plaintext without it."""
    ca = os.environ.get("FLIGHTCACHE_TLS_CA")
    if not ca:
        return flight.connect(f"grpc://{host}:{port}", **options)
    read = lambda path: open(path, "rb").read()  # noqa: E731
    identity = {}
    cert, key = os.environ.get("FLIGHTCACHE_TLS_CLIENT_CERT"), os.environ.get("FLIGHTCACHE_TLS_CLIENT_KEY")
    if cert and key:
        identity = {"cert_chain": read(cert), "private_key": read(key)}
    return flight.connect(f"grpc+tls://{host}:{port}", tls_root_certs=read(ca), **identity, **options)


def wait_for_route(host: str, port: str, within_s: float = 10.0) -> str:
    """Waits until a TCP connection to HOST:PORT is accepted, at most WITHIN_S seconds. A
    pool's pods can be Ready a moment before kube-proxy routes its Service to them (one
    TLS run failed its first Handshake 1.3 s after Ready), and gRPC fails a call at once
    while its connection is refused: only DoGet and DoPut wait for a connection (the
    client settings), not the Handshake this client starts with. Returns what it saw, for
    the error of a Handshake that fails anyway."""
    started = time.monotonic()
    refused = 0
    while True:
        try:
            socket.create_connection((host, int(port)), timeout=1).close()
            return f"a TCP connection was accepted after {time.monotonic() - started:.1f} s ({refused} refused before)"
        except OSError as err:
            refused += 1
            if time.monotonic() - started >= within_s:
                # The call below then fails with gRPC's own message.
                return f"no TCP connection accepted within {within_s:g} s ({refused} tries, last: {err})"
            time.sleep(0.1)


def connect(host: str, port: str, token: str) -> tuple[flight.FlightClient, flight.FlightCallOptions]:
    route = wait_for_route(host, port)
    client = dial(host, port)
    try:
        headers = [] if token == "-" else [client.authenticate_basic_token(b"e2e", token.encode())]
    except flight.FlightError:
        # Say where the time went: a route that never came, or a Handshake that failed on
        # a route that works (a CI run of 3623312 saw "Could not finish writing before
        # closing" 18 s after the pool was Ready; two runs on a fresh cluster did not).
        # The error itself goes on as it is: callers retry on its type.
        print(f"Handshake with {host}:{port} failed; before it, {route}", file=sys.stderr)
        raise
    return client, flight.FlightCallOptions(headers=headers, timeout=20)


def ticket(key: str) -> flight.Ticket:
    # A hit is one DoGet with the ticket built from the key, on any node of the pool.
    return flight.Ticket(b"FCT\x01P" + key.encode())


def put(client, options, key: str, expected: pa.Table, tags: list | None = None) -> None:
    writer, _ = client.do_put(flight.FlightDescriptor.for_path(*key.split("/")), expected.schema, options)
    if tags is None:
        writer.write_table(expected)
    else:
        batches = expected.to_batches()
        writer.write_with_metadata(batches[0], json.dumps({"tags": tags}).encode())
        for batch in batches[1:]:
            writer.write_batch(batch)
    writer.close()


def main() -> None:
    verb, host, port, token, key, n = sys.argv[1:7]
    if verb in ("put", "get"):
        client, options = connect(host, port, token)
        expected = table(int(n))
        if verb == "put":
            put(client, options, key, expected)
            print(f"put {key}: {expected.num_rows} rows")
        got = client.do_get(ticket(key), options).read_all()
        assert got.equals(expected), f"{key}: got {got.num_rows} rows, different from what was put"
        print(f"get {key}: {got.num_rows} rows, byte-identical")
    elif verb == "put-many":
        for i in range(int(n)):
            client, options = connect(host, port, token)
            put(client, options, f"{key}/{i}", table(50, i))
            client.close()
        print(f"put {n} keys under {key}/")
    elif verb == "put-tagged":
        for i in range(int(n)):
            client, options = connect(host, port, token)
            put(client, options, f"{key}/{i}", table(50, i), tags=[f"{key}:{'odd' if i % 2 else 'even'}"])
            client.close()
        print(f"put {n} tagged keys under {key}/")
    elif verb == "invalidate-tag":
        client, options = connect(host, port, token)
        body = json.dumps({"tags": [key]}).encode()
        answer = json.loads(list(client.do_action(flight.Action("invalidate-tag", body), options))[0].body.to_pybytes())
        assert answer == {"removed": int(n)}, f"invalidate-tag {key}: {answer}, expected {n} removed"
        print(f"invalidate-tag {key}: {answer['removed']} removed")
    elif verb == "count":
        present = 0
        for i in range(int(n)):
            client, options = connect(host, port, token)
            try:
                got = client.do_get(ticket(f"{key}/{i}"), options).read_all()
            except pa.ArrowKeyError as err:  # gRPC NOT_FOUND: a miss; anything else fails the run
                print(f"miss {key}/{i}: {err}", file=sys.stderr)
                got = None
            finally:
                client.close()
            if got is not None:
                assert got.equals(table(50, i)), f"{key}/{i}: different from what was put"
                present += 1
        print(present)
    elif verb == "count-tagged":
        present = {"even": 0, "odd": 0}
        for i in range(int(n)):
            client, options = connect(host, port, token)
            try:
                got = client.do_get(ticket(f"{key}/{i}"), options).read_all()
            except pa.ArrowKeyError:  # gRPC NOT_FOUND: a miss; anything else fails the run
                got = None
            finally:
                client.close()
            if got is not None:
                assert got.equals(table(50, i)), f"{key}/{i}: different from what was put"
                present["odd" if i % 2 else "even"] += 1
        print(present["even"], present["odd"])
    elif verb == "action":
        expect = n
        # Without a token there is no Handshake: the call itself must be refused.
        client = dial(host, port)
        try:
            # A token the node does not take is refused at the Handshake already.
            headers = [] if token == "-" else [client.authenticate_basic_token(b"e2e", token.encode())]
            options = flight.FlightCallOptions(headers=headers, timeout=20)
            results = list(client.do_action(flight.Action(key, b""), options))
            outcome, detail = "ok", results[0].body.to_pybytes().decode() if results else ""
        except flight.FlightUnauthenticatedError as err:
            outcome, detail = "unauthenticated", str(err)
        except flight.FlightUnauthorizedError as err:
            outcome, detail = "permission-denied", str(err)
        assert outcome == expect, f"{key}: {outcome} ({detail}), expected {expect}"
        print(detail)
    else:
        raise SystemExit(f"unknown verb {verb}")


if __name__ == "__main__":
    main()
