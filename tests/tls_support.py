"""A throwaway PKI for tests: a CA, a server certificate it signed for 127.0.0.1, ::1 and
localhost, and a second CA that signed nothing of ours (to be refused). Made with ``cryptography``
(ECDSA P-256: quick), written as PEM files into a directory the test owns."""

from __future__ import annotations

import datetime
import ipaddress
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID


@dataclass(frozen=True)
class Pki:
    ca: Path  # the CA's certificate: what clients verify against
    certificate: Path  # the server's certificate, signed by the CA
    key: Path  # the server's private key
    other_ca: Path  # a CA that signed nothing here
    other_certificate: Path  # a server certificate the other CA signed (same names)
    other_key: Path


def _name(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def _pem_key(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def _ca(common_name: str) -> tuple[ec.EllipticCurvePrivateKey, x509.Certificate]:
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.UTC)
    certificate = (
        x509.CertificateBuilder()
        .subject_name(_name(common_name))
        .issuer_name(_name(common_name))
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    return key, certificate


def _server(
    ca_key: ec.EllipticCurvePrivateKey, ca: x509.Certificate
) -> tuple[ec.EllipticCurvePrivateKey, x509.Certificate]:
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.UTC)
    names: list[x509.GeneralName] = [
        x509.DNSName("localhost"),
        x509.IPAddress(ipaddress.ip_address("127.0.0.1")),
        x509.IPAddress(ipaddress.ip_address("::1")),
    ]
    certificate = (
        x509.CertificateBuilder()
        .subject_name(_name("dnslb test server"))
        .issuer_name(ca.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.SubjectAlternativeName(names), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()),
            critical=False,
        )
        .sign(ca_key, hashes.SHA256())
    )
    return key, certificate


def make_pki(directory: Path) -> Pki:
    """Write a CA, a server certificate and key it signed, and a second, unrelated CA with its
    own server certificate and key into ``directory``."""
    directory.mkdir(parents=True, exist_ok=True)
    paths: list[Path] = []
    for prefix in ("", "other-"):
        ca_key, ca = _ca(f"dnslb {prefix}test CA")
        server_key, server = _server(ca_key, ca)
        for name, data in (
            ("ca.pem", ca.public_bytes(serialization.Encoding.PEM)),
            ("server.pem", server.public_bytes(serialization.Encoding.PEM)),
            ("server.key", _pem_key(server_key)),
        ):
            path = directory / f"{prefix}{name}"
            path.write_bytes(data)
            if name.endswith(".key"):
                path.chmod(0o600)
            paths.append(path)
    return Pki(*paths[:3], *paths[3:])
