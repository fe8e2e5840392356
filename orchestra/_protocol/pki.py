"""A cluster on certificates of its own: the user's PKI in place of the key the token
derives (_protocol/tls.py).

    orchestra start --head --tls-cert host.pem --tls-key host.key --tls-ca ca.pem
    orchestra start --address HEAD:PORT --token T --tls-cert ... --tls-key ... --tls-ca ...
    orchestra.init(address=..., token=..., tls_cert=..., tls_key=..., tls_ca=...)
    (or ORCHESTRA_TLS_CERT, ORCHESTRA_TLS_KEY, ORCHESTRA_TLS_CA in the environment)

Each process then presents its certificate on every TLS connection, as server and as
client, and takes only a peer whose certificate chains to the CA (mutual TLS): the
head's port, the nodes' data servers, the workers' direct-call ports. The dashboard
serves HTTPS with the certificate and asks browsers for none. Host names are not
checked: every certificate the CA signed is a member of the cluster (each machine may
have its own). The token is proven inside the channel as without a PKI, bound to it, so
joining takes both a certificate of the CA and the token.

The three paths live in the environment (absolute), read by tls.py at each context it
makes: the processes a head or node starts (its workers, the head's supervisor)
inherit them. A process with none set uses the token's key. ``use()`` checks the files
before anything starts: each readable, the key the certificate's, the certificate valid
now, and a handshake between two contexts made from them (in memory) succeeding both
ways; otherwise TLSConfigError names the file and the fix.
"""
from __future__ import annotations

import datetime
import functools
import hashlib
import os
import ssl
from dataclasses import dataclass

from ..exceptions import TLSConfigError

ENV = {"cert": "ORCHESTRA_TLS_CERT", "key": "ORCHESTRA_TLS_KEY", "ca": "ORCHESTRA_TLS_CA"}
_FLAG = {"cert": "--tls-cert", "key": "--tls-key", "ca": "--tls-ca"}


@dataclass(frozen=True)
class Pki:
    cert: str
    key: str
    ca: str
    ca_subject: str       # the CA's subject (of the first certificate in the CA file)
    ca_fingerprint: str   # sha256 of that certificate, hex grouped
    not_after: str        # when the certificate expires (ISO date)
    cert_sha256: str      # sha256 of this process's certificate (hex): the dashboard's


def current() -> Pki | None:
    """The PKI this process was given (its environment), or None. TLSConfigError when
    only some of the three are set or the files do not hold up."""
    paths = {k: os.environ.get(v, "") for k, v in ENV.items()}
    if not any(paths.values()):
        return None
    _all_three([f"{_FLAG[k]} ({ENV[k]})" for k, v in paths.items() if not v])
    return _checked(paths["cert"], paths["key"], paths["ca"])


def _all_three(missing: list[str]) -> None:
    if missing:
        raise TLSConfigError(
            "certificates of your own need all three of --tls-cert, --tls-key and "
            f"--tls-ca; missing: {', '.join(missing)}")


def use(cert: str | os.PathLike[str] | None, key: str | os.PathLike[str] | None,
        ca: str | os.PathLike[str] | None) -> Pki | None:
    """Check the three files and make them this process's PKI (and its children's:
    the environment). None of them given: whatever the environment says already."""
    given = {"cert": cert, "key": key, "ca": ca}
    if all(v is None for v in given.values()):
        return current()
    _all_three([_FLAG[k] for k, v in given.items() if not v])
    paths = {k: os.path.abspath(os.fspath(v)) for k, v in given.items()}   # type: ignore[arg-type]
    pki = _checked(paths["cert"], paths["key"], paths["ca"])
    for k, path in paths.items():
        os.environ[ENV[k]] = path
    return pki


def fingerprint(public: bytes) -> str:
    """How a key or certificate is named in messages: sha256 of its bytes, hex, grouped
    (tls.py names the cluster's key so too)."""
    digest = hashlib.sha256(public).hexdigest()[:32]
    return "sha256:" + ":".join(digest[i:i + 4] for i in range(0, len(digest), 4))


def _read(kind: str, path: str) -> bytes:
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError as exc:
        raise TLSConfigError(f"{_FLAG[kind]} {path}: cannot read it ({exc.strerror}); "
                             "give a PEM file this user can read") from None


def _dn(name: object) -> str:
    return name.rfc4514_string()   # type: ignore[attr-defined]


