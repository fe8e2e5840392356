"""``orchestra.util.multiprocessing.Pool`` (as ``ray.util.multiprocessing.Pool``): the
standard library's ``multiprocessing.Pool`` on the cluster. The implementation:
orchestra/_libs/mp_pool.py."""
from multiprocessing import TimeoutError  # noqa: A004, F401 - what get() raises, by the standard library's name

from .._libs.mp_pool import ApplyResult, AsyncResult, IMapIterator, MapResult, Pool

__all__ = ["Pool", "ApplyResult", "AsyncResult", "MapResult", "IMapIterator"]
