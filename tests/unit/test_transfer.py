"""The data path between nodes: a DataServer serving files of a temporary directory
under /dev/shm over loopback, and Fetcher pulling them into buffers. Real sockets, real
files, the real handshake (orchestra._protocol.auth); each test's server runs on its own threads
in this process."""
from __future__ import annotations

import mmap
import os
import socket
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from orchestra._objects.transfer import DataServer, Fetcher, parse_address
from orchestra._protocol import auth as _auth
from orchestra.exceptions import AuthenticationError, ObjectLostError

pytestmark = pytest.mark.timeout(60)

KiB, MiB = 1 << 10, 1 << 20


@pytest.fixture
def folder() -> Iterator[Path]:
    """A private directory under /dev/shm (tmpfs, as segments are)."""
    import tempfile
    path = Path(tempfile.mkdtemp(prefix="orchestra-test-xfer-", dir="/dev/shm"))
    yield path
    for p in path.iterdir():
        p.unlink()
    path.rmdir()


def dir_resolver(folder: Path) -> Callable[[str], tuple[str, int, int] | None]:
    """Names of plain files directly in ``folder``, nothing else (as a node's resolve)."""
    def resolve(key: str) -> tuple[str, int, int] | None:
        if "/" in key or key.startswith("."):
            return None
        path = folder / key
        return (str(path), path.stat().st_size, 0) if path.is_file() else None
    return resolve


@pytest.fixture
def token() -> str:
    return _auth.new_token()


@pytest.fixture
def serve(folder: Path, token: str) -> Iterator[Callable[..., DataServer]]:
    servers: list[DataServer] = []

    def make(resolve: Callable[[str], tuple[str, int, int] | None] | None = None,
             **kw: Any) -> DataServer:
        server = DataServer("127.0.0.1", token, resolve or dir_resolver(folder), **kw)
        servers.append(server)
        return server
    yield make
    for s in servers:
        s.close()


@pytest.fixture
def fetcher() -> Iterator[Fetcher]:
    f = Fetcher(timeout_s=5.0, connect_timeout_s=5.0)
    yield f
    f.close()


