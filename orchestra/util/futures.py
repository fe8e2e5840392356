"""``orchestra.util.futures.OrchestraExecutor``: a ``concurrent.futures.Executor`` whose
calls run as tasks on the cluster. The implementation: orchestra/_api/executor.py."""
from .._api.executor import OrchestraExecutor

__all__ = ["OrchestraExecutor"]