@functools.lru_cache(maxsize=8)
def _checked(cert_path: str, key_path: str, ca_path: str) -> Pki:
    from cryptography import x509
    from cryptography.hazmat.primitives import serialization
    cert_pem, key_pem, ca_pem = (_read("cert", cert_path), _read("key", key_path),
                                 _read("ca", ca_path))
    try:
        chain = x509.load_pem_x509_certificates(cert_pem)
    except ValueError:
        raise TLSConfigError(f"--tls-cert {cert_path}: no PEM certificate in it") from None
    try:
        cas = x509.load_pem_x509_certificates(ca_pem)
    except ValueError:
        raise TLSConfigError(f"--tls-ca {ca_path}: no PEM certificate in it") from None
    try:
        key = serialization.load_pem_private_key(key_pem, password=None)
    except TypeError:
        raise TLSConfigError(f"--tls-key {key_path}: the key is encrypted; give it without a "
                             "passphrase (mode 0600, readable by this user only)") from None
    except ValueError:
        raise TLSConfigError(f"--tls-key {key_path}: no PEM private key in it") from None
    mine = chain[0]
    der = serialization.Encoding.DER
    spki = serialization.PublicFormat.SubjectPublicKeyInfo
    if key.public_key().public_bytes(der, spki) != mine.public_key().public_bytes(der, spki):
        raise TLSConfigError(f"--tls-key {key_path} is not the key of --tls-cert {cert_path} "
                             f"({_dn(mine.subject)}): give the key that certificate was made for")
    now = datetime.datetime.now(datetime.timezone.utc)
    for what, path, c in [("--tls-cert", cert_path, x) for x in chain] + \
            [("--tls-ca", ca_path, x) for x in cas]:
        if c.not_valid_after_utc < now:
            raise TLSConfigError(f"{what} {path}: the certificate {_dn(c.subject)} expired on "
                                 f"{c.not_valid_after_utc:%Y-%m-%d %H:%M} UTC; renew it")
        if c.not_valid_before_utc > now:
            raise TLSConfigError(f"{what} {path}: the certificate {_dn(c.subject)} is not valid "
                                 f"before {c.not_valid_before_utc:%Y-%m-%d %H:%M} UTC (check "
                                 "this machine's clock)")
    pki = Pki(cert_path, key_path, ca_path, _dn(cas[0].subject),
              fingerprint(cas[0].public_bytes(der)), f"{mine.not_valid_after_utc:%Y-%m-%d}",
              hashlib.sha256(mine.public_bytes(der)).hexdigest())
    try:
        _handshake(server_context(pki, clients=True), client_context(pki))
    except ssl.SSLError as exc:
        raise TLSConfigError(
            f"--tls-cert {cert_path} ({_dn(mine.subject)}) does not verify against --tls-ca "
            f"{ca_path} ({pki.ca_subject}): {getattr(exc, 'verify_message', '') or exc}. "
            "Give a certificate the CA signed (with its intermediate certificates after it "
            "in the file) and the CA that signed it") from None
    return pki


def server_context(pki: Pki, clients: bool) -> ssl.SSLContext:
    """A server's context on the PKI: TLS 1.3, its certificate; ``clients``: a client
    must present a certificate of the CA (the dashboard's browsers present none)."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_3
    ctx.num_tickets = 0
    _load(ctx, pki)
    if clients:
        ctx.verify_mode = ssl.CERT_REQUIRED
    return ctx


def client_context(pki: Pki) -> ssl.SSLContext:
    """A client's context on the PKI: TLS 1.3, its certificate presented, the server's
    chained to the CA (no host name checked: module docstring)."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_3
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_REQUIRED
    _load(ctx, pki)
    return ctx


def _load(ctx: ssl.SSLContext, pki: Pki) -> None:
    ctx.load_cert_chain(pki.cert, pki.key)
    ctx.load_verify_locations(cafile=pki.ca)


def _handshake(server: ssl.SSLContext, client: ssl.SSLContext) -> None:
    """A TLS handshake between the two contexts in memory: SSLError where a real one
    would fail (the chain, its dates, key usages, in both directions)."""
    s_in, s_out, c_in, c_out = (ssl.MemoryBIO() for _ in range(4))
    s = server.wrap_bio(s_in, s_out, server_side=True)
    c = client.wrap_bio(c_in, c_out, server_side=False)
    done = {False: False, True: False}
    for _ in range(8):
        for obj, out, peer_in in ((c, c_out, s_in), (s, s_out, c_in)):
            if not done[obj.server_side]:
                try:
                    obj.do_handshake()
                    done[obj.server_side] = True
                except ssl.SSLWantReadError:
                    pass
            data = out.read()
            if data:
                peer_in.write(data)
        if all(done.values()):
            return
    raise ssl.SSLError("the handshake did not finish")
