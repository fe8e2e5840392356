"""What the driver uses, imported ahead in the worker processes (the fork server imports
it once the cluster is idle; workers forked before that import it themselves, when idle:
import_later, called by the worker's run loop)."""
from __future__ import annotations

import importlib
import sys

# What the driver uses, noted by the fork server's "later" request: a worker forked from
# it imports what it has not yet in its first idle moment a while after it started.
LATER: list[str] = []


def import_later() -> None:
    """In a worker forked from the fork server, idle: import what it noted for later
    (a worker started with the cluster would otherwise import numpy, ~40 ms, in its
    first task given an array). Once per process."""
    modules, LATER[:] = list(LATER), []
    preload([m for m in modules if m not in sys.modules])


def preload(modules: list[str]) -> None:
    """Import what the driver uses (the head asks once the cluster is idle): workers
    forked afterwards have it already, shared copy-on-write."""
    for name in modules:
        try:
            importlib.import_module(name)
        except Exception:  # noqa: BLE001 - a worker imports it itself when it needs it
            pass