def write(folder: Path, name: str, size: int) -> bytes:
    data = os.urandom(min(size, MiB)) * (size // MiB) + os.urandom(size % MiB) \
        if size >= MiB else os.urandom(size)
    (folder / name).write_bytes(data)
    return data


# ---------------------------------------------------------------- content


@pytest.mark.parametrize("size", [0, 1, 200 * KiB])
def test_an_object_arrives_byte_for_byte(serve: Any, fetcher: Fetcher, folder: Path,
                                         token: str, size: int) -> None:
    data = write(folder, "obj", size)
    server = serve()
    dest = bytearray(size)
    fetcher.fetch(server.address, token, "obj", size, memoryview(dest))
    assert dest == data


@pytest.mark.timeout(120)
@pytest.mark.parametrize("streams", [1, 2])
def test_a_200_mib_object_arrives_byte_for_byte_in_a_mapped_segment(
        serve: Any, fetcher: Fetcher, folder: Path, token: str, streams: int) -> None:
    size = 200 * MiB
    data = write(folder, "big", size)
    server = serve()
    mm = mmap.mmap(-1, size)
    view = memoryview(mm)
    try:
        fetcher.fetch(server.address, token, "big", size, view, streams=streams)
        assert view == data
    finally:
        view.release()
        mm.close()


def test_a_range_of_an_object_can_be_fetched(serve: Any, fetcher: Fetcher, folder: Path,
                                             token: str) -> None:
    data = write(folder, "obj", 10_000)
    dest = bytearray(1000)
    fetcher.fetch(serve().address, token, "obj", 1000, memoryview(dest), offset=5000)
    assert dest == data[5000:6000]


def test_one_connection_serves_request_after_request(serve: Any, fetcher: Fetcher,
                                                     folder: Path, token: str) -> None:
    objects = {f"o{i}": write(folder, f"o{i}", 1000 * i) for i in range(1, 6)}
    server = serve()
    for key, data in objects.items():
        dest = bytearray(len(data))
        fetcher.fetch(server.address, token, key, len(data), memoryview(dest))
        assert dest == data
    assert len(fetcher._idle[(server.address, token)]) == 1


# ---------------------------------------------------------------- refusals


def test_a_wrong_token_is_refused_before_any_request_is_read(serve: Any, folder: Path) -> None:
    write(folder, "obj", 100)
    asked: list[str] = []
    resolve = dir_resolver(folder)
    server = serve(lambda key: asked.append(key) or resolve(key))
    f = Fetcher(timeout_s=5.0, connect_timeout_s=5.0)
    try:
        with pytest.raises(AuthenticationError, match="token"):
            f.fetch(server.address, "not-the-token", "obj", 100, memoryview(bytearray(100)))
    finally:
        f.close()
    assert asked == []


def test_bytes_sent_without_the_handshake_are_never_read_as_a_request(
        serve: Any, folder: Path) -> None:
    write(folder, "obj", 100)
    asked: list[str] = []
    resolve = dir_resolver(folder)
    server = serve(lambda key: asked.append(key) or resolve(key))
    host, port = parse_address(server.address)
    with socket.create_connection((host, port), timeout=5) as sock:
        sock.sendall(b"\x00\x03" + bytes(16) + b"obj" + bytes(200))
        sock.settimeout(5)
        try:
            while sock.recv(4096):   # the server's hello, then it closes
                pass
        except ConnectionResetError:   # closed with our bytes unread
            pass
    assert asked == []


def test_a_missing_key_is_an_error_and_the_connection_stays_usable(
        serve: Any, fetcher: Fetcher, folder: Path, token: str) -> None:
    data = write(folder, "obj", 100)
    server = serve()
    with pytest.raises(ObjectLostError, match="no object stored under 'gone'"):
        fetcher.fetch(server.address, token, "gone", 100, memoryview(bytearray(100)))
    dest = bytearray(100)
    fetcher.fetch(server.address, token, "obj", 100, memoryview(dest))
    assert dest == data
    assert len(fetcher._idle[(server.address, token)]) == 1   # the same connection


@pytest.mark.parametrize("key", ["../secret", "/etc/passwd", ".hidden", "sub/obj"])
def test_a_key_outside_the_directory_is_refused(serve: Any, fetcher: Fetcher, folder: Path,
                                                tmp_path: Path, token: str, key: str) -> None:
    (tmp_path / "secret").write_bytes(b"s" * 10)
    (folder / ".hidden").write_bytes(b"h" * 10)
    server = serve()
    with pytest.raises(ObjectLostError, match="no object stored under"):
        fetcher.fetch(server.address, token, key, 10, memoryview(bytearray(10)))


def test_asking_for_more_bytes_than_the_object_has_is_an_error(
        serve: Any, fetcher: Fetcher, folder: Path, token: str) -> None:
    write(folder, "obj", 100)
    with pytest.raises(ObjectLostError, match="asked for bytes 0..200 of 'obj', which has 100"):
        fetcher.fetch(serve().address, token, "obj", 200, memoryview(bytearray(200)))


def test_a_symbolic_link_is_never_followed(serve: Any, fetcher: Fetcher, folder: Path,
                                           tmp_path: Path, token: str) -> None:
    (tmp_path / "secret").write_bytes(b"s" * 10)
    os.symlink(tmp_path / "secret", folder / "link")
    # A resolve that (wrongly) names the link: the server still refuses to open it.
    server = serve(lambda key: (str(folder / key), 10, 0))
    with pytest.raises(ObjectLostError, match="cannot open 'link'"):
        fetcher.fetch(server.address, token, "link", 10, memoryview(bytearray(10)))


# ---------------------------------------------------------------- a source that goes


def test_no_server_at_the_address_is_a_clear_error(fetcher: Fetcher, token: str) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        address = f"127.0.0.1:{s.getsockname()[1]}"
    with pytest.raises(ObjectLostError, match=f"cannot reach the data server .* at {address}"):
        fetcher.fetch(address, token, "obj", 1, memoryview(bytearray(1)))


def test_a_server_closed_mid_transfer_fails_the_fetch_at_once(
        serve: Any, fetcher: Fetcher, folder: Path, token: str) -> None:
    write(folder, "obj", 8 * MiB)
    resolve = dir_resolver(folder)
    holder: list[DataServer] = []

    def close_then_resolve(key: str) -> tuple[str, int, int] | None:
        holder[0].close()   # the node shuts down as the request arrives
        return resolve(key)
    holder.append(serve(close_then_resolve))
    t0 = time.monotonic()
    with pytest.raises(ObjectLostError, match="closed the connection"):
        fetcher.fetch(holder[0].address, token, "obj", 8 * MiB, memoryview(bytearray(8 * MiB)))
    assert time.monotonic() - t0 < 4.0   # no hang: well before the 5 s stall timeout


@pytest.mark.timeout(120)
def test_a_server_closed_while_bytes_flow_fails_the_fetch_with_a_short_read(
        serve: Any, fetcher: Fetcher, folder: Path, token: str) -> None:
    size = 256 * MiB
    data = write(folder, "big", size)
    server = serve()
    dest = bytearray(size)
    head = data[:64]

    def close_once_bytes_arrive() -> None:
        deadline = time.monotonic() + 30
        while dest[:64] != head and time.monotonic() < deadline:
            time.sleep(0.0005)
        server.close()
    closer = threading.Thread(target=close_once_bytes_arrive)
    closer.start()
    try:
        with pytest.raises(ObjectLostError, match=r"closed the connection after \d+ of "
                                                  f"{size} bytes"):
            fetcher.fetch(server.address, token, "big", size, memoryview(dest), streams=1)
    finally:
        closer.join()


def test_a_file_that_shrinks_while_sent_is_a_short_read(
        serve: Any, fetcher: Fetcher, folder: Path, token: str) -> None:
    write(folder, "obj", 4 * MiB)
    resolve = dir_resolver(folder)

    def shrink(key: str) -> tuple[str, int, int] | None:
        found = resolve(key)
        os.truncate(folder / key, MiB)   # after the size was read
        return found
    server = serve(shrink)
    with pytest.raises(ObjectLostError, match="is not a complete file here"):
        fetcher.fetch(server.address, token, "obj", 4 * MiB, memoryview(bytearray(4 * MiB)))


def test_a_server_that_stalls_fails_the_fetch_after_the_timeout(
        serve: Any, folder: Path, token: str) -> None:
    write(folder, "obj", 100)
    resolve = dir_resolver(folder)
    release = threading.Event()

    def stall(key: str) -> tuple[str, int, int] | None:
        release.wait(10)
        return resolve(key)
    server = serve(stall)
    f = Fetcher(timeout_s=0.5, connect_timeout_s=5.0)
    try:
        with pytest.raises(ObjectLostError, match="sent nothing for"):
            f.fetch(server.address, token, "obj", 100, memoryview(bytearray(100)))
    finally:
        release.set()
        f.close()


def test_a_pooled_connection_the_server_dropped_is_replaced(
        serve: Any, fetcher: Fetcher, folder: Path, token: str) -> None:
    data = write(folder, "obj", 1000)
    first = serve()
    fetcher.fetch(first.address, token, "obj", 1000, memoryview(bytearray(1000)))
    port = parse_address(first.address)[1]
    first.close()   # its idle connection in the pool is now closed at the far end
    second = serve(port=port)   # the node came back on the same port
    dest = bytearray(1000)
    fetcher.fetch(second.address, token, "obj", 1000, memoryview(dest))
    assert dest == data


def test_a_closed_server_stops_accepting(serve: Any, fetcher: Fetcher, token: str) -> None:
    server = serve()
    server.close()
    with pytest.raises(ObjectLostError, match="cannot reach"):
        fetcher.fetch(server.address, token, "obj", 1, memoryview(bytearray(1)))


def test_a_bad_address_is_named() -> None:
    with pytest.raises(ValueError, match="'nohost'"):
        parse_address("nohost")


def test_a_wildcard_listener_is_offered_at_the_address_peers_reached():
    from orchestra._node.process import routable
    assert routable("0.0.0.0:4100", ("10.77.0.3", 51000)) == "10.77.0.3:4100"
    assert routable("[::]:4100", ("fd00::3", 51000, 0, 0)) == "[fd00::3]:4100"
    assert routable("10.77.0.3:4100", ("127.0.0.1", 1)) == "10.77.0.3:4100"
