"""``orchestra.util.joblib`` (as ``ray.util.joblib``): ``register_orchestra()`` registers
the joblib backend "orchestra". Needs joblib. The implementation:
orchestra/_libs/joblib_backend.py."""
from .._libs.joblib_backend import OrchestraBackend, register_orchestra

__all__ = ["register_orchestra", "OrchestraBackend"]
