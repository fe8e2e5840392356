"""Standalone coordinator: ``python -m orchestra.coordinator --num-nodes N --port P``.

Starts one ``orchestra._coordinator.Coordinator`` (XLA's ``DistributedRuntimeService``),
with a token when ``$ORCHESTRA_COORDINATOR_TOKEN`` or ``--token`` gives one (then it serves
only clients that send it; ``--token`` wins, but argv is visible to every local user).
With a token it speaks TLS beyond loopback (``--tls`` on loopback too), with a key made
from the token, which its clients pin (``CoordinatorClient(..., token=..., tls=True)``);
``--insecure-no-tls`` opts out, warned. Without a token (XLA's own client, which sends
none and speaks no TLS) it is plain gRPC, warned beyond loopback. It
prints its bound ``host:port`` as the only line on stdout (so a launcher can read it, e.g.
with ``--port 0``), logs to stderr, and serves until SIGINT or SIGTERM. This process owns the
server and stops it on the way out; signal handlers are installed in ``main()`` only and
restored before it returns.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import threading
from collections.abc import Sequence
from types import FrameType

from orchestra._gang.coordinator import (
    DEFAULT_ENUMERATE_TIMEOUT_S,
    DEFAULT_HEARTBEAT_INTERVAL_S,
    DEFAULT_MAX_MISSING_HEARTBEATS,
    DEFAULT_SHUTDOWN_TIMEOUT_S,
    Coordinator,
    is_loopback_host,
)
from orchestra._gang.coordinator_auth import TOKEN_ENV, validate_token

__all__ = ["main"]


def _parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m orchestra.coordinator",
        description="Serve XLA's DistributedRuntimeService for a gang of nodes.",
    )
    parser.add_argument(
        "--num-nodes", type=int, required=True, help="nodes in the group"
    )
    parser.add_argument(
        "--port", type=int, required=True, help="TCP port; 0 picks a free one"
    )
    parser.add_argument(
        "--host",
        default="127.0.0.1",
        help="address to bind (default loopback); without a token anyone who reaches it "
        "can join the group",
    )
    parser.add_argument(
        "--token",
        default=None,
        help=f"the group's secret: serve only clients that send it (gRPC metadata "
        f"'authorization: Bearer TOKEN'; XLA's own client sends none). Prefer ${TOKEN_ENV}: "
        "a command line is visible to every local user (ps, /proc); --token wins over it",
    )
    tls = parser.add_mutually_exclusive_group()
    tls.add_argument(
        "--tls", dest="tls", action="store_true", default=None,
        help="speak TLS with a key made from the token, also on loopback (default: with a "
        "token, beyond loopback); clients: CoordinatorClient(address, node_id, token=..., "
        "tls=True)",
    )
    tls.add_argument(
        "--insecure-no-tls", dest="tls", action="store_false", default=None,
        help="plain gRPC beyond loopback even with a token (for a network you trust): "
        "whoever watches it reads the token and the keys",
    )
    parser.add_argument(
        "--heartbeat-interval",
        type=float,
        default=DEFAULT_HEARTBEAT_INTERVAL_S,
        metavar="S",
    )
    parser.add_argument(
        "--max-missing-heartbeats",
        type=int,
        default=DEFAULT_MAX_MISSING_HEARTBEATS,
        metavar="K",
    )
    parser.add_argument(
        "--enumerate-timeout",
        type=float,
        default=DEFAULT_ENUMERATE_TIMEOUT_S,
        metavar="S",
    )
    parser.add_argument(
        "--shutdown-timeout",
        type=float,
        default=DEFAULT_SHUTDOWN_TIMEOUT_S,
        metavar="S",
    )
    args = parser.parse_args(argv)
    args.token_from = "--token"
    if args.token is None and TOKEN_ENV in os.environ:
        args.token, args.token_from = os.environ[TOKEN_ENV], f"${TOKEN_ENV}"
    if args.token is not None:
        try:
            validate_token(args.token)
        except ValueError as err:
            parser.error(f"{args.token_from}: {err}")
    if args.tls and args.token is None:
        parser.error(f"--tls needs a token (${TOKEN_ENV} or --token): the coordinator's key "
                     "is made from it, and its clients pin that key")
    if args.tls is None:   # a token's clients are orchestra's, which speak TLS
        args.tls = args.token is not None and not is_loopback_host(args.host)
    if args.num_nodes < 1:
        parser.error(f"--num-nodes must be at least 1, got {args.num_nodes}")
    if args.heartbeat_interval <= 0 or args.max_missing_heartbeats < 1:
        parser.error(
            "--heartbeat-interval must be > 0 and --max-missing-heartbeats >= 1"
        )
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = _parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    if args.token is not None and args.token_from == "--token":
        print(
            f"WARNING: --token puts the secret in this process's command line, which every "
            f"local user can read (ps, /proc); pass it in ${TOKEN_ENV} instead.",
            file=sys.stderr,
            flush=True,
        )
    if not is_loopback_host(args.host) and not args.tls:
        if args.token is None:
            warning = (
                "and has no authentication: anyone who can reach the port can join the group and "
                f"read or write its key-value store. Give a token (${TOKEN_ENV}), bind to "
                "127.0.0.1, or restrict the port with a firewall."
            )
        else:
            warning = (
                "and its traffic, token included, is not encrypted (--insecure-no-tls): "
                "anyone who can watch the network can learn the token. Keep the port on a "
                "private network."
            )
        print(
            f"WARNING: the coordinator listens on {args.host}, beyond loopback, {warning}",
            file=sys.stderr,
            flush=True,
        )
    coordinator = Coordinator(
        args.num_nodes,
        host=args.host,
        port=args.port,
        heartbeat_interval_s=args.heartbeat_interval,
        max_missing_heartbeats=args.max_missing_heartbeats,
        enumerate_timeout_s=args.enumerate_timeout,
        shutdown_timeout_s=args.shutdown_timeout,
        token=args.token,
        tls=args.tls,
    )
    stop = threading.Event()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        stop.set()

    previous = {
        sig: signal.signal(sig, on_signal) for sig in (signal.SIGINT, signal.SIGTERM)
    }
    try:
        address = coordinator.start()
        print(address, flush=True)
        if args.tls:
            from orchestra._protocol import tls as _tls
            security = (f"speaking TLS with the key of the token "
                        f"({_tls.cluster_fingerprint(args.token)}; clients: "
                        "CoordinatorClient(..., token=..., tls=True))")
        else:
            security = "plain gRPC"
        print(
            f"orchestra coordinator for {args.num_nodes} nodes listening on {address}, "
            f"{'serving only clients with the token' if args.token else 'without a token'}, "
            f"{security}; SIGINT or SIGTERM stops it",
            file=sys.stderr,
            flush=True,
        )
        # A short wait in a loop keeps the main thread returning to the interpreter, where
        # signal handlers run.
        while not stop.wait(0.5):
            pass
    finally:
        coordinator.stop()
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
