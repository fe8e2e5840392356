"""Shared memory only the session's user can touch: another local user can neither read,
list, create nor plant anything of a session, and squatting changes no result.

The other user is real: a system account made for this module with ``useradd`` and
removed after it; its attempts run in a child process with that uid and gid (stdlib
only, the system python). Without root (or useradd) the module is skipped, saying so.

Segments are found the way an observer would, by what this driver maps
(/proc/self/maps): the tests hold whatever the layout of /dev/shm is.

    attack                                   expected
    list / open / create in the segments'    refused (a 0700 directory of the session)
      directory
    squat predicted names in /dev/shm        every put, argument and result still works
    plant a pickle at a spilled object's     never unpickled; get returns the object
      old name
    a segment file swapped for another       an ObjectStoreError naming the path, no map
      owner's file, 0644 file or symlink
    a create that fails                      an ObjectStoreError naming the path, and the
                                             store's used bytes back to 0
"""
from __future__ import annotations

import json
import os
import pickle
import pwd
import re
import secrets
import shutil
import stat
import subprocess
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

import _helpers as h
import orchestra
from _probes import segment_file, wait_until
from orchestra.exceptions import ObjectStoreError, OrchestraError

pytestmark = pytest.mark.timeout(120)

T = 30
MiB = 1 << 20
SHM = "/dev/shm"
SYSTEM_PYTHON = "/usr/bin/python3"


class OtherUser:
    """A second local account; ``run(code, *args)`` runs Python code as it."""

    def __init__(self, name: str) -> None:
        self.name = name
        entry = pwd.getpwnam(name)
        self.uid, self.gid = entry.pw_uid, entry.pw_gid

    def run(self, code: str, *args: str, stdin: bytes = b"") -> dict[str, Any]:
        """Run ``code`` as this user; it prints one JSON object, returned here."""
        proc = subprocess.run([SYSTEM_PYTHON, "-c", code, *args], input=stdin,
                              capture_output=True, timeout=T, cwd="/", user=self.uid,
                              group=self.gid, extra_groups=[], env={"PATH": "/usr/bin:/bin"})
        assert proc.returncode == 0, proc.stderr.decode()
        return json.loads(proc.stdout)


@pytest.fixture(scope="module")
def other_user() -> Iterator[OtherUser]:
    if os.geteuid() != 0:
        pytest.skip("needs root to create a second local user (useradd)")
    if shutil.which("useradd") is None or not os.path.exists(SYSTEM_PYTHON):
        pytest.skip(f"needs useradd and {SYSTEM_PYTHON} to act as a second local user")
    name = f"orchtest{secrets.token_hex(4)}"
    subprocess.run(["useradd", "-M", "-r", "-s", "/usr/sbin/nologin", name],
                   check=True, capture_output=True, timeout=T)
    user = OtherUser(name)
    try:
        yield user
    finally:
        _remove_files_of(user.uid)
        subprocess.run(["userdel", name], capture_output=True, timeout=T)


def _remove_files_of(uid: int) -> None:
    """What the other user made under /dev/shm (squatted or planted files)."""
    for folder, dirs, files in os.walk(SHM):
        for name in dirs + files:
            path = os.path.join(folder, name)
            try:
                if os.lstat(path).st_uid == uid and not stat.S_ISDIR(os.lstat(path).st_mode):
                    os.unlink(path)
            except FileNotFoundError:
                pass


def _mapped_shm_files() -> set[str]:
    """Files under /dev/shm this process maps (segments it wrote or read)."""
    with open("/proc/self/maps") as f:
        return {line.split(None, 5)[5].strip() for line in f
                if len(line.split(None, 5)) == 6 and line.split(None, 5)[5].startswith(SHM + "/")}


def _put_and_find_segment(value: Any) -> tuple[Any, str]:
    """Put ``value`` (large) and return its ref and the path of its segment."""
    before = _mapped_shm_files()
    ref = orchestra.put(value)
    new = {p for p in _mapped_shm_files() - before if not p.endswith("(deleted)")}
    assert len(new) == 1, f"expected one new segment mapped, found {sorted(new)}"
    return ref, new.pop()


