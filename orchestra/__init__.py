"""orchestra: tasks, actors and objects on a local cluster of worker processes.

The public API; everything else lives in private modules.
"""
from . import actor, exceptions, util
from ._actor import ActorClass, ActorHandle, get_actor, kill, method
from ._api import remote
from ._auth import VERSION as _VERSION
from ._context import RuntimeContext, get_runtime_context
from ._gang import Gang, gang
from ._gang_errors import GangAbortedError, GangError, GangMemberDiedError, GangTimeoutError
from ._gang_member import GangContext, GangDevice, gang_context
from ._generators import DynamicObjectRefGenerator, ObjectRefGenerator
from ._object_ref import ObjectRef
from ._progress import as_completed
from ._remote_function import RemoteFunction
from ._session import (
    available_resources,
    cancel,
    cluster_resources,
    get,
    get_gpu_ids,
    init,
    is_initialized,
    nodes,
    put,
    shutdown,
    wait,
)
from ._timeline import timeline

__version__ = _VERSION

__all__ = [
    "init", "shutdown", "is_initialized", "remote", "RemoteFunction", "get", "put", "wait",
    "as_completed", "cancel", "get_gpu_ids", "nodes", "get_runtime_context", "RuntimeContext",
    "cluster_resources", "available_resources", "ObjectRef",
    "ObjectRefGenerator", "DynamicObjectRefGenerator",
    "exceptions", "ActorClass", "ActorHandle", "get_actor", "kill", "method", "actor", "util",
    "gang", "Gang", "gang_context", "GangContext", "GangDevice", "GangError",
    "GangAbortedError", "GangTimeoutError", "GangMemberDiedError", "timeline",
]
