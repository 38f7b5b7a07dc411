"""The client over TLS (certificates made as cache-node/tests/pyarrow/test_tls.py makes
them, with the e2e tests' certificate maker): it trusts the test CA (`tls_root_certs`),
presents the client token, and, against a node requiring client certificates, presents one
(`cert_chain`, `private_key`). Without the CA, or plaintext to a TLS port, it gets no data:
Unavailable, naming the node."""

import sys

import pytest

import flightcache
from conftest import REPO, Node, table

sys.path.insert(0, str(REPO / "e2e" / "tests"))
import certs  # noqa: E402  (the e2e tests' certificate maker)


@pytest.fixture(scope="module")
def tls_node(tmp_path_factory):
    directory = tmp_path_factory.mktemp("tls")
    certs.make_ca(directory)
    certs.issue(directory, ["localhost", "127.0.0.1"])
    certs.issue(directory, ["analytics-client"], stem="client")
    (directory / "token").write_text("tls-client-token\n")
    node = Node(directory,
                "--tls-cert-file", str(directory / "tls.crt"),
                "--tls-key-file", str(directory / "tls.key"),
                "--tls-ca-file", str(directory / "ca.crt"),
                "--tls-client-auth", "required",
                "--auth-token-file", str(directory / "token"))
    node.ca = (directory / "ca.crt").read_bytes()
    node.client_cert = (directory / "client.crt").read_bytes()
    node.client_key = (directory / "client.key").read_bytes()
    yield node
    node.stop()


def test_round_trip_over_tls_with_the_ca_a_client_certificate_and_the_token(tls_node):
    with flightcache.connect(f"grpc+tls://localhost:{tls_node.port}", token="tls-client-token",
                             tls_root_certs=tls_node.ca, cert_chain=tls_node.client_cert,
                             private_key=tls_node.client_key) as cache:
        data = table(500, 1)
        cache.put("tls/py", data, ttl=60)
        assert cache.get("tls/py").equals(data)
        assert cache.invalidate("tls/py") is True
        assert cache.get("tls/py") is None
        assert cache.get_or_compute("tls/computed", lambda: data).equals(data)
        assert cache.get("tls/computed").equals(data)


def test_the_wrong_token_over_tls_is_unauthenticated(tls_node):
    with pytest.raises(flightcache.Unauthenticated):
        flightcache.connect(f"grpc+tls://localhost:{tls_node.port}", token="nope",
                            tls_root_certs=tls_node.ca, cert_chain=tls_node.client_cert,
                            private_key=tls_node.client_key)


@pytest.mark.parametrize("how", ["without the CA", "without a client certificate", "in plaintext"])
def test_a_client_the_node_cannot_trust_gets_nothing(tls_node, how):
    kwargs = {"token": "tls-client-token", "timeout": 5}
    uri = f"grpc+tls://localhost:{tls_node.port}"
    if how == "without the CA":
        kwargs.update(cert_chain=tls_node.client_cert, private_key=tls_node.client_key)
    elif how == "without a client certificate":
        kwargs.update(tls_root_certs=tls_node.ca)
    else:
        uri = f"grpc://localhost:{tls_node.port}"
    with pytest.raises(flightcache.Unavailable) as err:
        flightcache.connect(uri, **kwargs)
    assert err.value.address == f"localhost:{tls_node.port}"


def test_tls_settings_on_a_plaintext_address_are_refused(tls_node):
    with pytest.raises(flightcache.InvalidArgument, match="grpc\\+tls"):
        flightcache.connect(f"grpc://localhost:{tls_node.port}", tls_root_certs=tls_node.ca)
