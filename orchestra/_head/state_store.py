"""The head's durable state: what a restarted head cannot learn again from its nodes and
drivers, in a store that outlives the head process.

    open_store(url) -> SqliteStore (sqlite:///PATH: one file, WAL, no server; the default
        is <state dir>/head-<port>.db) | RedisStore (redis://HOST:PORT[/DB])
    take_lease(holder) --> the one head serving this store (else HeadLeaseHeld naming the
        live holder); renew_lease(holder) every LEASE_TTL_S / 4 keeps it; a holder that
        dies lets it expire after LEASE_TTL_S, and the same holder (a restart of the head
        under its supervisor) takes it back at once
    get / put / delete / items(table) / apply(changes) --> small records (bytes) by
        table and key: "cluster" (its id and token), "actors" (detached ones and
        drivers' own) and "groups" (detached ones, _scheduler/durable.py)

Written when a durable thing changes, never per task: the hot path never touches it.
Errors name the store and the fix: unreachable (Redis down, a path that cannot be
written), corrupt (a file that is not SQLite), held by another head. Every call is
bounded (SQLite's busy timeout, Redis's socket timeouts).

Who owns what: the head process opens its store, holds the lease and is the only writer
while it holds it. The launcher (``orchestra start --head``) reads the cluster's token
before the head exists, so a head started again on the same store serves the same
cluster. A store is used from one thread at a time: in the head, HeadState's thread
(the lease and every write) once the head started.
"""
from __future__ import annotations

import os
import sqlite3
import sys
import threading
import time
from collections.abc import Callable
from typing import Any, Protocol
from urllib.parse import urlsplit

from .._scheduler.durable import TABLES as KEPT  # what a restarted head makes again
from ..exceptions import OrchestraError

# How long a lease outlives its holder's last renewal: a head that died (SIGKILL, its
# machine gone) is replaced by another after at most this long; its own restart takes
# the lease back at once (the same holder).
LEASE_TTL_S = 10.0
# Bounds every call: SQLite waits this long for another writer's lock, Redis for a
# connection or an answer.
TIMEOUT_S = 5.0
SCHEMA_VERSION = 1

# The tables (keys are text, values bytes).
CLUSTER = "cluster"   # "id", "token", "boots", "next_node"
# While the store does not answer, changes are tried again this often.
_RETRY_S = 1.0


class StateStoreError(OrchestraError):
    """The head's state store cannot be used: the message names it and the fix."""


class HeadLeaseHeld(StateStoreError):
    """Another head serves the cluster of this state store."""


class StateStore(Protocol):
    url: str
    errors: tuple[type[BaseException], ...]   # what a call raises when the store fails

    def get(self, table: str, key: str) -> bytes | None: ...

    def put(self, table: str, key: str, value: bytes) -> None: ...

    def delete(self, table: str, key: str) -> None: ...

    def items(self, table: str) -> dict[str, bytes]: ...

    def apply(self, changes: list[tuple[str, str, bytes | None]]) -> None: ...

    def take_lease(self, holder: str, ttl_s: float = LEASE_TTL_S) -> None: ...

    def renew_lease(self, holder: str, ttl_s: float = LEASE_TTL_S) -> bool: ...

    def release_lease(self, holder: str) -> None: ...

    def close(self) -> None: ...


def default_url(state_dir: str, port: int) -> str:
    """The store of the head on ``port`` started from ``state_dir``: one SQLite file."""
    return "sqlite://" + os.path.join(os.path.abspath(state_dir), f"head-{port}.db")


def open_store(url: str) -> StateStore:
    """The store at ``url`` (sqlite:///PATH or redis://HOST:PORT[/DB]), checked: it
    answers, and holds orchestra's state or nothing. StateStoreError otherwise."""
    scheme = urlsplit(url).scheme
    if scheme == "sqlite":
        return SqliteStore(url)
    if scheme in ("redis", "rediss"):
        return RedisStore(url)
    raise StateStoreError(
        f"state store {url!r}: unknown kind {scheme or '(none)'!r}; give "
        "--state-store redis://HOST:PORT[/DB], or sqlite:///PATH (the default keeps it in "
        "SQLite in the state directory)")


def _lease_error(url: str, holder: str, left: float) -> HeadLeaseHeld:
    return HeadLeaseHeld(
        f"another head ({holder}) serves the cluster of state store {url} (its lease "
        f"runs {left:.0f} s more): two heads never serve one cluster. Stop that head "
        "(orchestra stop on its machine), or give this one another --state-store; a head "
        f"that died frees it within {LEASE_TTL_S:.0f} s")


