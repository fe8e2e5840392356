"""How often a client's background thread takes a round (CoreClient._background_loop).

Every SHORT seconds while anything goes on; after rounds with nothing to do the wait
doubles up to LONG. Anything that goes on (a frame sent or read, by any thread, or a
direct call) stirs the pacer: the flag tells the next round it was busy, and a long
wait ends at once. An idle process then wakes ~4 times a second instead of 50 (200
idle actors kept ~57% of a core busy at 50).

Shared state: ``stirred`` and ``wait`` are plain attributes that any thread sets and
only the background thread reads and clears; a stir lost between its read and its
clear costs one round of the long wait at most, never a lost frame (frames are read
by whichever thread waits on them, and ref changes travel with every frame sent).
"""
from __future__ import annotations

import threading

SHORT = 0.02
LONG = 0.25


class Pacer:
    __slots__ = ("wait", "stirred", "rounds", "_event", "_stopped")

    def __init__(self) -> None:
        self.wait = SHORT         # the next round's wait
        self.stirred = False      # something went on since the last round
        self.rounds = 0           # rounds taken (what an idle process costs)
        self._event = threading.Event()
        self._stopped = False

    def stir(self) -> None:
        """Something went on: the next round is a busy one, and comes now if the
        background thread waits long."""
        self.stirred = True
        if self.wait != SHORT:
            self._event.set()

    def sleep(self) -> bool:
        """Wait for the next round; False once stopped. Then took() says whether it is
        a busy one."""
        self._event.wait(self.wait)
        self._event.clear()
        if self._stopped:
            return False
        self.rounds += 1
        return True

    def took(self) -> bool:
        """Whether anything stirred since the last round (and forget it)."""
        stirred, self.stirred = self.stirred, False
        return stirred

    def done(self, busy: bool) -> None:
        """The round did work (``busy``): the next comes after SHORT; else the wait
        doubles, up to LONG."""
        self.wait = SHORT if busy else min(2 * self.wait, LONG)

    def stop(self) -> None:
        self._stopped = True
        self._event.set()
