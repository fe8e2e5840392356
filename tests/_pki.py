"""A small PKI for tests of clusters on certificates of their own: a CA and the
certificates it signs, written as PEM files (``cryptography``, as a user's tooling
would make them)."""
from __future__ import annotations

import datetime
import os
from dataclasses import dataclass

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

_NOW = datetime.datetime.now(datetime.timezone.utc)
_DAY = datetime.timedelta(days=1)


@dataclass
class Files:
    cert: str
    key: str


def _name(cn: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])


def _write(path: str, data: bytes) -> str:
    with open(path, "wb") as f:
        f.write(data)
    os.chmod(path, 0o600)
    return path


def _key_pem(key: ec.EllipticCurvePrivateKey, password: bytes | None = None) -> bytes:
    enc = (serialization.BestAvailableEncryption(password) if password
           else serialization.NoEncryption())
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, enc)


class CA:
    """A CA in ``directory`` (its certificate at ``.cert``) that signs certificates."""

    def __init__(self, directory: str, name: str = "test-ca") -> None:
        self.dir = directory
        self.name = name
        self.key = ec.generate_private_key(ec.SECP256R1())
        cert = (x509.CertificateBuilder().subject_name(_name(name)).issuer_name(_name(name))
                .public_key(self.key.public_key()).serial_number(x509.random_serial_number())
                .not_valid_before(_NOW - _DAY).not_valid_after(_NOW + 30 * _DAY)
                .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
                .sign(self.key, hashes.SHA256()))
        self.cert = _write(os.path.join(directory, f"{name}.pem"),
                           cert.public_bytes(serialization.Encoding.PEM))
        self._cert = cert

    def issue(self, cn: str, *, days: float = 30, start_days: float = -1,
              password: bytes | None = None) -> Files:
        """A certificate for ``cn`` (client and server use), valid from ``start_days``
        to ``days`` from now, and its key (encrypted with ``password`` if given)."""
        key = ec.generate_private_key(ec.SECP256R1())
        cert = (x509.CertificateBuilder().subject_name(_name(cn)).issuer_name(self._cert.subject)
                .public_key(key.public_key()).serial_number(x509.random_serial_number())
                .not_valid_before(_NOW + start_days * _DAY).not_valid_after(_NOW + days * _DAY)
                .add_extension(x509.SubjectAlternativeName([x509.DNSName(cn)]), critical=False)
                .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH,
                                                      ExtendedKeyUsageOID.CLIENT_AUTH]),
                               critical=False)
                .sign(self.key, hashes.SHA256()))
        base = os.path.join(self.dir, f"{self.name}-{cn}")
        return Files(_write(base + ".pem", cert.public_bytes(serialization.Encoding.PEM)),
                     _write(base + ".key", _key_pem(key, password)))