_PROBE = r"""
import json, os, sys
path = sys.argv[1]
folder = os.path.dirname(path)
out = {}
try:
    out["listed"] = os.path.basename(path) in os.listdir(folder)
except OSError as exc:
    out["listed"] = False
try:
    os.close(os.open(path, os.O_RDONLY))
    out["opened"] = True
except OSError:
    out["opened"] = False
try:
    fd = os.open(os.path.join(folder, "planted-by-another-user"), os.O_CREAT | os.O_WRONLY, 0o644)
    os.close(fd)
    out["created"] = True
except OSError:
    out["created"] = False
print(json.dumps(out))
"""


@pytest.mark.parametrize("size", [4 * MiB, MiB], ids=["segment", "slab"])
def test_another_user_cannot_list_open_or_create_in_the_sessions_shared_memory(
        start_cluster, other_user, size):
    start_cluster(num_cpus=1, object_store_memory=128 * MiB)
    ref, path = _put_and_find_segment(np.ones(size // 8))
    folder = os.path.dirname(path)
    st = os.lstat(folder)
    assert stat.S_ISDIR(st.st_mode) and st.st_uid == os.geteuid()
    assert stat.S_IMODE(st.st_mode) == 0o700, \
        f"segments live in {folder}, mode {stat.S_IMODE(st.st_mode):o}: others may write there"
    seen = other_user.run(_PROBE, path)
    assert seen == {"listed": False, "opened": False, "created": False}
    assert orchestra.get(ref, timeout=T).sum() == size // 8


_SQUAT = r"""
import json, os, sys
names = json.loads(sys.argv[1])
made = 0
folders = ["/dev/shm"] + [os.path.join("/dev/shm", d) for d in os.listdir("/dev/shm")]
for folder in folders:
    for name in names:
        try:
            os.close(os.open(os.path.join(folder, name), os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644))
            made += 1
        except OSError:
            pass
print(json.dumps({"made": made}))
"""


def _predictable_names(c: Any) -> list[str]:
    """Names a squatter would guess: what the head pid, the session id (visible in /tmp)
    and a counter give, in the layouts a store could use."""
    session_id = os.path.basename(c.session_dir).removeprefix("orchestra-session-")
    names = []
    for n in range(0, 80):
        names += [f"orch-{c.head_pid}-{session_id}-{n}", f"seg-{n}", f"slab-{n}.1", str(n)]
    return names


def test_squatting_the_predictable_names_changes_no_result(start_cluster, other_user):
    c = start_cluster(num_cpus=1, object_store_memory=256 * MiB)
    try:
        other_user.run(_SQUAT, json.dumps(_predictable_names(c)))
        _use_segments_every_way(c)
    finally:
        _remove_files_of(other_user.uid)


def _use_segments_every_way(c: Any) -> None:
    sizes = [1, 3, 6, 12, 24]   # MiB: a new size class, so a new segment, each time
    refs = [orchestra.put(np.full(n * MiB // 8, n)) for n in sizes]
    assert [int(orchestra.get(r, timeout=T)[0]) for r in refs] == sizes
    # Large arguments and large results go through segments too.
    total = orchestra.get(h.add.remote(refs[2], np.ones(6 * MiB // 8)), timeout=T)
    assert total.shape == (6 * MiB // 8,) and float(total[0]) == 7.0
    made = orchestra.get(h.make_array.remote(3 * MiB), timeout=T)
    assert int(made[-1]) == 3 * MiB - 1
    del refs, total, made
    wait_until(lambda: c.store().used == 0, 10, "the store's bytes all given back")


class _Marker:
    """Unpickling it creates a file: the proof that a planted pickle ran."""

    def __init__(self, path: str) -> None:
        self.path = path

    def __reduce__(self) -> tuple[Any, ...]:
        return (open, (self.path, "w"))


_PLANT = r"""
import json, os, sys
path = sys.argv[1]
payload = sys.stdin.buffer.read()
try:
    fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
    os.write(fd, payload)
    os.close(fd)
    planted = True
except OSError as exc:
    planted = False
print(json.dumps({"planted": planted}))
"""


def test_a_pickle_planted_at_a_spilled_objects_old_name_is_never_unpickled(
        start_cluster, other_user, tmp_path):
    store, piece = 64 * MiB, 16 * MiB
    c = start_cluster(num_cpus=1, object_store_memory=store)
    first, path = _put_and_find_segment(np.full(piece // 8, 7))
    more = [orchestra.put(np.full(piece // 8, i)) for i in range(4)]   # spills the first
    wait_until(lambda: c.objects()[first.binary()].spilled, 10, "the first object spilled")
    assert not os.path.exists(path)
    marker = tmp_path / "planted-pickle-ran"
    payload = pickle.dumps(_Marker(str(marker)), protocol=2).ljust(2 * piece, b"\0")
    other_user.run(_PLANT, path, stdin=payload)
    value = orchestra.get(first, timeout=T)
    assert not marker.exists(), "a pickle another user planted was unpickled"
    assert isinstance(value, np.ndarray) and value.shape == (piece // 8,) and (value == 7).all()
    del more


def _swap_for_other_owner(path: str, user: OtherUser) -> None:
    os.chown(path, user.uid, user.gid)


def _swap_for_world_readable(path: str, user: OtherUser) -> None:
    os.chmod(path, 0o644)


def _swap_for_symlink(path: str, user: OtherUser) -> None:
    target = path + ".target"
    os.rename(path, target)
    os.symlink(target, path)


@pytest.mark.parametrize("size", [4 * MiB, MiB], ids=["segment", "slab"])
@pytest.mark.parametrize("swap", [_swap_for_other_owner, _swap_for_world_readable,
                                  _swap_for_symlink],
                         ids=["owned-by-another-user", "mode-0644", "symlink"])
def test_a_segment_that_is_not_the_sessions_own_file_is_never_mapped(
        start_cluster, other_user, swap, size):
    start_cluster(num_cpus=1, object_store_memory=128 * MiB)
    # Made by a task: this process has no map of it yet. (A value it put itself is read
    # back through the map it wrote, made before any swap.)
    ref = h.make_array.remote(size // 8)   # (1 MiB: a slot, its slab's file swapped)
    path = segment_file(ref)
    swap(path, other_user)
    with pytest.raises(ObjectStoreError) as info:
        orchestra.get(ref, timeout=T)
    assert path in str(info.value)


def test_a_create_that_fails_raises_naming_the_path_and_gives_its_bytes_back(start_cluster):
    c = start_cluster(num_cpus=1, object_store_memory=256 * MiB,
                      _system_config={"warm_bytes": 0})
    ref, path = _put_and_find_segment(np.ones(3 * MiB // 8))   # a file of its own
    del ref
    wait_until(lambda: c.store().used == 0, 10, "the first object freed")
    # Files of this user at every next name of the same layout: something (a bug, a
    # leftover) took the names the store hands out next.
    folder, name = os.path.split(path)
    stem, n = re.fullmatch(r"(.*?)(\d+)", name).groups()   # type: ignore[union-attr]
    for i in range(int(n) + 1, int(n) + 40):
        os.close(os.open(os.path.join(folder, f"{stem}{i}"), os.O_CREAT | os.O_WRONLY, 0o600))
    with pytest.raises(OrchestraError) as info:
        orchestra.put(np.ones(20 * MiB // 8))
    assert folder in str(info.value) and "exists" in str(info.value)
    wait_until(lambda: c.store().used == 0, 10, "the failed create's bytes given back")
    assert not [o for o in c.objects().values() if o.in_shared_memory]


def test_a_slab_that_cannot_be_made_fails_the_put_naming_its_path(start_cluster):
    """The store makes a slab's file itself (O_EXCL): one of this user's files at the
    next slab names fails the put that needs a new slab, naming the file, and the
    objects in the slabs there are stay readable."""
    c = start_cluster(num_cpus=1, object_store_memory=256 * MiB,
                      _system_config={"warm_bytes": 0})
    kept, path = _put_and_find_segment(np.ones(MiB // 8))   # a slot: slab-<n>.1
    folder, name = os.path.split(path)
    n = int(re.fullmatch(r"slab-(\d+)\.1", name).group(1))   # type: ignore[union-attr]
    for i in range(n + 1, n + 40):
        os.close(os.open(os.path.join(folder, f"slab-{i}.1"), os.O_CREAT | os.O_WRONLY, 0o600))
    with pytest.raises(OrchestraError) as info:
        orchestra.put(np.ones(100_000 // 8))   # another class: a slab of its own
    assert folder in str(info.value) and "exists" in str(info.value)
    assert float(orchestra.get(kept).sum()) == MiB // 8
    del kept
    wait_until(lambda: c.store().used == 0, 10, "the objects freed")


_KNOCK = r"""
import json, socket, sys
out = {}
ATTEMPTS = {
    # a driver's Hello frame right away, as if no handshake existed
    "frame": b"\x05\x00\x00\x00\x01abcd",
    # the client's opening, then a well-formed answer to the challenge with a MAC made
    # without the token
    "forged": b"ORCA\x01" + b"ORCA" + b"\x00" * 64 + b"\x05" + b"0.1.0",
}
for name, address in json.loads(sys.argv[1]).items():
    host, port = address.rsplit(":", 1)
    for attempt, data in ATTEMPTS.items():
        try:
            s = socket.create_connection((host, int(port)), timeout=5)
            s.settimeout(15)
            hello = b""
            while len(hello) < 37 or len(hello) < 37 + hello[36]:   # magic, nonce, version
                chunk = s.recv(64)
                if not chunk:
                    break
                hello += chunk
            challenge = hello[:4]
            rest = b""
            try:
                s.sendall(data)
                s.shutdown(socket.SHUT_WR)   # nothing more: the server decides on this
            except (BrokenPipeError, ConnectionResetError, OSError):
                # The server closed at the first byte that is no opening (the frame),
                # before this sent the rest: no answer either.
                out[f"{name}/{attempt}"] = [challenge.decode(errors="replace"), ""]
                continue
            try:
                while True:
                    chunk = s.recv(4096)
                    if not chunk:
                        break
                    rest += chunk
            except ConnectionResetError:   # closed with what it sent unread: no answer
                pass
            out[f"{name}/{attempt}"] = [challenge.decode(errors="replace"), rest[:1].decode()]
        except OSError as exc:
            out[f"{name}/{attempt}"] = ["error", type(exc).__name__]
for name, path in json.loads(sys.argv[2]).items():
    try:
        import os
        os.listdir(path)
        out[name] = "listed"
    except PermissionError:
        out[name] = "refused"
print(json.dumps(out))
"""


def test_another_user_gets_nothing_from_a_clusters_tcp_listeners(other_user):
    # A head and a joined node listening on TCP: the other user can connect, as anyone
    # on the network could, but is refused before anything it sends is read, and cannot
    # look into the node's or the records' directories.
    with h.joined_cluster({"num_cpus": 1}, {"num_cpus": 1}) as (c, node):
        with open(os.path.join(node.session_dir, "node.json")) as f:
            data_address = json.load(f)["data_address"]
        targets = {"head": c.address, "data server": data_address}
        dirs = {"node dir": node.session_dir, "records": c._state}   # the token is in there
        seen = other_user.run(_KNOCK, json.dumps(targets), json.dumps(dirs))
        for name in targets:
            # The frame is never read as one: the connection closes (it is no answer);
            # the forged answer is refused as a wrong token.
            assert seen[f"{name}/frame"][0] == "ORCA" and seen[f"{name}/frame"][1] == "", seen
            assert seen[f"{name}/forged"] == ["ORCA", "T"], seen
        assert seen["node dir"] == "refused" and seen["records"] == "refused", seen
        assert orchestra.get(h.node_of.remote(), timeout=T) in {n["NodeID"] for n in orchestra.nodes()}
        assert all(n["Alive"] for n in orchestra.nodes())
