"""The pyarrow side of the interop tests (e2e/interop): a third client with the CLI of the
Java and Go ones, and the table the tests send and compare. Usage:

    pyarrow_client.py put HOST PORT TOKEN KEY IN.arrow
    pyarrow_client.py get HOST PORT TOKEN KEY OUT.arrow
    pyarrow_client.py table mixed|empty OUT.arrow
    pyarrow_client.py compare EXPECTED.arrow GOT.arrow
    pyarrow_client.py probe-frozen HOST PORT TOKEN KEY

`put` and `get` behave as the Java and Go clients do: one JSON line `{"ok":true,"rows":N}`
(`get`: `{"ok":false,"missing":true}` on NOT_FOUND), any other failure exits 1 with
"VERB KEY: CODE: message" on stderr. They dial as e2e/tests/flight_client.py does (its
`dial`: the client settings of docs/failure-model.md, TLS from FLIGHTCACHE_TLS_*), and send
the token as `authorization: Bearer <token>` on each call (no Handshake; "-": none).

`table` writes the test table as an Arrow IPC file in three record batches: `mixed` has
int64, float64, utf8 (non-ASCII too), bool, date32, timestamp[us, UTC], decimal128,
binary and list<int64> columns, nulls in each, and schema and field metadata; `empty` is
its schema with no batch. `compare` exits 1 unless GOT holds the same table as EXPECTED
(`Table.equals`) with the same schema, metadata included.

`probe-frozen` is the Java and Go clients' (e2e/interop/frozen-node): gRPC-core's figure
beside theirs.
"""

import datetime
import decimal
import json
import sys
import threading
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.flight as flight
import pyarrow.ipc as ipc

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "e2e" / "tests"))
sys.path.insert(0, str(ROOT / "clients" / "python" / "src"))
from flight_client import dial  # noqa: E402  (the e2e tests' pyarrow dial: settings, TLS)
from flightcache.errors import status_of  # noqa: E402  (gRPC code of a pyarrow exception)

CALL_TIMEOUT_S = 20  # each call's deadline, as the Java and Go clients'
ROWS = 1000


def options(token: str) -> flight.FlightCallOptions:
    headers = [] if token == "-" else [(b"authorization", b"Bearer " + token.encode())]
    return flight.FlightCallOptions(headers=headers, timeout=CALL_TIMEOUT_S)


def put(host: str, port: str, token: str, key: str, path: str) -> int:
    with ipc.open_file(path) as reader:
        schema = reader.schema
        batches = [reader.get_batch(i) for i in range(reader.num_record_batches)]
    client = dial(host, port)
    try:
        writer, results = client.do_put(flight.FlightDescriptor.for_path(*key.split("/")), schema, options(token))
        for batch in batches:
            writer.write_batch(batch)
        writer.done_writing()
        answer = results.read()
        writer.close()
    finally:
        client.close()
    if answer is None:
        raise RuntimeError("the node ended the put without a PutResult")
    return json.loads(answer.to_pybytes())["rows"]


def get(host: str, port: str, token: str, key: str, path: str) -> int:
    client = dial(host, port)
    try:
        got = client.do_get(flight.Ticket(b"FCT\x01P" + key.encode()), options(token)).read_all()
    finally:
        client.close()
    tmp = Path(path).with_name(f".{Path(path).name}.partial")
    with ipc.new_file(tmp, got.schema) as writer:
        writer.write_table(got)
    tmp.rename(path)
    return got.num_rows


def mixed_table() -> pa.Table:
    start = datetime.datetime(2026, 1, 1, tzinfo=datetime.timezone.utc)
    names = ["Zürich", "東京", "São Paulo", "Москва", "emoji 🚀", "", "plain"]

    def nth(values: list, i: int, every: int = 11):
        # A null every `every` rows, at a different phase per column.
        return None if i % every == len(values) % every else values[i % len(values)]

    columns = {
        "id": pa.array([None if i == 3 else i for i in range(ROWS)], pa.int64()),
        "amount": pa.array([nth([0.5, -1.25, 1e300, float("inf"), -0.0, 3.0], i) for i in range(ROWS)], pa.float64()),
        "name": pa.array([nth(names, i) for i in range(ROWS)], pa.utf8()),
        "flag": pa.array([nth([True, False, True], i, 13) for i in range(ROWS)], pa.bool_()),
        "day": pa.array([nth([datetime.date(2026, 1, 1) + datetime.timedelta(days=d) for d in range(9)], i)
                         for i in range(ROWS)], pa.date32()),
        "at": pa.array([None if i % 17 == 5 else start + datetime.timedelta(microseconds=i * 1_000_003)
                        for i in range(ROWS)], pa.timestamp("us", tz="UTC")),
        "price": pa.array([None if i % 19 == 2 else decimal.Decimal(i * 37 - 5000).scaleb(-2) for i in range(ROWS)],
                          pa.decimal128(12, 2)),
        "blob": pa.array([None if i % 23 == 7 else bytes([i % 256, 0, 255]) * (i % 4) for i in range(ROWS)],
                         pa.binary()),
        "tags": pa.array([None if i % 29 == 1 else list(range(i % 5)) for i in range(ROWS)], pa.list_(pa.int64())),
    }
    fields = [pa.field(name, array.type, metadata={"origin": "pyarrow"} if name == "name" else None)
              for name, array in columns.items()]
    schema = pa.schema(fields, metadata={"written-by": "e2e/interop", "note": "ünïcode"})
    return pa.Table.from_arrays(list(columns.values()), schema=schema)


