"""A test CA and node certificates in cert-manager's Secret shape (ca.crt, tls.crt,
tls.key), for the TLS tests. Usage:

    certs.py DIR NAME...    writes DIR/ca.crt, DIR/ca.key (once) and DIR/tls.crt, DIR/tls.key
                            for the DNS names / IP addresses NAME... (a new key each call,
                            signed by the CA in DIR: a rotation)
    certs.py --client DIR NAME
                            writes DIR/client.crt, DIR/client.key: a client certificate
                            for NAME signed by the CA in DIR (made first if DIR has none)

Also imported by the pyarrow tests (`make_ca`, `issue`).
"""

import datetime
import ipaddress
import sys
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

PEM = serialization.Encoding.PEM


def _name(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def make_ca(directory: Path) -> None:
    """Writes ca.crt and ca.key into `directory` unless they exist. Each CA is named
    after its directory, so two CAs a client trusts together (a CA rotation's bundle)
    have distinct subjects."""
    if (directory / "ca.crt").exists():
        return
    name = f"flightcache test CA ({directory.name})"
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (
        x509.CertificateBuilder()
        .subject_name(_name(name))
        .issuer_name(_name(name))
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(x509.KeyUsage(
            digital_signature=True, key_cert_sign=True, crl_sign=True, content_commitment=False,
            key_encipherment=False, data_encipherment=False, key_agreement=False,
            encipher_only=False, decipher_only=False), critical=True)
        .sign(key, hashes.SHA256())
    )
    (directory / "ca.key").write_bytes(key.private_bytes(
        PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()))
    (directory / "ca.crt").write_bytes(cert.public_bytes(PEM))


def issue(directory: Path, names: list[str], stem: str = "tls") -> None:
    """Writes <stem>.crt and <stem>.key for `names`, signed by the CA in `directory`;
    the certificate serves and authenticates clients (both extended key usages)."""
    ca_key = serialization.load_pem_private_key((directory / "ca.key").read_bytes(), None)
    ca_cert = x509.load_pem_x509_certificate((directory / "ca.crt").read_bytes())
    key = ec.generate_private_key(ec.SECP256R1())
    sans: list[x509.GeneralName] = []
    for name in names:
        try:
            sans.append(x509.IPAddress(ipaddress.ip_address(name)))
        except ValueError:
            sans.append(x509.DNSName(name))
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (
        x509.CertificateBuilder()
        .subject_name(_name(names[0]))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(hours=12))
        .add_extension(x509.SubjectAlternativeName(sans), critical=False)
        .add_extension(x509.ExtendedKeyUsage(
            [x509.ExtendedKeyUsageOID.SERVER_AUTH, x509.ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    (directory / f"{stem}.key").write_bytes(key.private_bytes(
        PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()))
    (directory / f"{stem}.crt").write_bytes(cert.public_bytes(PEM))


def main() -> None:
    if len(sys.argv) == 4 and sys.argv[1] == "--client":
        directory = Path(sys.argv[2])
        directory.mkdir(parents=True, exist_ok=True)
        make_ca(directory)
        issue(directory, [sys.argv[3]], stem="client")
        print(f"{directory}/client.crt for {sys.argv[3]}, signed by {directory}/ca.crt")
        return
    if len(sys.argv) < 3 or sys.argv[1].startswith("-"):
        raise SystemExit(__doc__)
    directory = Path(sys.argv[1])
    directory.mkdir(parents=True, exist_ok=True)
    make_ca(directory)
    issue(directory, sys.argv[2:])
    print(f"{directory}/tls.crt for {', '.join(sys.argv[2:])}, signed by {directory}/ca.crt")


if __name__ == "__main__":
    main()
