"""A private certificate authority for tests: :func:`make_certificates` writes a CA and a
server certificate for 127.0.0.1 signed by it (``cryptography``, ECDSA P-256, valid one day),
so a test server can speak https that only a client given the CA trusts — as an on-premises
S3-compatible store behind a company CA does. An :class:`Authority` also issues client
certificates, for a server that requires one (mutual TLS: ``testbed.tlsproxy``)."""

from __future__ import annotations

import datetime
import ipaddress
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["Authority", "KeyPair", "TlsFiles", "make_certificates"]


@dataclass(frozen=True)
class TlsFiles:
    """PEM files: the CA's certificate (what a client trusts), the server's certificate and
    its private key."""

    ca: Path
    cert: Path
    key: Path


@dataclass(frozen=True)
class KeyPair:
    """A certificate and its private key, PEM files."""

    cert: Path
    key: Path


class Authority:
    """A throwaway CA in ``directory`` (its certificate ``ca``; its key stays in memory),
    issuing server and client certificates there."""

    def __init__(self, directory: Path, name: str = "mcsync test CA") -> None:
        from cryptography import x509
        from cryptography.hazmat.primitives import hashes
        from cryptography.hazmat.primitives.asymmetric import ec
        from cryptography.x509.oid import NameOID

        self.directory = directory
        directory.mkdir(parents=True, exist_ok=True)
        now = datetime.datetime.now(datetime.UTC)
        self._lifetime = (now - datetime.timedelta(hours=1), now + datetime.timedelta(days=1))
        self._key = ec.generate_private_key(ec.SECP256R1())
        self._name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
        self._cert = (
            x509.CertificateBuilder()
            .subject_name(self._name).issuer_name(self._name)
            .public_key(self._key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(self._lifetime[0]).not_valid_after(self._lifetime[1])
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True,
                                         crl_sign=True, content_commitment=False,
                                         key_encipherment=False, data_encipherment=False,
                                         key_agreement=False, encipher_only=False,
                                         decipher_only=False), critical=True)
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(self._key.public_key()),
                           critical=False)
            .sign(self._key, hashes.SHA256()))
        self.ca = directory / "ca.pem"
        self.ca.write_bytes(self._pem(self._cert))

    @staticmethod
    def _pem(cert: Any) -> bytes:
        from cryptography.hazmat.primitives import serialization

        data: bytes = cert.public_bytes(serialization.Encoding.PEM)
        return data

    def server(self, stem: str = "") -> KeyPair:
        """A certificate for 127.0.0.1 and localhost (``{stem}cert.pem``, ``{stem}key.pem``)."""
        from cryptography import x509
        from cryptography.x509.oid import ExtendedKeyUsageOID

        pair = KeyPair(self.directory / f"{stem}cert.pem", self.directory / f"{stem}key.pem")
        return self._issue("127.0.0.1", pair, ExtendedKeyUsageOID.SERVER_AUTH, [
            x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1")),
                                         x509.DNSName("localhost")])])

    def client(self, name: str = "mcsync-client") -> KeyPair:
        """A client certificate (``{name}.pem``, ``{name}.key``)."""
        from cryptography.x509.oid import ExtendedKeyUsageOID

        pair = KeyPair(self.directory / f"{name}.pem", self.directory / f"{name}.key")
        return self._issue(name, pair, ExtendedKeyUsageOID.CLIENT_AUTH, [])

    def _issue(self, common_name: str, pair: KeyPair, usage: Any, extra: list[Any]) -> KeyPair:
        from cryptography import x509
        from cryptography.hazmat.primitives import hashes, serialization
        from cryptography.hazmat.primitives.asymmetric import ec
        from cryptography.x509.oid import NameOID

        key = ec.generate_private_key(ec.SECP256R1())
        builder = (
            x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)]))
            .issuer_name(self._name).public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(self._lifetime[0]).not_valid_after(self._lifetime[1])
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
            .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(
                self._key.public_key()), critical=False))
        for extension in extra:
            builder = builder.add_extension(extension, critical=False)
        cert = builder.sign(self._key, hashes.SHA256())
        pair.cert.write_bytes(self._pem(cert))
        pair.key.write_bytes(key.private_bytes(serialization.Encoding.PEM,
                                               serialization.PrivateFormat.PKCS8,
                                               serialization.NoEncryption()))
        pair.key.chmod(0o600)
        return pair


def make_certificates(directory: Path) -> TlsFiles:
    ca = Authority(directory)
    server = ca.server()
    return TlsFiles(ca.ca, server.cert, server.key)
