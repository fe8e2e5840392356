"""Progress bars from inside tasks and actors, drawn on the driver: ``tqdm``, named and
used as ``tqdm.tqdm`` (Ray's ``ray.experimental.tqdm_ray.tqdm``)::

    from orchestra.util.tqdm import tqdm

    @orchestra.remote
    def work(n):
        for _ in tqdm(range(n), desc="work"):
            ...

Each bar is one line on the driver's terminal, redrawn in place below the tasks' log
lines (not one log line per update); where the driver's stderr is no terminal, each bar
prints once, when it closes. A task's bar sends its state at most every 0.1 s
(``flush_interval_s``). Bars need the driver's log forwarding (``init(log_to_driver=True)``,
the default). ``safe_print`` prints in the driver without breaking the bars.
"""
from __future__ import annotations

from .._observe.progress_bars import safe_print, tqdm

__all__ = ["tqdm", "safe_print"]
