"""``orchestra.util.ActorPool`` (as ``ray.util.ActorPool``): calls spread over a fixed set
of actors, one call per actor at a time. The implementation: orchestra/_libs/actor_pool.py."""
from .._libs.actor_pool import ActorPool

__all__ = ["ActorPool"]
