"""orchestra: tasks, actors and objects on a local cluster of worker processes.

The public API; everything else lives in private modules.
"""
from . import actor, dag, exceptions, util
from ._api.actor import ActorClass, ActorHandle, get_actor, kill, method
from ._api.progress import as_completed
from ._api.remote import remote
from ._api.remote_function import RemoteFunction
from ._api.session import (
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
from ._api.timeline import timeline
from ._gang.errors import GangAbortedError, GangError, GangMemberDiedError, GangTimeoutError
from ._gang.gang import Gang, gang
from ._gang.member import GangContext, GangDevice, gang_context
from ._protocol.auth import VERSION as _VERSION
from ._runtime.context import RuntimeContext, get_runtime_context
from ._runtime.generators import DynamicObjectRefGenerator, ObjectRefGenerator
from ._runtime.object_ref import ObjectRef

__version__ = _VERSION

__all__ = [
    "init", "shutdown", "is_initialized", "remote", "RemoteFunction", "get", "put", "wait",
    "as_completed", "cancel", "get_gpu_ids", "nodes", "get_runtime_context", "RuntimeContext",
    "cluster_resources", "available_resources", "ObjectRef",
    "ObjectRefGenerator", "DynamicObjectRefGenerator",
    "exceptions", "ActorClass", "ActorHandle", "get_actor", "kill", "method", "actor", "dag", "util",
    "gang", "Gang", "gang_context", "GangContext", "GangDevice", "GangError",
    "GangAbortedError", "GangTimeoutError", "GangMemberDiedError", "timeline",
]
