"""Certificates of the user's own (_protocol/pki.py): what is checked before anything
starts (each failure names its file and the fix), and real TLS connections between
processes' contexts on them, both ways, refusing what the CA did not sign."""
from __future__ import annotations

import os
import socket
import subprocess
import sys

import pytest

from _pki import CA
from orchestra._protocol import auth as _auth
from orchestra._protocol import pki, tls
from orchestra.exceptions import AuthenticationError, TLSConfigError

TOKEN = tls.tls_token("ef" * 24)


@pytest.fixture
def clean_env(monkeypatch):
    for name in pki.ENV.values():
        monkeypatch.delenv(name, raising=False)
    pki._checked.cache_clear()
    yield monkeypatch
    for name in pki.ENV.values():   # pki.use() sets them itself: none may outlive the test
        os.environ.pop(name, None)
    pki._checked.cache_clear()


@pytest.fixture
def ca(tmp_path):
    return CA(str(tmp_path))


def _set(monkeypatch, cert: str, key: str, ca_path: str) -> None:
    monkeypatch.setenv(pki.ENV["cert"], cert)
    monkeypatch.setenv(pki.ENV["key"], key)
    monkeypatch.setenv(pki.ENV["ca"], ca_path)


def test_good_files_are_taken_and_given_to_the_environment(clean_env, ca, tmp_path):
    mine = ca.issue("host-a")
    os.chdir(tmp_path)   # relative paths become absolute, for children in other dirs
    got = pki.use(os.path.basename(mine.cert), os.path.basename(mine.key),
                  os.path.basename(ca.cert))
    assert got is not None and got.ca_subject == "CN=test-ca"
    assert got.ca_fingerprint.startswith("sha256:")
    assert os.environ[pki.ENV["cert"]] == mine.cert
    assert os.environ[pki.ENV["ca"]] == ca.cert
    assert pki.current() == got
    # No certificates at all: the token's key (None), whatever was given before stays.
    assert pki.use(None, None, None) == got


def test_no_certificates_means_the_tokens_key(clean_env):
    assert pki.current() is None
    assert pki.use(None, None, None) is None


@pytest.mark.parametrize("case, needle", [
    ("missing", "missing: --tls-ca"),
    ("unreadable", "cannot read it"),
    ("not_pem", "no PEM certificate"),
    ("other_key", "is not the key of --tls-cert"),
    ("encrypted_key", "the key is encrypted"),
    ("expired", "expired on"),
    ("not_yet", "is not valid before"),
    ("other_ca", "does not verify against --tls-ca"),
])
def test_files_that_do_not_hold_up_are_refused_naming_the_file_and_the_fix(
        clean_env, ca, tmp_path, case, needle):
    mine = ca.issue("host-a")
    cert, key, ca_path = mine.cert, mine.key, ca.cert
    if case == "missing":
        ca_path = ""
    elif case == "unreadable":
        ca_path = str(tmp_path / "nowhere.pem")
    elif case == "not_pem":
        cert = str(tmp_path / "junk.pem")
        with open(cert, "w") as f:
            f.write("not a certificate\n")
    elif case == "other_key":
        key = ca.issue("host-b").key
    elif case == "encrypted_key":
        locked = ca.issue("host-c", password=b"secret")
        cert, key = locked.cert, locked.key
    elif case == "expired":
        old = ca.issue("host-d", start_days=-10, days=-1)
        cert, key = old.cert, old.key
    elif case == "not_yet":
        new = ca.issue("host-e", start_days=2, days=10)
        cert, key = new.cert, new.key
    elif case == "other_ca":
        other = CA(str(tmp_path), "other-ca")
        ca_path = other.cert
    with pytest.raises(TLSConfigError) as err:
        pki.use(cert, key, ca_path)
    assert needle in str(err.value)
    assert case == "missing" or any(p in str(err.value) for p in (cert, key, ca_path))
    assert pki.ENV["cert"] not in os.environ   # nothing taken


