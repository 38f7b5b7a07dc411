"""Starts a real flightcache-node for the pyarrow tests.

The binary comes from FLIGHTCACHE_NODE_BIN (set by .ci/run) or the cargo target dir.
Each test module gets its own node on free loopback ports; it is stopped with SIGTERM
by PID at the end.
"""

import os
import signal
import socket
import subprocess
import time
from pathlib import Path

import pyarrow.flight as flight
import pytest


# pytest's exit status, kept for pytest_unconfigure.
_EXIT_STATUS: list[int] = []


def pytest_sessionfinish(session, exitstatus):
    _EXIT_STATUS.append(int(exitstatus))


def pytest_unconfigure(config):
    """After the last report, leave without the interpreter's teardown, where gRPC's and
    pyarrow's native objects were once freed twice (SIGABRT after every test of the
    Python client's suite had passed, clients/python/tests/conftest.py). The exit status
    is pytest's own."""
    if _EXIT_STATUS:
        import sys
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(_EXIT_STATUS[-1])


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def node_binary() -> str:
    explicit = os.environ.get("FLIGHTCACHE_NODE_BIN")
    if explicit:
        return explicit
    target = os.environ.get("CARGO_TARGET_DIR", str(Path(__file__).resolve().parents[3] / "target"))
    return str(Path(target) / "debug" / "flightcache-node")


def free_port() -> int:
    """A free loopback port (for tests that must know a node's port before it starts)."""
    return _free_port()


class Node:
    def __init__(self, *flags: str, port: int | None = None):
        self.port = port or _free_port()
        self.metrics_port = _free_port()
        self.location = f"grpc://127.0.0.1:{self.port}"
        self.proc = subprocess.Popen(
            [node_binary(), "--listen", f"127.0.0.1:{self.port}",
             "--metrics-listen", f"127.0.0.1:{self.metrics_port}", *flags],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
        )
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"node exited: {self.proc.stderr.read().decode()}")
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.2):
                    return
            except OSError:
                time.sleep(0.05)
        raise RuntimeError("node did not start listening within 30s")

    def stop(self) -> int:
        self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout=30)


def put(client, key, data):
    """DoPut of a whole table under the path key `key` ("a/b" -> path ["a", "b"])."""
    writer, reader = client.do_put(flight.FlightDescriptor.for_path(*key.split("/")), data.schema)
    writer.write_table(data)
    writer.done_writing()
    reader.read()
    writer.close()


@pytest.fixture(scope="module")
def node():
    n = Node()
    yield n
    n.stop()


@pytest.fixture()
def client(node):
    c = flight.connect(node.location)
    yield c
    c.close()
