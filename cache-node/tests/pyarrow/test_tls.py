"""pyarrow against a node serving TLS: the client trusts the test CA (`tls_root_certs`),
authenticates with the client token, puts and gets; a client that does not trust the
CA, or speaks plaintext, gets no data. Against a node requiring client certificates,
pyarrow presents one (`cert_chain`, `private_key`); without one, or with one of another
CA, it gets no data."""

import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.flight as flight
import pytest

from conftest import Node

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "e2e" / "tests"))
import certs  # noqa: E402  (the e2e tests' certificate maker)


@pytest.fixture(scope="module")
def tls_node(tmp_path_factory):
    directory = tmp_path_factory.mktemp("tls")
    certs.make_ca(directory)
    certs.issue(directory, ["localhost", "127.0.0.1"])
    (directory / "token").write_text("tls-client-token\n")
    node = Node(
        "--tls-cert-file", str(directory / "tls.crt"),
        "--tls-key-file", str(directory / "tls.key"),
        "--tls-ca-file", str(directory / "ca.crt"),
        "--auth-token-file", str(directory / "token"),
    )
    node.ca = (directory / "ca.crt").read_bytes()
    yield node
    node.stop()


def test_pyarrow_puts_and_gets_over_tls_with_the_ca(tls_node):
    client = flight.connect(f"grpc+tls://localhost:{tls_node.port}", tls_root_certs=tls_node.ca)
    header = client.authenticate_basic_token(b"me", b"tls-client-token")
    options = flight.FlightCallOptions(headers=[header])
    table = pa.table({"id": pa.array(range(500), pa.int64()), "name": [f"r{i}" for i in range(500)]})
    writer, _ = client.do_put(flight.FlightDescriptor.for_path("tls", "py"), table.schema, options)
    writer.write_table(table)
    writer.close()
    got = client.do_get(flight.Ticket(b"FCT\x01Ptls/py"), options).read_all()
    assert got.equals(table)
    client.close()


def test_a_client_that_does_not_trust_the_ca_gets_nothing(tls_node):
    client = flight.connect(f"grpc+tls://localhost:{tls_node.port}")  # system roots only
    with pytest.raises(flight.FlightError):  # the handshake fails: certificate verify failed
        client.authenticate_basic_token(b"me", b"tls-client-token")
    client.close()


def test_plaintext_to_the_tls_port_gets_nothing(tls_node):
    client = flight.connect(f"grpc://localhost:{tls_node.port}")
    with pytest.raises(flight.FlightError):
        client.authenticate_basic_token(b"me", b"tls-client-token")
    client.close()


@pytest.fixture(scope="module")
def mtls_node(tmp_path_factory):
    directory = tmp_path_factory.mktemp("mtls")
    certs.make_ca(directory)
    certs.issue(directory, ["localhost", "127.0.0.1"])
    certs.issue(directory, ["analytics-client"], stem="client")
    stranger = tmp_path_factory.mktemp("stranger")
    certs.make_ca(stranger)
    certs.issue(stranger, ["analytics-client"], stem="client")
    (directory / "token").write_text("mtls-client-token\n")
    node = Node(
        "--tls-cert-file", str(directory / "tls.crt"),
        "--tls-key-file", str(directory / "tls.key"),
        "--tls-ca-file", str(directory / "ca.crt"),
        "--tls-client-auth", "required",
        "--auth-token-file", str(directory / "token"),
    )
    node.ca = (directory / "ca.crt").read_bytes()
    node.client_cert = ((directory / "client.crt").read_bytes(), (directory / "client.key").read_bytes())
    node.stranger_cert = ((stranger / "client.crt").read_bytes(), (stranger / "client.key").read_bytes())
    yield node
    node.stop()


def _mtls_client(node, identity):
    if identity is None:
        return flight.connect(f"grpc+tls://localhost:{node.port}", tls_root_certs=node.ca)
    cert, key = identity
    return flight.connect(f"grpc+tls://localhost:{node.port}", tls_root_certs=node.ca,
                          cert_chain=cert, private_key=key)


def test_pyarrow_with_a_client_certificate_puts_and_gets(mtls_node):
    client = _mtls_client(mtls_node, mtls_node.client_cert)
    header = client.authenticate_basic_token(b"me", b"mtls-client-token")
    options = flight.FlightCallOptions(headers=[header])
    table = pa.table({"id": pa.array(range(300), pa.int64())})
    writer, _ = client.do_put(flight.FlightDescriptor.for_path("mtls", "py"), table.schema, options)
    writer.write_table(table)
    writer.close()
    assert client.do_get(flight.Ticket(b"FCT\x01Pmtls/py"), options).read_all().equals(table)
    client.close()


@pytest.mark.parametrize("who", ["no certificate", "a certificate of another CA"])
def test_pyarrow_without_a_certificate_of_the_ca_gets_nothing(mtls_node, who):
    identity = None if who == "no certificate" else mtls_node.stranger_cert
    client = _mtls_client(mtls_node, identity)
    with pytest.raises(flight.FlightError):  # the node refuses the handshake
        client.authenticate_basic_token(b"me", b"mtls-client-token")
    client.close()
