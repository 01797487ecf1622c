"""Certificates for TLS tests: a certificate authority of the test's own and certificates it
signs, each with a subject common name and, if asked, subject alternative names (an e-mail
address, a DNS name), written as PEM files (``cryptography``, the test extra)."""

from __future__ import annotations

import datetime
from pathlib import Path
from typing import Any, NamedTuple

__all__ = ["Authority", "Issued"]


class Issued(NamedTuple):
    """A certificate's and its key's PEM files."""

    cert: str
    key: str


class Authority:
    """A certificate authority written to ``directory/name-ca.pem`` (``ca_file``), that
    issues certificates into the same directory."""

    def __init__(self, directory: Path, name: str = "daskjobs-test") -> None:
        from cryptography import x509
        from cryptography.hazmat.primitives.asymmetric import ec
        from cryptography.x509.oid import NameOID

        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self._key = ec.generate_private_key(ec.SECP256R1())
        self._name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, f"{name} CA")])
        now = datetime.datetime.now(datetime.timezone.utc)
        self._cert = (
            x509.CertificateBuilder()
            .subject_name(self._name)
            .issuer_name(self._name)
            .public_key(self._key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(days=1))
            .not_valid_after(now + datetime.timedelta(days=30))
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .sign(self._key, _sha256())
        )
        self.ca_file = str(self.directory / f"{name}-ca.pem")
        Path(self.ca_file).write_bytes(_pem(self._cert))

    def issue(
        self, common_name: str, *, emails: tuple[str, ...] = (), dns: tuple[str, ...] = ()
    ) -> Issued:
        """A certificate for ``common_name`` (and these alternative names), for both ends of a
        connection (client and server authentication)."""
        from cryptography import x509
        from cryptography.hazmat.primitives import serialization
        from cryptography.hazmat.primitives.asymmetric import ec
        from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

        key = ec.generate_private_key(ec.SECP256R1())
        now = datetime.datetime.now(datetime.timezone.utc)
        builder = (
            x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)]))
            .issuer_name(self._name)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(days=1))
            .not_valid_after(now + datetime.timedelta(days=30))
            .add_extension(
                x509.ExtendedKeyUsage(
                    [ExtendedKeyUsageOID.CLIENT_AUTH, ExtendedKeyUsageOID.SERVER_AUTH]
                ),
                critical=False,
            )
        )
        alt: list[Any] = [x509.RFC822Name(e) for e in emails] + [x509.DNSName(d) for d in dns]
        if alt:
            builder = builder.add_extension(x509.SubjectAlternativeName(alt), critical=False)
        cert = builder.sign(self._key, _sha256())
        stem = self.directory / common_name.replace("@", "-at-").replace("/", "-")
        cert_file, key_file = Path(f"{stem}.pem"), Path(f"{stem}-key.pem")
        cert_file.write_bytes(_pem(cert))
        key_file.write_bytes(
            key.private_bytes(
                serialization.Encoding.PEM,
                serialization.PrivateFormat.PKCS8,
                serialization.NoEncryption(),
            )
        )
        key_file.chmod(0o600)
        return Issued(str(cert_file), str(key_file))


def _sha256() -> Any:
    from cryptography.hazmat.primitives import hashes

    return hashes.SHA256()


def _pem(cert: Any) -> bytes:
    from cryptography.hazmat.primitives import serialization

    return bytes(cert.public_bytes(serialization.Encoding.PEM))
