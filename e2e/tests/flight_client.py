"""pyarrow as a user runs it, from the client network namespace: dial the pool's client
Service by its DNS name, authenticate, put and get. Usage:

    flight_client.py put|get HOST PORT TOKEN KEY ROWS

TOKEN "-" means the cluster has no auth.
"""

import sys

import pyarrow as pa
import pyarrow.flight as flight


def table(rows: int) -> pa.Table:
    return pa.table({
        "id": pa.array(range(rows), pa.int64()),
        "amount": pa.array([i * 0.5 for i in range(rows)], pa.float64()),
        "region": pa.array([f"r{i % 7}" for i in range(rows)]),
    })


def main() -> None:
    verb, host, port, token, key, rows = sys.argv[1:7]
    client = flight.connect(f"grpc://{host}:{port}")
    headers = [] if token == "-" else [client.authenticate_basic_token(b"e2e", token.encode())]
    options = flight.FlightCallOptions(headers=headers, timeout=20)
    expected = table(int(rows))
    if verb == "put":
        writer, _ = client.do_put(flight.FlightDescriptor.for_path(*key.split("/")), expected.schema, options)
        writer.write_table(expected)
        writer.close()
        print(f"put {key}: {expected.num_rows} rows")
    # A hit is one DoGet with the ticket built from the key; on the same connection the
    # Service sends it to the node that took the put.
    got = client.do_get(flight.Ticket(b"FCT\x01P" + key.encode()), options).read_all()
    assert got.equals(expected), f"{key}: got {got.num_rows} rows, different from what was put"
    print(f"get {key}: {got.num_rows} rows, byte-identical")


if __name__ == "__main__":
    main()
