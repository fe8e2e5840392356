"""A call run on a thread, with its result or exception handed back (tests of blocking RPCs)."""
from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any


class Background:
    """Runs a call in a thread and hands back its result or the exception it raised."""

    def __init__(self, fn: Callable[[], Any]) -> None:
        self.result: Any = None
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, args=(fn,), daemon=True)
        self.thread.start()

    def _run(self, fn: Callable[[], Any]) -> None:
        try:
            self.result = fn()
        except BaseException as err:  # noqa: BLE001 (re-raised in the test thread by join())
            self.error = err

    def join(self, timeout: float = 10.0) -> Any:
        self.thread.join(timeout)
        assert not self.thread.is_alive(), "background call did not return"
        if self.error is not None:
            raise self.error
        return self.result
