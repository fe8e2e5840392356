"""The head's state store (orchestra/_head/state_store.py), the same promises of both
kinds: SQLite (a file) and Redis (a redis-server of the test's own). Records by table and
key survive a reopen; one head holds the lease, another is refused naming it, the same
holder takes it back at once, an expired one is taken over; a Redis that goes away while
the head runs is said and survived; a store that cannot be used is a clear error."""
from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from _redis import RedisServer, free_port, skip_reason
from orchestra._head import state_store as ss
from test_shm_security import other_user  # noqa: F401 (the fixture, a second local user)

pytestmark = pytest.mark.timeout(60)


@pytest.fixture(params=["sqlite", "redis"])
def url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return "sqlite://" + str(tmp_path / "state" / "head.db")
    return request.getfixturevalue("redis_server").url


def test_records_survive_a_reopen(url: str) -> None:
    store = ss.open_store(url)
    store.put("actors", "a", b"\x00spec")
    store.put("actors", "b", b"other")
    store.put("nodes", "a", b"not an actor")
    store.delete("actors", "b")
    store.close()
    again = ss.open_store(url)
    assert again.get("actors", "a") == b"\x00spec"
    assert again.get("actors", "b") is None
    assert again.items("actors") == {"a": b"\x00spec"}
    assert again.items("nodes") == {"a": b"not an actor"}
    again.close()


def test_one_head_holds_the_lease_and_its_restart_takes_it_back(url: str) -> None:
    first, second = ss.open_store(url), ss.open_store(url)
    first.take_lease("head A")
    with pytest.raises(ss.HeadLeaseHeld, match="another head \\(head A\\)") as info:
        second.take_lease("head B")
    assert "orchestra stop" in str(info.value) and url in str(info.value)
    first.take_lease("head A")   # its own restart: at once
    assert first.renew_lease("head A")
    assert not second.renew_lease("head B")
    first.release_lease("head A")
    second.take_lease("head B")   # given back: at once
    assert not first.renew_lease("head A")
    first.close()
    second.close()


def test_a_lease_whose_holder_died_is_taken_over_once_it_expires(url: str) -> None:
    first, second = ss.open_store(url), ss.open_store(url)
    first.take_lease("head A", ttl_s=0.3)   # then it "dies": no renewal
    with pytest.raises(ss.HeadLeaseHeld):
        second.take_lease("head B")
    time.sleep(0.5)
    second.take_lease("head B")
    assert not first.renew_lease("head A")
    first.close()
    second.close()


def test_the_head_writes_its_identity_and_keeps_it_across_starts(url: str) -> None:
    said: list[str] = []
    head = ss.HeadState(url, "head A", "tok-1", said.append, said.append)
    head.start()
    cluster_id = head.cluster_id
    assert len(cluster_id) == 16
    head.stop()
    again = ss.HeadState(url, "head B", "tok-2", said.append, said.append)
    again.start()   # given back at stop: another head may start at once
    assert again.cluster_id == cluster_id
    store = ss.open_store(url)
    assert store.get(ss.CLUSTER, "token") == b"tok-2"
    with pytest.raises(ss.HeadLeaseHeld, match="head B"):
        store.take_lease("head C")
    store.close()
    again.stop()
    assert said == []


def test_a_head_whose_lease_was_taken_is_told_to_stop(url: str) -> None:
    lost: list[str] = []
    head = ss.HeadState(url, "head A", "tok", lost.append, lost.append)
    head.start()
    other = ss.open_store(url)
    other.release_lease("head A")   # as if it had expired
    other.take_lease("head B")
    deadline = time.monotonic() + ss.LEASE_TTL_S
    while not lost and time.monotonic() < deadline:
        time.sleep(0.05)
    assert lost and "another head took the lease" in lost[0]
    head.stop()
    assert not other.renew_lease("head A") and other.renew_lease("head B")
    other.close()


def test_a_redis_that_goes_away_is_said_and_the_lease_kept_when_it_is_back(
        redis_server: RedisServer) -> None:
    said: list[str] = []
    lost: list[str] = []
    ttl = 4.0   # a lease of 4 s (10 by default): the same story, sooner
    head = ss.HeadState(redis_server.url, "head A", "tok", lost.append, said.append,
                        lease_ttl_s=ttl)
    head.start()
    redis_server.stop()
    deadline = time.monotonic() + ttl
    while not said and time.monotonic() < deadline:
        time.sleep(0.05)
    assert said and "does not answer" in said[0] and "serves on" in said[0]
    # Away for longer than the lease lives: the lease its append-only file kept has
    # expired when it is back. The head takes it back before it says the store answers
    # (it said so first, and for up to a quarter of the lease's life another head could
    # take the cluster over).
    time.sleep(ttl)
    redis_server.start()
    deadline = time.monotonic() + ss.LEASE_TTL_S
    while not any("answers again" in s for s in said) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert len(said) == 3 and "had lost this head's lease: taken back" in said[1], said
    assert "answers again" in said[2]
    assert lost == []
    store = ss.open_store(redis_server.url)
    with pytest.raises(ss.HeadLeaseHeld, match="head A"):
        store.take_lease("head B")
    store.close()
    head.stop()


