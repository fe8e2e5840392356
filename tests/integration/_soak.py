"""The soak's workload, shared by the driver threads of tests/integration/test_soak.py and
the driver processes it starts (``python _soak.py ADDRESS TOKEN SECONDS SEED
[faults|head-kills]``, which prints its counts as one JSON line; head-kills: its actor is
detached, so that it outlives the head).

Each round is one of: a dependent chain (f -> g -> h, the last two given refs of the
first), a chain of 5-15 steps whose driver keeps only the last ref (each step's argument,
1 KiB inline or 200-600 KiB in shared memory, held by the next step alone: a node's
death makes the lost steps again from their lineage), a large array made on the joined
node and read by a task anywhere and by the driver, nested tasks (a task that gets five
subtasks), or actor calls. Every result is
checked; every get() has a timeout, so a hang shows as a count, never as a stuck test.
"""
from __future__ import annotations

import collections
import json
import os
import random
import sys
import time
import traceback
from typing import Any

import numpy as np

import orchestra
from orchestra.exceptions import GetTimeoutError

GET_TIMEOUT_S = 30.0
BIG = 25_600          # int64s: 200 KiB, stored in shared memory (not inline)
RETRIES = 3           # with faults: tasks retried when their worker dies


@orchestra.remote(max_retries=RETRIES)
def inc(x: int) -> int:
    return x + 1


@orchestra.remote(max_retries=RETRIES)
def add(a: int, b: int) -> int:
    return a + b


@orchestra.remote(max_retries=RETRIES)
def make_big(i: int) -> np.ndarray:
    return np.full(BIG, i, dtype=np.int64)


@orchestra.remote(max_retries=RETRIES)
def total(a: np.ndarray) -> int:
    return int(a.sum())


@orchestra.remote(max_retries=RETRIES)
def step(prev: dict[str, Any], seed: int, i: int, kib: int) -> dict[str, Any]:
    """The i-th step of a chain: checks the step before it, makes its own (kib KiB)."""
    if prev["seed"] != seed or prev["i"] != i - 1 or not (prev["pad"] == seed + i - 1).all():
        raise ValueError(f"step {i} of chain {seed} got {prev['seed']}/{prev['i']}")
    return {"seed": seed, "i": i, "pad": np.full(kib * 128, seed + i, dtype=np.int64)}


def run_steps(rng: random.Random, seed: int) -> bool:
    """``ref = step.remote(ref, ...)`` 5-15 times, the driver keeping only the last ref."""
    n, kib = rng.randrange(5, 16), rng.choice((1, 1, 200, 600))
    ref = step.remote({"seed": seed, "i": 0, "pad": np.full(kib * 128, seed, dtype=np.int64)},
                      seed, 1, kib)
    for i in range(2, n + 1):
        ref = step.remote(ref, seed, i, kib)
    last = orchestra.get(ref, timeout=GET_TIMEOUT_S)
    return bool(last["i"] == n and (last["pad"] == seed + n).all())


@orchestra.remote(max_retries=RETRIES)
def square(x: int) -> int:
    return x * x


@orchestra.remote(max_retries=RETRIES)
def outer(k: int) -> int:
    return sum(orchestra.get([square.remote(j) for j in range(k)], timeout=GET_TIMEOUT_S))


@orchestra.remote(max_restarts=-1, max_task_retries=-1)
class Echo:
    """Stateless, so that a restarted instance answers as the first did."""

    def echo(self, x: int) -> int:
        return x

    def twice(self, a: np.ndarray) -> int:
        return 2 * int(a[0])


def make_options(faults: bool) -> dict[str, Any]:
    """How the large arrays are made: on the joined node ("far"), through the head or
    straight to a worker lent to the driver, whichever the driver picks (both keep how
    to make them again, should that node die). ``faults``: the same."""
    return {"resources": {"far": 0.01}}


