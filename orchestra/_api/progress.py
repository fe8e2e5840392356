"""as_completed(), and the progress bars of get(), wait() and as_completed().

    as_completed(refs) -> pending: {object id: ref} (input order, each id once)
        each look (Arrivals): the ids added to client.results since the last look (a
            walk back from its newest key, in C), kept if pending -> yield their refs,
            drop them from pending; the first look, and one every _FULL_SCAN_S, scans
            all that is pending instead
        none came -> client.values.wait_for(some came, deadline): the thread reads the sockets
            itself, or sleeps until the thread that reads dispatches; never a poll. A
            read dispatches a batch of frames, so one look covers a batch.
    get(refs, progress=...) -> the same looks, counting refs on a bar; then get_many
        (every value here: no wait)
    wait(refs, num_returns=k, progress=...) -> the same looks until k are ready; then
        wait() with timeout 0 makes the (ready, not_ready) lists

Cost: wait(num_returns=1) in a loop scans every ref left on each call (n calls: O(n^2)
for n refs); as_completed looks at what came, once per read that brought some, and
yields all of it. The bar (tqdm.auto: a line on stderr in a terminal, a widget in a
notebook) is imported and built only when asked for: get()'s default path pays one
identity test (``progress is not False``).
"""
from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from itertools import takewhile
from typing import Any, TypeVar

from .._checks import a_type
from .._runtime import context as _context
from .._runtime.generators import ObjectRefGenerator, wait_with_generators
from .._runtime.object_ref import ObjectRef
from ..exceptions import GetTimeoutError
from .args import check_session, check_timeout

R = TypeVar("R")
# tqdm's unit: what the bar counts (get counts refs, duplicates too; as_completed and
# wait count distinct refs).
_UNIT = "obj"


def as_completed(refs: Iterable[ObjectRef[R]], timeout: float | None = None, *,
                 progress: bool | str = False) -> Iterator[ObjectRef[R]]:
    """An iterator over ``refs`` that yields each ref once its value is ready (or its
    task failed: ``get`` on it then raises), in the order they finish, as
    ``concurrent.futures.as_completed`` does with futures.

    ``refs``: ObjectRefs (from tasks, actor calls, ``put`` or the items of a generator
    task), any iterable; a ref given twice is yielded once; none: nothing is yielded.
    Refs already ready are yielded first, in input order.
    ``timeout``: seconds from this call (None: no limit); ``next()`` past it raises
    ``GetTimeoutError`` (a ``TimeoutError``) naming how many refs were not ready; the
    tasks keep running.
    ``progress``: True draws a progress bar (tqdm: counts and rate; a widget in a
    notebook), a string draws it with that label; False (the default) draws nothing.

    Inside a task, the task lends its CPU while it waits, as in ``get``."""
    refs = list(refs)
    client = _context.current_client() if refs else None
    for r in refs:
        if isinstance(r, ObjectRefGenerator):
            raise TypeError("as_completed() takes ObjectRefs; it got an ObjectRefGenerator: "
                            "iterate the generator for its items as they come (they are "
                            "refs), or pass gen.completed() for the end of its task")
        if not isinstance(r, ObjectRef):
            raise TypeError(f"as_completed() takes ObjectRefs; it got {a_type(r)} "
                            f"{r!r}; f.remote(...) and orchestra.put(...) return refs")
        check_session(r, client)
    timeout = check_timeout(timeout)
    desc = bar_label(progress, "as_completed")
    deadline = None if timeout is None else time.monotonic() + timeout
    pending: dict[bytes, ObjectRef[R]] = {}
    for r in refs:
        pending.setdefault(r._id, r)
    return _yield_completed(client, pending, timeout, deadline, desc)


def _yield_completed(client: _context.Client | None, pending: dict[bytes, ObjectRef[R]],
                     timeout: float | None, deadline: float | None,
                     desc: str | None) -> Iterator[ObjectRef[R]]:
    """as_completed's generator: the bar is made at the first next(), closed at the end
    (or when the caller drops the iterator). ``client``: None with no refs."""
    if not pending or client is None:
        return
    total = len(pending)
    bar = open_bar(desc, total)
    try:
        for batch in ready_batches(client, pending, None, deadline):
            if bar is not None:
                bar.update(len(batch))
            yield from batch
        if pending:
            raise GetTimeoutError(
                f"as_completed() timed out after {timeout:g} s with {len(pending)} of "
                f"{total} refs not ready; the tasks keep running. Iterate as_completed() "
                "over the refs left again, or raise the timeout.")
    finally:
        if bar is not None:
            bar.close()


def ready_batches(client: _context.Client, pending: dict[Any, Any], is_ready: Callable[[Any], bool] | None,
                  deadline: float | None) -> Iterator[list[Any]]:
    """Lists of the values of ``pending`` whose keys are ready, as they become ready;
    each key is taken out of ``pending`` as its value is yielded. Ends when ``pending``
    is empty, or at ``deadline`` with the keys not ready left in it.

    ``is_ready`` None: the keys are object ids, ready once in ``client.results``; those
    are found among the ids that came since the last look (Arrivals), not by a scan of
    all that are pending."""
    client.subscribe_missing(k for k in pending if type(k) is bytes)
    # arrived() may be called again after it said yes (the nested wait of a task asks
    # twice): it keeps what it found until the batch is taken.
    if is_ready is None:
        arrivals = Arrivals(client.results, pending)
        arrived, take = arrivals.any_ready, arrivals.take
    else:
        check = is_ready
        came: list[Any] = []

        def arrived() -> bool:
            came[:] = filter(check, pending)
            return bool(came)

        def take() -> list[Any]:
            return came

    while pending:
        # In a task, the ids named let the head run their tasks inline here (get()'s way).
        if not client.values.wait_for(arrived, deadline, (k for k in pending if type(k) is bytes)):
            return
        yield [pending.pop(k) for k in take()]