def test_an_unreachable_redis_is_named_with_the_fix() -> None:
    if skip_reason().startswith("the redis package"):
        pytest.skip(skip_reason())
    url = f"redis://127.0.0.1:{free_port()}/0"
    with pytest.raises(ss.StateStoreError, match="cannot reach the state store") as info:
        ss.open_store(url)
    assert url in str(info.value) and "start that Redis" in str(info.value)


def test_a_file_that_is_not_sqlite_is_named_with_the_fix(tmp_path: Path) -> None:
    path = tmp_path / "head.db"
    path.write_bytes(b"this is not a database, " * 100)
    with pytest.raises(ss.StateStoreError, match="not a usable SQLite database") as info:
        ss.open_store(f"sqlite://{path}")
    assert str(path) in str(info.value) and "move the file away" in str(info.value)


def test_a_store_of_another_schema_is_refused(tmp_path: Path) -> None:
    url = f"sqlite://{tmp_path / 'head.db'}"
    ss.open_store(url).close()
    import sqlite3
    db = sqlite3.connect(tmp_path / "head.db")
    db.execute("UPDATE meta SET value='99' WHERE key='schema'")
    db.commit()
    db.close()
    with pytest.raises(ss.StateStoreError, match="schema 99"):
        ss.open_store(url)


@pytest.mark.parametrize("url", ["postgres://db/x", "sqlite://", "nothing"])
def test_a_store_of_an_unknown_kind_is_named(url: str) -> None:
    with pytest.raises(ss.StateStoreError, match=r"state store '.*'"):
        ss.open_store(url)


def test_the_sqlite_file_is_this_users_only(tmp_path: Path) -> None:
    path = tmp_path / "state" / "head.db"
    ss.open_store(f"sqlite://{path}").close()
    assert path.stat().st_mode & 0o077 == 0
    assert path.parent.stat().st_mode & 0o077 == 0


