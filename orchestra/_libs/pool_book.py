"""The decisions of ``orchestra.util.multiprocessing.Pool`` (_libs/mp_pool.py), without
I/O: which queued chunks go to which of the pool's processes in one call, how many calls
each process holds, when a process is replaced, what fails at terminate. The pool holds
one PoolBook under its lock and does what it says (sends the calls, starts and kills the
processes, hands the results out); tests/unit/test_pool_interleavings.py drives it
through random interleavings.

    add(entry)   a chunk waits (ValueError once the pool is closed or terminated)
    pump()       -> [(call id, slot, entries)]: the calls to send now. A slot holds at
                 most ``in_flight`` calls; while many chunks wait, several go in one call
                 (guided: about a quarter of the queue's share per call, at most
                 ``group_max``), fewer as the queue drains, so the last ones still spread
                 over the processes; a slot never gets more chunks than
                 maxtasksperchild allows its process
    done(id, died) -> (entries, replace, slot), None if terminated meanwhile: a call came
                 back; ``replace``: the slot's process must be replaced now (it died, or it
                 ran maxtasksperchild chunks and has nothing else out). Calls still out to
                 a replaced process come back on their own and count no more.
    terminate()  -> every entry not answered yet (they fail), and nothing more is sent
"""
from __future__ import annotations

import collections
import itertools
from typing import Any

RUN, CLOSE, TERMINATE = "RUN", "CLOSE", "TERMINATE"

# (its result object, the chunk's index in it, the function, the chunk, star arguments)
Entry = tuple[Any, int, Any, list[Any], bool]


class PoolBook:
    def __init__(self, processes: int, maxtasksperchild: int | None, *,
                 in_flight: int = 2, group_max: int = 16) -> None:
        self.maxtasksperchild = maxtasksperchild
        self.limit = in_flight
        self.group_max = group_max
        self.in_flight = [0] * processes     # calls out to each slot's current process
        self.ran = [0] * processes           # chunks sent to it
        self.generation = [0] * processes    # bumped when the slot's process is replaced
        self.queue: collections.deque[Entry] = collections.deque()
        # call id -> (its entries, slot, the slot's generation when sent)
        self.calls: dict[int, tuple[list[Entry], int, int]] = {}
        self.state = RUN
        self._ids = itertools.count()

    def add(self, entry: Entry) -> None:
        if self.state != RUN:
            raise ValueError("Pool not running")
        self.queue.append(entry)

    def pump(self) -> list[tuple[int, int, list[Entry]]]:
        sends: list[tuple[int, int, list[Entry]]] = []
        if self.state == TERMINATE:
            return sends
        queue, slots = self.queue, len(self.in_flight)
        cap = self.maxtasksperchild
        for slot in range(slots):
            limit = self.limit if cap is None else min(self.limit, cap - self.ran[slot])
            while queue and self.in_flight[slot] < limit:
                group = min(self.group_max, max(1, len(queue) // (4 * self.limit * slots)))
                if cap is not None:
                    group = min(group, cap - self.ran[slot])
                entries = [queue.popleft() for _ in range(min(group, len(queue)))]
                call = next(self._ids)
                self.calls[call] = (entries, slot, self.generation[slot])
                self.in_flight[slot] += 1
                self.ran[slot] += len(entries)
                sends.append((call, slot, entries))
            if not queue:
                break
        return sends

    def done(self, call: int, died: bool) -> tuple[list[Entry], bool, int] | None:
        got = self.calls.pop(call, None)
        if got is None:
            return None
        entries, slot, generation = got
        replace = False
        if generation == self.generation[slot]:
            self.in_flight[slot] -= 1
            cap = self.maxtasksperchild
            if self.state != TERMINATE and (died or (
                    cap is not None and self.ran[slot] >= cap and self.in_flight[slot] == 0)):
                replace = True
                self.generation[slot] += 1
                self.in_flight[slot] = self.ran[slot] = 0
        return entries, replace, slot

    def close(self) -> None:
        if self.state == RUN:
            self.state = CLOSE

    def terminate(self) -> list[Entry]:
        if self.state == TERMINATE:
            return []
        self.state = TERMINATE
        pending = [e for entries, _, _ in self.calls.values() for e in entries]
        pending += self.queue
        self.calls.clear()
        self.queue.clear()
        self.in_flight = [0] * len(self.in_flight)   # what is out is no longer counted
        return pending

    def drained(self) -> bool:
        """Nothing waits and nothing is out."""
        return not self.queue and not self.calls