# A whole scan of what is pending at least this often (seconds), whatever the arrivals
# say: it bounds how late an id is seen should the newest-keys walk ever miss one.
_FULL_SCAN_S = 0.5


class Arrivals:
    """The keys of ``pending`` that are in ``results``, found among the keys added to
    ``results`` since the last look.

    ``results`` (the client's dict of values received) keeps insertion order, so the
    ids that came since the last look are those after the newest key seen then (the
    mark): a walk from the end back to the mark, in C (``takewhile`` over
    ``reversed``: no Python code runs, so no other thread changes the dict during
    it). The first look, a mark that was removed (its ref freed), and every
    ``_FULL_SCAN_S`` scan all of ``pending`` instead."""

    def __init__(self, results: dict[bytes, Any], pending: dict[bytes, Any]) -> None:
        self.results = results
        self.pending = pending
        self.found: dict[bytes, None] = {}   # ready keys not taken yet, in arrival order
        self.mark: bytes | None = None
        self.scanned_at = 0.0

    def any_ready(self) -> bool:
        """Look for keys that came; True while any found is not taken."""
        results, pending, found = self.results, self.pending, self.found
        mark = self.mark
        now = time.monotonic()
        if mark is not None and now - self.scanned_at < _FULL_SCAN_S:
            newest = list(takewhile(mark.__ne__, reversed(results)))
            if len(newest) < len(results):   # the mark is still there
                if newest:
                    self.mark = newest[0]
                    for k in reversed(newest):
                        if k in pending:
                            found[k] = None
                return bool(found)
        # A whole scan; the mark is read first, so an id that comes during the scan
        # is seen by the scan or after the mark, never by neither.
        self.mark = next(reversed(results), None)
        self.scanned_at = now
        found.update(dict.fromkeys(filter(results.__contains__, pending)))
        return bool(found)

    def take(self) -> list[bytes]:
        """The keys found, in the order they came; forgotten here."""
        out = list(self.found)
        self.found.clear()
        return out


# ------------------------------------------------------------------ get / wait with a bar

def get_with_progress(client: _context.Client, refs: Sequence[ObjectRef[Any]], timeout: float | None,
                      progress: bool | str) -> list[Any]:
    """get(refs, progress=...): the values in order, counting refs on a bar as their
    values come (a ref given twice counts twice)."""
    desc = bar_label(progress, "get")
    deadline = None if timeout is None else time.monotonic() + timeout
    counts: dict[bytes, int] = {}
    for r in refs:
        counts[r._id] = counts.get(r._id, 0) + 1
    bar = open_bar(desc, len(refs))
    try:
        for batch in ready_batches(client, counts, None, deadline):
            if bar is not None:
                bar.update(sum(batch))
    finally:
        if bar is not None:
            bar.close()
    if counts:
        n = sum(counts.values())
        raise GetTimeoutError(
            f"get() timed out after {timeout:g} s with {n} of {len(refs)} objects not ready; "
            "the tasks keep running. Call get() again later or raise the timeout.")
    return list(client.values.get_many(refs, None))


def wait_with_progress(client: _context.Client, refs: list[Any], num_returns: int, timeout: float | None,
                       progress: bool | str, streams: bool) -> tuple[list[Any], list[Any]]:
    """wait(refs, num_returns=k, progress=...): a bar of k, counting refs (and
    ObjectRefGenerators with an item ready) as they become ready."""
    desc = bar_label(progress, "wait")
    deadline = None if timeout is None else time.monotonic() + timeout
    # Keys: object ids; with generators among the refs, a generator is its own key,
    # ready when next() on it returns at once (as wait() says).
    pending: dict[Any, Any] = {r._id if isinstance(r, ObjectRef) else r: r for r in refs}
    is_ready = _ref_or_stream_ready(client.results) if streams else None
    bar = open_bar(desc, num_returns)
    ready = 0
    try:
        for batch in ready_batches(client, pending, is_ready, deadline):
            step = min(len(batch), num_returns - ready)
            ready += step
            if bar is not None:
                bar.update(step)
            if ready >= num_returns:
                break
    finally:
        if bar is not None:
            bar.close()
    if streams:
        return wait_with_generators(client, refs, num_returns, 0)
    out: tuple[list[Any], list[Any]] = client.values.wait(refs, num_returns, 0)
    return out


def _ref_or_stream_ready(results: dict[bytes, Any]) -> Callable[[Any], bool]:
    def is_ready(key: Any) -> bool:
        if type(key) is bytes:
            return key in results
        return bool(key.next_ready() or key.is_finished())
    return is_ready


# ------------------------------------------------------------------ the bar

def bar_label(progress: bool | str, default: str) -> str | None:
    """The bar's label for ``progress=``: None for False (no bar), ``default`` for True,
    the string itself for a string; TypeError for anything else."""
    if progress is False:
        return None
    if progress is True:
        return default
    if isinstance(progress, str):
        return progress
    raise TypeError(f"progress must be True, False or a label (str), got {progress!r}")


def open_bar(desc: str | None, total: int) -> Any:
    """A tqdm.auto bar of ``total`` labelled ``desc`` (None: no bar, and tqdm is not
    imported). tqdm.auto is tqdm's notebook widget inside Jupyter, else its text bar on
    stderr."""
    if desc is None:
        return None
    from tqdm.auto import tqdm
    return tqdm(total=total, desc=desc, unit=_UNIT, dynamic_ncols=True)
