"""``orchestra.util.futures.OrchestraExecutor``: a ``concurrent.futures.Executor`` whose
calls run as tasks on the cluster. The implementation: orchestra/_libs/executor.py."""
from .._libs.executor import OrchestraExecutor

__all__ = ["OrchestraExecutor"]