class SqliteStore:
    """The default store: a file in the state directory (WAL: readers never wait for the
    writer; synchronous=NORMAL: a committed change survives the head's crash, as WAL
    keeps it; a power loss may take the last ones)."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.errors: tuple[type[BaseException], ...] = (sqlite3.Error, OSError)
        path = urlsplit(url).path
        if not path:
            raise StateStoreError(f"state store {url!r} names no file: give sqlite:///PATH")
        self.path = path
        try:
            os.makedirs(os.path.dirname(path) or ".", mode=0o700, exist_ok=True)
            # The cluster's token is in it: for this user only (the head's umask is
            # 077 too; this covers the launcher, which reads it first).
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
            os.close(fd)
            self.db = sqlite3.connect(path, timeout=TIMEOUT_S, isolation_level=None,
                                      check_same_thread=False)
            self.db.execute("PRAGMA journal_mode=WAL")
            self.db.execute("PRAGMA synchronous=NORMAL")
            self.db.executescript(
                "CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT);"
                "CREATE TABLE IF NOT EXISTS state (tbl TEXT, key TEXT, value BLOB,"
                " PRIMARY KEY (tbl, key));"
                "CREATE TABLE IF NOT EXISTS lease (id INTEGER PRIMARY KEY CHECK (id = 1),"
                " holder TEXT, expires REAL);")
            row = self.db.execute("SELECT value FROM meta WHERE key='schema'").fetchone()
            if row is None:
                self.db.execute("INSERT OR IGNORE INTO meta VALUES ('schema', ?)",
                                (str(SCHEMA_VERSION),))
            elif row[0] != str(SCHEMA_VERSION):
                raise StateStoreError(
                    f"state store {url} has schema {row[0]}, this orchestra reads "
                    f"{SCHEMA_VERSION}: start the head with the orchestra that made it, or "
                    "move the file away (the cluster's durable state goes with it)")
        except sqlite3.DatabaseError as exc:
            raise StateStoreError(
                f"state store {url} is not a usable SQLite database ({exc}): move the file "
                "away and start the head again (a new cluster: the old one's durable state "
                "is lost), or give --state-store another place") from exc
        except OSError as exc:
            raise StateStoreError(
                f"state store {url} cannot be opened ({exc}): give --state-store a path "
                "this user can write, or set ORCHESTRA_STATE_DIR") from exc

    def get(self, table: str, key: str) -> bytes | None:
        row = self.db.execute("SELECT value FROM state WHERE tbl=? AND key=?",
                              (table, key)).fetchone()
        return None if row is None else bytes(row[0])

    def put(self, table: str, key: str, value: bytes) -> None:
        self.db.execute("INSERT OR REPLACE INTO state VALUES (?, ?, ?)", (table, key, value))

    def delete(self, table: str, key: str) -> None:
        self.db.execute("DELETE FROM state WHERE tbl=? AND key=?", (table, key))

    def items(self, table: str) -> dict[str, bytes]:
        return {k: bytes(v) for k, v in
                self.db.execute("SELECT key, value FROM state WHERE tbl=?", (table,))}

    def apply(self, changes: list[tuple[str, str, bytes | None]]) -> None:
        """Puts (value) and deletes (None), in one transaction."""
        self.db.execute("BEGIN IMMEDIATE")
        try:
            for table, key, value in changes:
                if value is None:
                    self.delete(table, key)
                else:
                    self.put(table, key, value)
        except BaseException:
            self.db.execute("ROLLBACK")
            raise
        self.db.execute("COMMIT")

    def take_lease(self, holder: str, ttl_s: float = LEASE_TTL_S) -> None:
        # BEGIN IMMEDIATE: the read and the write are one step against another head's.
        self.db.execute("BEGIN IMMEDIATE")
        try:
            row = self.db.execute("SELECT holder, expires FROM lease WHERE id=1").fetchone()
            now = time.time()
            if row is not None and row[0] != holder and row[1] > now:
                raise _lease_error(self.url, row[0], row[1] - now)
            self.db.execute("INSERT OR REPLACE INTO lease VALUES (1, ?, ?)", (holder, now + ttl_s))
        except BaseException:
            self.db.execute("ROLLBACK")
            raise
        self.db.execute("COMMIT")

    def renew_lease(self, holder: str, ttl_s: float = LEASE_TTL_S) -> bool:
        cur = self.db.execute("UPDATE lease SET expires=? WHERE id=1 AND holder=?",
                              (time.time() + ttl_s, holder))
        return cur.rowcount == 1

    def release_lease(self, holder: str) -> None:
        self.db.execute("DELETE FROM lease WHERE id=1 AND holder=?", (holder,))

    def close(self) -> None:
        self.db.close()


# Renew only while the lease is this holder's (one step on the server).
_RENEW = "if redis.call('get', KEYS[1]) == ARGV[1] then " \
         "return redis.call('pexpire', KEYS[1], ARGV[2]) else return 0 end"
_RELEASE = "if redis.call('get', KEYS[1]) == ARGV[1] then " \
           "return redis.call('del', KEYS[1]) else return 0 end"


class RedisStore:
    """A store in Redis (``pip install 'orchestra[redis]'``): a head started on another
    machine, with another state directory, takes the cluster over. Tables are hashes
    ``orchestra:state:<table>``; the lease a key with a TTL kept by the server (no
    clock of ours is compared)."""

    PREFIX = "orchestra:"

    def __init__(self, url: str) -> None:
        self.url = url
        try:
            import redis
        except ImportError as exc:
            raise StateStoreError(
                f"state store {url} is a Redis, and the redis package is not installed: "
                "pip install 'orchestra[redis]' (or redis>=5)") from exc
        self.errors: tuple[type[BaseException], ...] = (redis.RedisError, OSError)
        try:
            # Any: redis-py's hints say bytes | str for what this client (bytes) returns.
            client: Any = redis.Redis
            self.db = client.from_url(url, socket_timeout=TIMEOUT_S,
                                           socket_connect_timeout=TIMEOUT_S)
            self.db.ping()
            schema = self.db.get(self.PREFIX + "schema")
            if schema is None:
                self.db.set(self.PREFIX + "schema", str(SCHEMA_VERSION), nx=True)
            elif schema.decode() != str(SCHEMA_VERSION):
                raise StateStoreError(
                    f"state store {url} has schema {schema.decode()}, this orchestra reads "
                    f"{SCHEMA_VERSION}: start the head with the orchestra that made it, or "
                    "give another --state-store (or another Redis database: /DB)")
        except self.errors as exc:
            raise StateStoreError(
                f"cannot reach the state store {url} ({exc}): start that Redis, or give "
                "--state-store another one (without it, the head keeps its state in SQLite "
                "in the state directory)") from exc

    def _table(self, table: str) -> str:
        return f"{self.PREFIX}state:{table}"

    def get(self, table: str, key: str) -> bytes | None:
        value = self.db.hget(self._table(table), key)
        return None if value is None else bytes(value)

    def put(self, table: str, key: str, value: bytes) -> None:
        self.db.hset(self._table(table), key, value)

    def delete(self, table: str, key: str) -> None:
        self.db.hdel(self._table(table), key)

    def items(self, table: str) -> dict[str, bytes]:
        return {k.decode(): bytes(v) for k, v in self.db.hgetall(self._table(table)).items()}

    def apply(self, changes: list[tuple[str, str, bytes | None]]) -> None:
        """Puts (value) and deletes (None), in one MULTI/EXEC."""
        pipe = self.db.pipeline(transaction=True)
        for table, key, value in changes:
            if value is None:
                pipe.hdel(self._table(table), key)
            else:
                pipe.hset(self._table(table), key, value)
        pipe.execute()

    def take_lease(self, holder: str, ttl_s: float = LEASE_TTL_S) -> None:
        key = self.PREFIX + "lease"
        ms = int(ttl_s * 1000)
        if self.db.set(key, holder, nx=True, px=ms):
            return
        if self.db.eval(_RENEW, 1, key, holder, ms):   # ours already (a restart)
            return
        current = self.db.get(key)
        left = self.db.pttl(key)
        raise _lease_error(self.url, current.decode() if current else "?", max(left, 0) / 1000)

    def renew_lease(self, holder: str, ttl_s: float = LEASE_TTL_S) -> bool:
        return bool(self.db.eval(_RENEW, 1, self.PREFIX + "lease", holder, int(ttl_s * 1000)))

    def release_lease(self, holder: str) -> None:
        self.db.eval(_RELEASE, 1, self.PREFIX + "lease", holder)

    def close(self) -> None:
        self.db.close()


class HeadState:
    """The head process's side of its store: open it, take the lease, write the
    cluster's identity and read the records a restart makes again (start); on a thread
    of its own, keep the lease and write the changes the scheduler decides (write);
    give it back (stop). ``on_lost(reason)`` is called from that thread when another
    head holds the lease: the head must stop serving.

    The thread is the store's one user after start. The loop thread only calls
    write(), which changes ``_mirror`` (every record this head keeps, as it should be
    in the store) and ``_dirty`` (the keys not written since) under ``_lock`` and
    wakes the thread. While the store does not answer the head serves on and says so
    (``log``); the changes wait in ``_dirty`` and are written once it is back. A store
    that lost the lease with nobody else holding it (a Redis restarted empty, a lease
    that ran out while the store was away) is taken back and written whole again from
    the mirror."""

    def __init__(self, url: str, holder: str, token: str, on_lost: Callable[[str], None],
                 log: Callable[[str], None],
                 notify: Callable[[Callable[[], None]], object] = lambda fn: fn(),
                 lease_ttl_s: float = LEASE_TTL_S) -> None:
        self.url, self.holder, self.token = url, holder, token
        self.lease_ttl_s = lease_ttl_s   # the lease's life; renewed every quarter of it
        self.on_lost, self.log = on_lost, log
        # How the thread has the loop call a waiter of after_written (the head's:
        # call_soon_threadsafe).
        self.notify = notify
        self.store: StateStore | None = None
        self.cluster_id = ""
        self.boots = 0       # heads started on the store, this one included (start)
        self.next_node = 0   # the next joined node's id, as the heads before left it
        self.writes = 0          # records written (the thread's), for figures
        # Since when the store does not answer (time.time(); 0: it answers). Written by
        # the thread, read by the loop (health).
        self.away_since = 0.0
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._lock = threading.Lock()
        self._mirror: dict[str, dict[str, bytes]] = {}
        self._dirty: set[tuple[str, str]] = set()
        # Changes made (write, loop thread) and written (the thread), counted; what
        # waits for a count to be written (after_written). All under _lock.
        self._made = 0
        self._written = 0
        self._waiters: list[tuple[int, Callable[[], None]]] = []
        self._thread: threading.Thread | None = None

    @classmethod
    def from_cfg(cls, cfg: dict[str, Any], on_lost: Callable[[str], None],
                 notify: Callable[[Callable[[], None]], object]) -> HeadState | None:
        """The head's, from its cfg (state_store, state_holder, token); None without one.
        ``notify``: how its thread has the head's loop call a waiter of after_written."""
        if not cfg.get("state_store"):
            return None

        def log(text: str) -> None:
            print(f"orchestra head: {text}", file=sys.stderr, flush=True)
        return cls(cfg["state_store"], cfg.get("state_holder") or f"head pid {os.getpid()}",
                   cfg.get("token", ""), on_lost, log, notify)

    def start(self) -> None:
        """StateStoreError (HeadLeaseHeld) when the head must not start."""
        store = self.store = open_store(self.url)
        try:
            store.take_lease(self.holder, self.lease_ttl_s)
            known = store.get(CLUSTER, "id")
            if known is None:
                known = os.urandom(8).hex().encode()
                store.put(CLUSTER, "id", known)
            self.cluster_id = known.decode()
            if store.get(CLUSTER, "token") != self.token.encode():
                store.put(CLUSTER, "token", self.token.encode())
            # Heads started on this store so far, this one included: each starts its
            # workers' ids above those of the heads before it (Head.start).
            self.boots = int(store.get(CLUSTER, "boots") or 0) + 1
            store.put(CLUSTER, "boots", str(self.boots).encode())
            self.next_node = int(store.get(CLUSTER, "next_node") or 0)
            self._mirror = {CLUSTER: {"id": known, "token": self.token.encode(),
                                      "boots": str(self.boots).encode(),
                                      "next_node": str(self.next_node).encode()}}
            for table in KEPT:
                self._mirror[table] = store.items(table)
        except store.errors as exc:
            raise StateStoreError(f"state store {self.url} failed while the head started "
                                  f"({exc}); start the head again") from exc
        self._thread = threading.Thread(target=self._keep, name="orchestra-state", daemon=True)
        self._thread.start()

    def records(self) -> dict[str, dict[str, bytes]]:
        """What the store held at start for a restart to make again (table -> key ->
        value): detached actors and placement groups (_scheduler/durable.py)."""
        with self._lock:
            return {t: dict(self._mirror.get(t, {})) for t in KEPT}

    def write(self, table: str, key: str, value: bytes | None) -> None:
        """Keep ``value`` as record ``key`` of ``table`` (None: delete it); written by
        the store's thread soon after, in order with the other changes of that key."""
        with self._lock:
            kept = self._mirror.setdefault(table, {})
            if value is None:
                kept.pop(key, None)
            else:
                kept[key] = value
            self._dirty.add((table, key))
            self._made += 1
        self._wake.set()

    def after_written(self, fn: Callable[[], None]) -> None:
        """Call ``fn`` once every change made so far is in the store (through notify,
        on the loop), or now when none waits or the store does not answer: then the
        changes wait, and are written once it is back."""
        with self._lock:
            if self._written < self._made and not self.away_since:
                self._waiters.append((self._made, fn))
                return
        fn()

    def _release(self, everyone: bool) -> None:
        """Call the waiters whose changes are written (``everyone``: all of them, the
        store does not answer)."""
        done: list[Callable[[], None]] = []
        with self._lock:
            waiting, self._waiters = self._waiters, []
            for n, fn in waiting:
                if everyone or n <= self._written:
                    done.append(fn)
                else:
                    self._waiters.append((n, fn))
        for fn in done:
            self.notify(fn)

    def health(self) -> dict[str, Any]:
        """What ``orchestra status`` and the dashboard's summary say of the store: its
        URL, the records kept by table, the changes not written yet, since when it does
        not answer (0: it does)."""
        with self._lock:
            kept = {t: len(self._mirror.get(t, {})) for t in KEPT}
            waiting = len(self._dirty)
        return {"url": self.url, "kept": kept, "waiting": waiting,
                "away_since": self.away_since, "writes": self.writes}

    def _flush(self, whole: bool = False) -> None:
        """Write the changed records (``whole``: every record, and delete what the
        store holds beyond them). The store's errors pass up; what was not written
        stays dirty."""
        store = self.store
        assert store is not None
        with self._lock:
            if whole:
                self._dirty.update((t, k) for t, kept in self._mirror.items() for k in kept)
            keys, self._dirty = self._dirty, set()
            made = self._made
            changes = [(t, k, self._mirror.get(t, {}).get(k)) for t, k in sorted(keys)]
        try:
            if whole:
                for table in KEPT:
                    stale = set(store.items(table)) - set(self._mirror.get(table, {}))
                    changes += [(table, k, None) for k in stale]
            store.apply(changes)
        except BaseException:
            with self._lock:
                self._dirty.update(keys)
            raise
        self.writes += len(changes)
        with self._lock:
            self._written = max(self._written, made)
        self._release(everyone=False)

    def _keep(self) -> None:
        store = self.store
        assert store is not None
        renew_at = time.monotonic() + self.lease_ttl_s / 4
        while True:
            wait = renew_at - time.monotonic()
            if self.away_since:
                wait = min(wait, _RETRY_S)
            self._wake.wait(max(wait, 0.0))
            self._wake.clear()
            stopping = self._stop.is_set()
            try:
                if self._dirty or stopping:
                    self._flush()
                if stopping:
                    return
                # A store back after being away: the lease checked at once, before the
                # head says so (it may have expired meanwhile; taken back if free).
                if time.monotonic() >= renew_at or self.away_since:
                    renew_at = time.monotonic() + self.lease_ttl_s / 4
                    if not store.renew_lease(self.holder, self.lease_ttl_s):
                        # Not ours any more: another head's (HeadLeaseHeld), or nobody's
                        # (the store lost it): taken back, and everything written again.
                        store.take_lease(self.holder, self.lease_ttl_s)
                        self.log(f"the state store {self.url} had lost this head's lease: "
                                 "taken back, and its records written again")
                        self._flush(whole=True)
            except HeadLeaseHeld as exc:
                self.on_lost(f"another head took the lease of state store {self.url} "
                             f"(this head could not renew it in time): {exc}")
                return
            except store.errors as exc:
                if stopping:
                    self.log(f"the state store {self.url} does not answer ({exc}); "
                             f"{len(self._dirty)} change(s) not written at stop")
                    return
                if not self.away_since:
                    self.away_since = time.time()   # before the release: after_written
                    self.log(f"the state store {self.url} does not answer ({exc}); the head "
                             "serves on, and writes its changes once it is back")
                self._release(everyone=True)   # nobody waits for a store that is away
                continue
            if self.away_since:
                self.log(f"the state store {self.url} answers again "
                         f"(after {time.time() - self.away_since:.1f} s)")
                self.away_since = 0.0

    def stop(self) -> None:
        """Write what is left (bounded), give the lease back."""
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(TIMEOUT_S * 2)
        if self.store is not None:
            try:
                self.store.release_lease(self.holder)
                self.store.close()
            except self.store.errors:
                pass   # it expires by itself
