"""A throw-away certificate authority for TLS between local test servers and their clients (PEM files).

Example::

    authority = CertificateAuthority.create(directory)
    server = authority.issue(directory, "broker", hosts=["127.0.0.1", "localhost"])
    # server.certificate, server.key (PKCS#8, unencrypted unless a password is given), authority.certificate
"""

from __future__ import annotations

import datetime
import ipaddress
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

_VALIDITY = datetime.timedelta(days=2)


@dataclass(frozen=True)
class IssuedCertificate:
    certificate: Path
    key: Path


@dataclass(frozen=True)
class CertificateAuthority:
    certificate: Path
    key: Path

    @classmethod
    def create(cls, directory: Path, name: str = "cassandra-cdc test CA") -> "CertificateAuthority":
        key = ec.generate_private_key(ec.SECP256R1())
        subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
        certificate = (_builder(subject, subject, key.public_key())
                       .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
                       .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                                    content_commitment=False, key_encipherment=False,
                                                    data_encipherment=False, key_agreement=False,
                                                    encipher_only=False, decipher_only=False), critical=True)
                       .sign(key, hashes.SHA256()))
        return cls(*_write(directory, "ca", certificate, key, None))

    def issue(self, directory: Path, name: str, hosts: Sequence[str] = (), *,
              key_password: str | None = None) -> IssuedCertificate:
        """A certificate for ``name`` (server and client use), valid for ``hosts`` (names or IP addresses)."""
        authority_key = serialization.load_pem_private_key(self.key.read_bytes(), None)
        authority = x509.load_pem_x509_certificate(self.certificate.read_bytes())
        key = ec.generate_private_key(ec.SECP256R1())
        names: list[x509.GeneralName] = []
        for host in hosts:
            try:
                names.append(x509.IPAddress(ipaddress.ip_address(host)))
            except ValueError:
                names.append(x509.DNSName(host))
        builder = (_builder(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)]), authority.subject,
                            key.public_key())
                   .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
                   .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH,
                                                         ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False))
        if names:
            builder = builder.add_extension(x509.SubjectAlternativeName(names), critical=False)
        certificate = builder.sign(authority_key, hashes.SHA256())  # type: ignore[arg-type]
        return IssuedCertificate(*_write(directory, name, certificate, key, key_password))


def _builder(subject: x509.Name, issuer: x509.Name,
             public_key: ec.EllipticCurvePublicKey) -> x509.CertificateBuilder:
    now = datetime.datetime.now(datetime.timezone.utc)
    return (x509.CertificateBuilder().subject_name(subject).issuer_name(issuer).public_key(public_key)
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5)).not_valid_after(now + _VALIDITY))


def _write(directory: Path, name: str, certificate: x509.Certificate, key: ec.EllipticCurvePrivateKey,
           password: str | None) -> tuple[Path, Path]:
    directory.mkdir(parents=True, exist_ok=True)
    certificate_file, key_file = directory / f"{name}.crt", directory / f"{name}.key"
    certificate_file.write_bytes(certificate.public_bytes(serialization.Encoding.PEM))
    encryption = (serialization.BestAvailableEncryption(password.encode()) if password
                  else serialization.NoEncryption())
    key_file.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                           encryption))
    key_file.chmod(0o600)
    return certificate_file, key_file
