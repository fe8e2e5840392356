"""``orchestra.util.queue.Queue`` (as ``ray.util.queue``): a FIFO queue shared by the
driver, tasks and actors; ``Empty`` and ``Full`` subclass the standard library's. The
implementation: orchestra/_api/queue.py."""
from .._api.queue import Empty, Full, Queue

__all__ = ["Queue", "Empty", "Full"]