def rounds(seconds: float, seed: int, options: dict[str, Any] | None = None,
           detached: bool = False) -> dict[str, int]:
    """Run rounds for ``seconds``; counts of each kind that was right, and of every
    failure by name ("hung" for a get() past its timeout, "wrong" for a wrong value).
    ``options``: make_big's (make_options). ``detached``: the actor is detached (it
    outlives a head restart; a non-detached one is lost with its head), killed at the
    end."""
    rng = random.Random(seed)
    counts: collections.Counter[str] = collections.Counter()
    on_far = make_big.options(**options) if options else make_big
    actor = Echo.options(name=f"echo-{seed}-{os.getpid()}", lifetime="detached").remote() \
        if detached else Echo.remote()
    try:
        _rounds(seconds, seed, rng, counts, on_far, actor)
    finally:
        if detached:
            orchestra.kill(actor)
    return dict(counts)


def _rounds(seconds: float, seed: int, rng: random.Random, counts: collections.Counter[str],
            on_far: Any, actor: Any) -> None:
    deadline = time.monotonic() + seconds
    i = seed * 1_000_000
    while time.monotonic() < deadline:
        i += 1
        kind = rng.choice(("chain", "chain", "steps", "big", "nested", "actor"))
        try:
            if kind == "chain":
                a = inc.remote(i)
                b = inc.remote(a)
                ok = orchestra.get(add.remote(a, b), timeout=GET_TIMEOUT_S) == 2 * i + 3
            elif kind == "steps":
                ok = run_steps(rng, i % 1_000_000)
            elif kind == "big":
                arr = on_far.remote(i % 1000)
                s = total.remote(arr)
                ok = orchestra.get(s, timeout=GET_TIMEOUT_S) == BIG * (i % 1000) \
                    and int(orchestra.get(arr, timeout=GET_TIMEOUT_S)[-1]) == i % 1000 \
                    and orchestra.get(actor.twice.remote(arr), timeout=GET_TIMEOUT_S) == 2 * (i % 1000)
            elif kind == "nested":
                ok = orchestra.get(outer.remote(5), timeout=GET_TIMEOUT_S) == 30
            else:
                refs = [actor.echo.remote(i + j) for j in range(5)]
                ok = orchestra.get(refs, timeout=GET_TIMEOUT_S) == [i + j for j in range(5)]
            counts[kind if ok else "wrong"] += 1
        except GetTimeoutError:
            counts["hung"] += 1
            counts[f"hung in a round of {kind}"] += 1
        except Exception as exc:  # noqa: BLE001 - counted by name: the test says which
            counts[type(exc).__name__] += 1
            counts[f"first error ({kind}): " + str(exc).splitlines()[0][:300]] = 1
            _record(kind, exc)


def _record(kind: str, exc: BaseException) -> None:
    """With $ORCHESTRA_SOAK_ERRORS (a file's path), each failure's whole traceback and
    time are appended there, to read beside the head's log."""
    path = os.environ.get("ORCHESTRA_SOAK_ERRORS")
    if path:
        text = "".join(traceback.format_exception(exc))
        with open(path, "a") as f:
            f.write(f"--- {time.strftime('%H:%M:%S')} pid {os.getpid()} round {kind}:\n{text}\n")


def failures(counts: dict[str, Any]) -> dict[str, Any]:
    """The counts that are not rounds done right."""
    return {k: v for k, v in counts.items()
            if k not in ("chain", "steps", "big", "nested", "actor")}


def main(argv: list[str]) -> None:
    address, token, seconds, seed = argv[0], argv[1], float(argv[2]), int(argv[3])
    if os.environ.get("ORCHESTRA_SOAK_DUMP_S"):   # a driver that hangs shows where
        import faulthandler
        faulthandler.dump_traceback_later(float(os.environ["ORCHESTRA_SOAK_DUMP_S"]))
    faults = len(argv) > 4 and argv[4] in ("faults", "head-kills")
    detached = len(argv) > 4 and argv[4] == "head-kills"
    orchestra.init(address=address, token=token, namespace="soak" if detached else None)
    try:
        print(json.dumps(rounds(seconds, seed, make_options(faults), detached)), flush=True)
    finally:
        orchestra.shutdown()


if __name__ == "__main__":
    main(sys.argv[1:])
