"""Utilities beside the core API, named as in Ray: ``orchestra.util.ActorPool``,
``orchestra.util.queue.Queue``, ``orchestra.util.scheduling_strategies``."""
from .actor_pool import ActorPool

__all__ = ["ActorPool"]
