"""Reference Flight server for the benchmark: pyarrow's FlightServerBase (the C++ Flight
implementation) holding tables in a dict.

Same data path as the cache node, nothing more:
  DoPut(descriptor)        stores the table under the descriptor's key (path segments joined
                           by '/', or the command bytes)
  DoGet(ticket)            the ticket is the key itself; streams the table (RecordBatchStream,
                           served from C++ without the GIL)
  GetFlightInfo(descriptor) schema, rows, bytes and one endpoint whose ticket is the key
  DoAction("ping")         answers b"pong"

Usage: python pyarrow_server.py --port PORT [--host 127.0.0.1]
"""

import argparse
import sys
import threading

import pyarrow as pa
import pyarrow.flight as flight


def descriptor_key(descriptor: flight.FlightDescriptor) -> bytes:
    if descriptor.descriptor_type == flight.DescriptorType.PATH:
        return "/".join(p.decode() if isinstance(p, bytes) else p for p in descriptor.path).encode()
    return bytes(descriptor.command)


class DictFlightServer(flight.FlightServerBase):
    def __init__(self, location: str, **kwargs):
        super().__init__(location, **kwargs)
        self._tables: dict[bytes, pa.Table] = {}
        self._lock = threading.Lock()

    def do_put(self, context, descriptor, reader, writer):
        table = reader.read_all()
        with self._lock:
            self._tables[descriptor_key(descriptor)] = table

    def _table(self, key: bytes) -> pa.Table:
        with self._lock:
            table = self._tables.get(key)
        if table is None:
            raise flight.FlightServerError(f"no entry under {key!r}")
        return table

    def do_get(self, context, ticket):
        return flight.RecordBatchStream(self._table(ticket.ticket))

    def get_flight_info(self, context, descriptor):
        key = descriptor_key(descriptor)
        table = self._table(key)
        endpoint = flight.FlightEndpoint(key, [])
        return flight.FlightInfo(table.schema, descriptor, [endpoint], table.num_rows, table.nbytes)

    def do_action(self, context, action):
        if action.type == "ping":
            return [b"pong"]
        raise flight.FlightServerError(f"unknown action {action.type!r}")

    def list_actions(self, context):
        return [("ping", "answers pong")]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    args = parser.parse_args()
    server = DictFlightServer(f"grpc://{args.host}:{args.port}")
    print(f"pyarrow flight server on {args.host}:{server.port}", flush=True)
    server.serve()
    return 0


if __name__ == "__main__":
    sys.exit(main())
