"""The head process: ``python -m orchestra._head CONFIG`` (or the bootstrap that started
its fork server first, _platform/bootstrap.py). It makes the Head (head.py) on a uvloop,
and stops it when asked (SIGTERM, SIGHUP), when its driver is gone (the parent's death;
its connection closing is the usual sign: Head.conn_lost), when the script that made a
cluster_utils.Cluster exits, or when its state store's lease is lost."""
from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import sys

from .._node.worker_pool import ZygoteStart
from .._platform.procutil import watch_parent, watch_pid
from . import rejoin
from .head import Head
from .state_store import HeadState


def main(argv: list[str] | None = None, zygote: ZygoteStart | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    with open(argv[0]) as f:
        cfg = json.load(f)
    cfg["_cfg_path"] = argv[0]   # a node process reads the same file
    from .._platform.proctitle import set_title
    set_title("orchestra::head")
    # Everything the head creates (sockets, segments) is for this user only; set before
    # any socket exists, so none is ever reachable by others, not even for a moment.
    os.umask(0o077)
    signal.signal(signal.SIGINT, signal.SIG_IGN)   # Ctrl-C belongs to the driver
    import uvloop
    loop = uvloop.new_event_loop()
    asyncio.set_event_loop(loop)
    head = Head(cfg, loop, zygote)
    for sig in (signal.SIGTERM, signal.SIGHUP):
        loop.add_signal_handler(sig, head.shutdown, f"signal {sig.name}")
    # The driver's connection closing is the usual sign it is gone; this covers a driver
    # that dies before it connects.
    if not cfg.get("detached"):
        watch_parent(loop, lambda: head.shutdown("the driver process exited", driver_gone=True))
    if cfg.get("owner_pid"):   # a cluster_utils.Cluster's: it lives as long as its script
        owner = int(cfg["owner_pid"])

        def owner_gone() -> None:
            head.shutdown(f"the process that started the cluster (pid {owner}) exited")
            # The Cluster's own directory (the processes' logs and records): nothing
            # else removes it once its script is gone.
            if cfg.get("owner_dir"):
                shutil.rmtree(str(cfg["owner_dir"]), ignore_errors=True)
        watch_pid(loop, owner, owner_gone)

    def lease_lost(reason: str) -> None:   # from the lease's thread
        loop.call_soon_threadsafe(head.shutdown, reason)
    durable = head.durable = HeadState.from_cfg(cfg, lease_lost, loop.call_soon_threadsafe)
    try:
        if durable is not None:   # before anything listens: a second head stops here
            durable.start()
        loop.run_until_complete(head.start())
    except Exception as exc:
        print(f"orchestra head: failed to start: {exc}", file=sys.stderr, flush=True)
        # Under a supervisor, which starts it again, the session directory stays.
        head.shutdown("start failed", keep_dir=bool(cfg.get("supervised")))
        if durable is not None:
            durable.stop()
        raise SystemExit(1) from exc
    try:
        loop.run_forever()
    finally:
        if not head.stopping:
            head.shutdown("loop ended")
        loop.close()
        rejoin.stop_store(head)

