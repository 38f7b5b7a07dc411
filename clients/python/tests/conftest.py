"""Real flightcache-node processes on 127.0.0.1 for the client's tests, started as
cache-node/tests/pyarrow/conftest.py starts them: free loopback ports, the binary from
FLIGHTCACHE_NODE_BIN (else the cargo target dir), stopped with SIGTERM by PID (SIGKILL
after 30 s) when the fixture ends. A pool is N nodes `local-0 … local-N-1` sharing one
static topology file, as cache-node/scripts/local-cluster forms it. Each node's log goes
to a file in the test's temporary directory (a pipe nobody reads could stall a node)."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import time
import urllib.request
from pathlib import Path

import pyarrow as pa
import pyarrow.flight as flight
import pytest

REPO = Path(__file__).resolve().parents[3]

# pytest's exit status, kept for pytest_unconfigure.
_EXIT_STATUS: list[int] = []


def pytest_sessionfinish(session, exitstatus):
    _EXIT_STATUS.append(int(exitstatus))


def pytest_unconfigure(config):
    """After the last report, leave without the interpreter's teardown: in it gRPC's and
    pyarrow's native objects were once freed twice ("double free or corruption
    (fasttop)", SIGABRT), failing a .ci/run whose 30 tests had all passed. The exit status
    is pytest's own. e2e/tests/pyarrow_load.py ends the same way."""
    if _EXIT_STATUS:
        import sys
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(_EXIT_STATUS[-1])


def node_binary() -> str:
    explicit = os.environ.get("FLIGHTCACHE_NODE_BIN")
    if explicit:
        return explicit
    target = os.environ.get("CARGO_TARGET_DIR", str(Path.home() / ".cache" / "flightcache" / "target"))
    return str(Path(target) / "debug" / "flightcache-node")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Node:
    """One node process on 127.0.0.1."""

    def __init__(self, log_dir: Path, *flags: str, port: int | None = None, name: str = "node"):
        self.port = port or free_port()
        self.metrics_port = free_port()
        self.address = f"127.0.0.1:{self.port}"
        self.location = f"grpc://{self.address}"
        self.log = log_dir / f"{name}-{self.port}.log"
        self.proc = subprocess.Popen(
            [node_binary(), "--listen", self.address,
             "--metrics-listen", f"127.0.0.1:{self.metrics_port}", *flags],
            stdout=subprocess.DEVNULL, stderr=open(self.log, "ab"),
        )
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"node exited: {self.log.read_text()[-2000:]}")
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.2):
                    return
            except OSError:
                time.sleep(0.05)
        self.stop()
        raise RuntimeError("node did not start listening within 30s")

    def running(self) -> bool:
        return self.proc.poll() is None

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                return self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        return self.proc.wait(timeout=30)

    def kill(self) -> int:
        """SIGKILL: the process ends at once, without its exit handoff (a crash)."""
        self.proc.kill()
        return self.proc.wait(timeout=30)

    def metrics(self) -> str:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=5) as r:
            return r.read().decode()

    def counter(self, name: str, **labels: str) -> float:
        """The sum of every series of counter `name` whose labels include `labels`."""
        total = 0.0
        pattern = re.compile(rf"^{re.escape(name)}(?:\{{([^}}]*)\}})? (\S+)$", re.M)
        for match in pattern.finditer(self.metrics()):
            series = dict(re.findall(r'(\w+)="([^"]*)"', match.group(1) or ""))
            if all(series.get(k) == v for k, v in labels.items()):
                total += float(match.group(2))
        return total

    def action(self, kind: str, body: bytes = b"", token: str | None = None) -> bytes:
        """A DoAction on this node with plain pyarrow (admin actions in tests)."""
        client = flight.connect(self.location)
        try:
            headers = [(b"authorization", f"Bearer {token}".encode())] if token else []
            results = list(client.do_action(flight.Action(kind, body), flight.FlightCallOptions(headers=headers)))
            return results[0].body.to_pybytes() if results else b""
        finally:
            client.close()


class Pool:
    """N nodes `local-i` sharing a static topology (version 1)."""

    def __init__(self, log_dir: Path, n: int, *flags: str):
        self.log_dir = log_dir
        self.flags = flags
        self.nodes: list[Node] = []
        ports = [free_port() for _ in range(n)]
        self.members = [{"id": f"local-{i}", "address": f"127.0.0.1:{port}"} for i, port in enumerate(ports)]
        self.version = 1
        path = log_dir / "topology.json"
        path.write_text(json.dumps({"version": 1, "members": self.members}))
        try:
            for i, port in enumerate(ports):
                self.nodes.append(Node(log_dir, "--member-id", f"local-{i}", "--topology", str(path),
                                       *flags, port=port, name=f"local-{i}"))
        except BaseException:
            self.stop()
            raise

    def add_node(self) -> Node:
        """Starts one more node `local-N` that knows the next ring (with it); the others
        learn that ring from `publish`."""
        i = len(self.members)
        port = free_port()
        members = self.members + [{"id": f"local-{i}", "address": f"127.0.0.1:{port}"}]
        path = self.log_dir / f"topology-{self.version + 1}.json"
        path.write_text(json.dumps({"version": self.version + 1, "members": members}))
        node = Node(self.log_dir, "--member-id", f"local-{i}", "--topology", str(path), *self.flags,
                    port=port, name=f"local-{i}")
        self.nodes.append(node)
        return node

    def publish(self, members: list[dict], version: int) -> None:
        """Sends ring `version` with `members` to every running node (`configure`)."""
        self.members, self.version = members, version
        body = json.dumps({"topology": {"version": version, "members": members}}).encode()
        for node in self.nodes:
            if node.running():
                node.action("configure", body)

    def forwarded(self) -> float:
        """flightcache_node_forwarded_total summed over the running nodes (docs/metrics.md)."""
        return sum(node.counter("flightcache_node_forwarded_total") for node in self.nodes if node.running())

    def stop(self) -> None:
        for node in self.nodes:
            node.stop()


def table(rows: int, seed: int = 0) -> pa.Table:
    return pa.table({
        "id": pa.array(range(seed, seed + rows), pa.int64()),
        "amount": pa.array([i * 0.5 for i in range(rows)], pa.float64()),
        "region": pa.array([f"r{(i + seed) % 7}" for i in range(rows)], pa.utf8()),
    })


@pytest.fixture(scope="module")
def token_node(tmp_path_factory):
    """One node with a client token (`client-token`) and an admin token (`admin-token`)."""
    directory = tmp_path_factory.mktemp("token-node")
    (directory / "token").write_text("client-token\n")
    (directory / "admin").write_text("admin-token\n")
    node = Node(directory, "--auth-token-file", str(directory / "token"),
                "--admin-token-file", str(directory / "admin"))
    yield node
    node.stop()


@pytest.fixture(scope="module")
def pool(tmp_path_factory):
    """Three nodes on loopback sharing one ring, no tokens."""
    p = Pool(tmp_path_factory.mktemp("pool"), 3)
    yield p
    p.stop()
