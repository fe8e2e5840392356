"""``orchestra.util.queue.Queue`` (as ``ray.util.queue``): a FIFO queue shared by the
driver, tasks and actors; ``Empty`` and ``Full`` subclass the standard library's. The
implementation: orchestra/_libs/queue.py."""
from .._libs.queue import Empty, Full, Queue

__all__ = ["Queue", "Empty", "Full"]