def wait_for(check: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


def test_the_heads_records_are_written_in_order_and_read_by_the_next_head(url: str) -> None:
    said: list[str] = []
    head = ss.HeadState(url, "head A", "tok", said.append, said.append)
    head.start()
    assert head.records() == {"actors": {}, "groups": {}, "nodes": {}, "jobs": {}}
    head.write("actors", "a1", b"one")
    head.write("actors", "a2", b"two")
    head.write("groups", "g1", b"group")
    head.write("actors", "a1", b"one again")
    head.write("actors", "a2", None)
    store = ss.open_store(url)
    wait_for(lambda: store.items("actors") == {"a1": b"one again"}
             and store.items("groups") == {"g1": b"group"}, 10, "the records written")
    head.write("groups", "g1", None)
    head.stop()   # what is left is written before the lease is given back
    assert store.items("groups") == {}
    store.close()
    again = ss.HeadState(url, "head B", "tok", said.append, said.append)
    again.start()
    assert again.records() == {"actors": {"a1": b"one again"}, "groups": {}, "nodes": {},
                               "jobs": {}}
    again.stop()
    assert said == []


def test_changes_made_while_redis_is_away_are_written_when_it_is_back(
        redis_server: RedisServer) -> None:
    said: list[str] = []
    lost: list[str] = []
    head = ss.HeadState(redis_server.url, "head A", "tok", lost.append, said.append)
    head.start()
    head.write("actors", "kept", b"before")
    store = ss.open_store(redis_server.url)
    wait_for(lambda: store.items("actors") == {"kept": b"before"}, 10, "the first record")
    store.close()
    redis_server.stop()
    head.write("actors", "made-meanwhile", b"x")
    head.write("actors", "kept", None)
    wait_for(lambda: said, 10, "the store's absence said")
    assert "does not answer" in said[0] and "writes its changes once it is back" in said[0]
    health = head.health()   # what orchestra status says of it
    assert health["away_since"] > 0 and health["waiting"] == 2
    assert health["kept"] == {"actors": 1, "groups": 0, "nodes": 0, "jobs": 0}
    redis_server.start()
    store = ss.open_store(redis_server.url)
    wait_for(lambda: store.items("actors") == {"made-meanwhile": b"x"}, 10,
             "the changes made while Redis was away")
    store.close()
    wait_for(lambda: head.health()["away_since"] == 0, 10, "the store said back")
    assert head.health()["waiting"] == 0
    assert lost == []
    head.stop()


def test_a_redis_restarted_empty_gets_the_lease_and_every_record_back(
        redis_server: RedisServer) -> None:
    said: list[str] = []
    lost: list[str] = []
    head = ss.HeadState(redis_server.url, "head A", "tok", lost.append, said.append)
    head.start()
    cluster_id = head.cluster_id
    head.write("groups", "g", b"spec")
    store = ss.open_store(redis_server.url)
    wait_for(lambda: store.items("groups") == {"g": b"spec"}, 10, "the record written")
    store.close()
    redis_server.stop()
    for f in redis_server.dir.rglob("appendonly*"):   # its data gone with it
        if f.is_file():
            f.unlink()
    redis_server.start()
    store = ss.open_store(redis_server.url)

    def back() -> bool:
        return (store.items("groups") == {"g": b"spec"}
                and store.get(ss.CLUSTER, "id") == cluster_id.encode())
    wait_for(back, ss.LEASE_TTL_S, "the lease and records written again")
    assert any("taken back" in text for text in said), said
    with pytest.raises(ss.HeadLeaseHeld, match="head A"):
        store.take_lease("head B")
    assert store.get(ss.CLUSTER, "token") == b"tok"
    store.close()
    assert lost == []
    head.stop()


def test_a_waiter_is_called_once_the_changes_before_it_are_written(url: str) -> None:
    import threading
    said: list[str] = []
    head = ss.HeadState(url, "head A", "tok", said.append, said.append)
    called: list[tuple[str, dict[str, bytes]]] = []
    store = ss.open_store(url)
    head.notify = lambda fn: fn()   # from the store's thread, as call_soon_threadsafe would
    head.start()
    head.after_written(lambda: called.append(("nothing waits", store.items("actors"))))
    assert called == [("nothing waits", {})]   # at once
    done = threading.Event()
    head.write("actors", "a", b"1")
    head.after_written(lambda: (called.append(("after a", store.items("actors"))), done.set()))
    assert done.wait(10)
    assert called[1] == ("after a", {"a": b"1"})   # it was in the store when called
    head.stop()
    store.close()
    assert said == []


def test_waiters_go_on_when_redis_does_not_answer(redis_server: RedisServer) -> None:
    import threading
    said: list[str] = []
    head = ss.HeadState(redis_server.url, "head A", "tok", said.append, said.append)
    head.start()
    redis_server.stop()
    released = threading.Event()
    head.write("actors", "a", b"1")
    head.after_written(released.set)
    assert released.wait(10)   # not held for as long as the store is away
    assert head.health()["waiting"] == 1
    redis_server.start()
    wait_for(lambda: head.health()["waiting"] == 0, 10, "the change written once it is back")
    head.stop()


def test_another_user_cannot_open_the_sqlite_store_even_in_a_directory_it_can_list(
        request: pytest.FixtureRequest) -> None:
    """The store holds the cluster's token: its file is this user's alone (0600), also
    where its directory lets others in (made by someone else, 0755). Run as a second
    local user (skips where tests do not run as root)."""
    user = request.getfixturevalue("other_user")
    import os
    import shutil
    import tempfile
    shared = tempfile.mkdtemp(prefix="orchestra-store-test-")
    try:
        os.chmod(shared, 0o755)
        path = os.path.join(shared, "head.db")
        store = ss.open_store(f"sqlite://{path}")
        store.put(ss.CLUSTER, "token", b"the-secret-token")
        store.close()
        seen = user.run(
            "import json, os, sqlite3, sys\n"
            "out = {'listed': sorted(os.listdir(sys.argv[1]))}\n"
            "try:\n"
            "    open(os.path.join(sys.argv[1], 'head.db'), 'rb').read()\n"
            "    out['read'] = 'read'\n"
            "except OSError as exc:\n"
            "    out['read'] = type(exc).__name__\n"
            "try:\n"
            "    db = sqlite3.connect(os.path.join(sys.argv[1], 'head.db'))\n"
            "    out['sql'] = repr(db.execute('SELECT value FROM state').fetchall())\n"
            "except sqlite3.Error as exc:\n"
            "    out['sql'] = type(exc).__name__\n"
            "print(json.dumps(out))", shared)
        assert "head.db" in seen["listed"]   # the directory let it look
        assert seen["read"] == "PermissionError"
        assert seen["sql"] == "OperationalError"   # unable to open database file
    finally:
        shutil.rmtree(shared, ignore_errors=True)