def write_table(kind: str, path: str) -> None:
    table = mixed_table()
    with ipc.new_file(path, table.schema) as writer:
        if kind == "mixed":
            # Three record batches of uneven sizes: the stream has several messages.
            for offset, length in ((0, 400), (400, 350), (750, ROWS - 750)):
                writer.write_batch(table.slice(offset, length).combine_chunks().to_batches()[0])
        elif kind != "empty":
            raise SystemExit(f"unknown table {kind}: mixed or empty")


def compare(expected_path: str, got_path: str) -> None:
    expected = ipc.open_file(expected_path).read_all()
    got = ipc.open_file(got_path).read_all()
    if not got.schema.equals(expected.schema, check_metadata=True):
        raise SystemExit(f"schemas differ:\n--- expected\n{expected.schema}\n--- got\n{got.schema}")
    if not got.equals(expected):
        diffs = [name for name in expected.column_names if not got.column(name).equals(expected.column(name))]
        raise SystemExit(f"{got.num_rows} rows (expected {expected.num_rows}); columns that differ: {diffs}")
    print(f"equal: {got.num_rows} rows, {got.num_columns} columns, schema and metadata")


def probe_frozen(host: str, port: str, token: str, key: str) -> None:
    """Reads KEY (the connection is then open), prints {"ready":true}, waits for a line on
    stdin (sent once the node is stopped), then starts at once on that connection a
    DoAction "ping" (not in the service config: it ends when the connection does) and a
    DoGet of KEY (retried by the service config); prints how long each took and its code."""
    client = dial(host, port)
    client.do_get(flight.Ticket(b"FCT\x01P" + key.encode()), options(token)).read_all()
    print('{"ready":true}', flush=True)
    if not sys.stdin.readline():
        raise SystemExit("stdin closed before the go-ahead")
    outcomes = {}
    started = time.monotonic()

    def timed(name, call):
        code = "OK"
        try:
            call()
        except (flight.FlightError, pa.ArrowException) as err:
            code = status_of(err)[0]
        outcomes[name] = {"ms": round((time.monotonic() - started) * 1000), "code": code}

    calls = {
        "ping": lambda: list(client.do_action(flight.Action("ping", b""), options(token))),
        "get": lambda: client.do_get(flight.Ticket(b"FCT\x01P" + key.encode()), options(token)).read_all(),
    }
    threads = [threading.Thread(target=timed, args=item) for item in calls.items()]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    print(json.dumps({"ping": outcomes["ping"], "get": outcomes["get"]}, separators=(",", ":")))
    client.close()


def main() -> None:
    args = sys.argv[1:]
    if len(args) == 3 and args[0] == "table":
        write_table(args[1], args[2])
        return
    if len(args) == 3 and args[0] == "compare":
        compare(args[1], args[2])
        return
    if len(args) == 5 and args[0] == "probe-frozen":
        probe_frozen(*args[1:])
        return
    if len(args) != 6 or args[0] not in ("put", "get"):
        raise SystemExit(__doc__)
    verb, host, port, token, key, path = args
    try:
        rows = (put if verb == "put" else get)(host, port, token, key, path)
    except (flight.FlightError, pa.ArrowException) as err:
        code, message = status_of(err)
        if verb == "get" and code == "NOT_FOUND":
            print(json.dumps({"ok": False, "missing": True}, separators=(",", ":")))
            return
        print(f"{verb} {key}: {code}: {message}", file=sys.stderr)
        sys.exit(1)
    print(json.dumps({"ok": True, "rows": rows}, separators=(",", ":")))


if __name__ == "__main__":
    main()