def test_a_partial_environment_is_refused_naming_what_is_missing(clean_env, ca):
    mine = ca.issue("host-a")
    clean_env.setenv(pki.ENV["cert"], mine.cert)
    with pytest.raises(TLSConfigError, match="ORCHESTRA_TLS_KEY.*ORCHESTRA_TLS_CA"):
        pki.current()


_SERVER = """
import socket, sys
from orchestra._protocol import auth
lsock = socket.create_server(("127.0.0.1", 0))
print(lsock.getsockname()[1], flush=True)
conn, _ = lsock.accept()
try:
    stream = auth.accept_secure(conn, sys.argv[1], timeout_s=5)
    buf = bytearray(64)
    n = stream.recv_into(buf)
    stream.sendall(bytes(buf[:n]).upper())
    print("served", flush=True)
except Exception as exc:
    print("refused:", type(exc).__name__, exc, flush=True)
"""


def _server(files, ca_path: str) -> tuple[subprocess.Popen, int]:
    """A server in a process of its own (another machine's), on ``files`` of the CA."""
    env = {**os.environ, pki.ENV["cert"]: files.cert, pki.ENV["key"]: files.key,
           pki.ENV["ca"]: ca_path}
    proc = subprocess.Popen([sys.executable, "-c", _SERVER, TOKEN], env=env,
                            stdout=subprocess.PIPE, text=True)
    return proc, int(proc.stdout.readline())


def _connect(port: int):
    sock = socket.create_connection(("127.0.0.1", port), timeout=5)
    return _auth.connect_secure(sock, TOKEN, timeout_s=5, peer=f"127.0.0.1:{port}")


def test_two_machines_certificates_of_one_ca_talk_and_prove_the_token(clean_env, ca):
    proc, port = _server(ca.issue("host-a"), ca.cert)
    mine = ca.issue("host-b")
    _set(clean_env, mine.cert, mine.key, ca.cert)
    try:
        stream = _connect(port)
        der = stream.peer_der()
        assert der is not None and b"host-a" in der   # its certificate, not the token's key
        stream.sendall(b"over the ca")
        buf = bytearray(64)
        n = stream.recv_into(buf)
        assert bytes(buf[:n]) == b"OVER THE CA"
        stream.close()
        assert proc.stdout.readline().strip() == "served"
    finally:
        proc.kill()
        proc.wait()


@pytest.mark.parametrize("client", ["other_ca", "none"])
def test_a_client_without_a_certificate_of_the_ca_is_refused(clean_env, ca, tmp_path, client):
    proc, port = _server(ca.issue("host-a"), ca.cert)
    try:
        if client == "other_ca":
            other = CA(str(tmp_path), "other-ca")
            stranger = other.issue("stranger")
            _set(clean_env, stranger.cert, stranger.key, other.cert)
            # The client refuses the server first: its certificate is not of its CA.
            with pytest.raises(AuthenticationError, match="does not chain to this process's CA"):
                _connect(port)
        else:
            # The token's pin alone: the server's key is not the token's, and the message
            # says how to give this process certificates.
            with pytest.raises(AuthenticationError, match="--tls-cert/--tls-key/--tls-ca"):
                _connect(port)
        assert proc.stdout.readline().startswith("refused:")
    finally:
        proc.kill()
        proc.wait()


def test_a_server_refuses_a_client_of_another_ca_even_if_it_trusts_the_server(
        clean_env, ca, tmp_path):
    """A client that holds the server's CA but presents a certificate of another CA."""
    proc, port = _server(ca.issue("host-a"), ca.cert)
    other = CA(str(tmp_path), "other-ca")
    stranger = other.issue("stranger")
    both = str(tmp_path / "both.pem")
    with open(both, "w") as f:
        f.write(open(ca.cert).read() + open(other.cert).read())
    _set(clean_env, stranger.cert, stranger.key, both)
    try:
        with pytest.raises((AuthenticationError, ConnectionError, OSError)):
            stream = _connect(port)
            stream.sendall(b"x")
            buf = bytearray(8)
            if not stream.recv_into(buf):
                raise ConnectionError("closed")
        assert proc.stdout.readline().startswith("refused:")
    finally:
        proc.kill()
        proc.wait()
