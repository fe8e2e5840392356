from orchestra._proto import types_pb2 as _types_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class AckReply(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class RegisterWorkerRequest(_message.Message):
    __slots__ = ("worker_address", "objstore_address", "node_id", "pid")
    WORKER_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    OBJSTORE_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    PID_FIELD_NUMBER: _ClassVar[int]
    worker_address: str
    objstore_address: str
    node_id: int
    pid: int
    def __init__(self, worker_address: _Optional[str] = ..., objstore_address: _Optional[str] = ..., node_id: _Optional[int] = ..., pid: _Optional[int] = ...) -> None: ...

class RegisterWorkerReply(_message.Message):
    __slots__ = ("workerid",)
    WORKERID_FIELD_NUMBER: _ClassVar[int]
    workerid: int
    def __init__(self, workerid: _Optional[int] = ...) -> None: ...

class RegisterObjStoreRequest(_message.Message):
    __slots__ = ("objstore_address", "node_id", "capacity")
    OBJSTORE_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    CAPACITY_FIELD_NUMBER: _ClassVar[int]
    objstore_address: str
    node_id: int
    capacity: int
    def __init__(self, objstore_address: _Optional[str] = ..., node_id: _Optional[int] = ..., capacity: _Optional[int] = ...) -> None: ...

class RegisterObjStoreReply(_message.Message):
    __slots__ = ("objstoreid",)
    OBJSTOREID_FIELD_NUMBER: _ClassVar[int]
    objstoreid: int
    def __init__(self, objstoreid: _Optional[int] = ...) -> None: ...

class RegisterFunctionRequest(_message.Message):
    __slots__ = ("workerid", "fnname", "num_return_vals", "function_id", "pickled")
    WORKERID_FIELD_NUMBER: _ClassVar[int]
    FNNAME_FIELD_NUMBER: _ClassVar[int]
    NUM_RETURN_VALS_FIELD_NUMBER: _ClassVar[int]
    FUNCTION_ID_FIELD_NUMBER: _ClassVar[int]
    PICKLED_FIELD_NUMBER: _ClassVar[int]
    workerid: int
    fnname: str
    num_return_vals: int
    function_id: bytes
    pickled: bytes
    def __init__(self, workerid: _Optional[int] = ..., fnname: _Optional[str] = ..., num_return_vals: _Optional[int] = ..., function_id: _Optional[bytes] = ..., pickled: _Optional[bytes] = ...) -> None: ...

class DurableJob(_message.Message):
    __slots__ = ("job_id", "status", "driver_pid", "node_id", "namespace", "entrypoint", "start_ms", "end_ms", "message")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    DRIVER_PID_FIELD_NUMBER: _ClassVar[int]
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    ENTRYPOINT_FIELD_NUMBER: _ClassVar[int]
    START_MS_FIELD_NUMBER: _ClassVar[int]
    END_MS_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    status: str
    driver_pid: int
    node_id: int
    namespace: str
    entrypoint: str
    start_ms: int
    end_ms: int
    message: str
    def __init__(self, job_id: _Optional[str] = ..., status: _Optional[str] = ..., driver_pid: _Optional[int] = ..., node_id: _Optional[int] = ..., namespace: _Optional[str] = ..., entrypoint: _Optional[str] = ..., start_ms: _Optional[int] = ..., end_ms: _Optional[int] = ..., message: _Optional[str] = ...) -> None: ...

class DurableActor(_message.Message):
    __slots__ = ("creation", "cls", "restarts", "revived", "node_id", "owner_key")
    CREATION_FIELD_NUMBER: _ClassVar[int]
    CLS_FIELD_NUMBER: _ClassVar[int]
    RESTARTS_FIELD_NUMBER: _ClassVar[int]
    REVIVED_FIELD_NUMBER: _ClassVar[int]
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    OWNER_KEY_FIELD_NUMBER: _ClassVar[int]
    creation: _types_pb2.Call
    cls: RegisterFunctionRequest
    restarts: int
    revived: int
    node_id: int
    owner_key: bytes
    def __init__(self, creation: _Optional[_Union[_types_pb2.Call, _Mapping]] = ..., cls: _Optional[_Union[RegisterFunctionRequest, _Mapping]] = ..., restarts: _Optional[int] = ..., revived: _Optional[int] = ..., node_id: _Optional[int] = ..., owner_key: _Optional[bytes] = ...) -> None: ...

class RemoteCallRequest(_message.Message):
    __slots__ = ("call",)
    CALL_FIELD_NUMBER: _ClassVar[int]
    call: _types_pb2.Call
    def __init__(self, call: _Optional[_Union[_types_pb2.Call, _Mapping]] = ...) -> None: ...

class RemoteCallReply(_message.Message):
    __slots__ = ("result",)
    RESULT_FIELD_NUMBER: _ClassVar[int]
    result: _containers.RepeatedScalarFieldContainer[bytes]
    def __init__(self, result: _Optional[_Iterable[bytes]] = ...) -> None: ...

class RequestObjRequest(_message.Message):
    __slots__ = ("workerid", "objref", "timeout_s")
    WORKERID_FIELD_NUMBER: _ClassVar[int]
    OBJREF_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_S_FIELD_NUMBER: _ClassVar[int]
    workerid: int
    objref: bytes
    timeout_s: float
    def __init__(self, workerid: _Optional[int] = ..., objref: _Optional[bytes] = ..., timeout_s: _Optional[float] = ...) -> None: ...

class PushObjRequest(_message.Message):
    __slots__ = ("workerid", "obj")
    WORKERID_FIELD_NUMBER: _ClassVar[int]
    OBJ_FIELD_NUMBER: _ClassVar[int]
    workerid: int
    obj: _types_pb2.ObjectData
    def __init__(self, workerid: _Optional[int] = ..., obj: _Optional[_Union[_types_pb2.ObjectData, _Mapping]] = ...) -> None: ...

class PushObjReply(_message.Message):
    __slots__ = ("objref",)
    OBJREF_FIELD_NUMBER: _ClassVar[int]
    objref: bytes
    def __init__(self, objref: _Optional[bytes] = ...) -> None: ...

class ObjReadyRequest(_message.Message):
    __slots__ = ("objref", "objstoreid", "segment")
    OBJREF_FIELD_NUMBER: _ClassVar[int]
    OBJSTOREID_FIELD_NUMBER: _ClassVar[int]
    SEGMENT_FIELD_NUMBER: _ClassVar[int]
    objref: bytes
    objstoreid: int
    segment: _types_pb2.Segment
    def __init__(self, objref: _Optional[bytes] = ..., objstoreid: _Optional[int] = ..., segment: _Optional[_Union[_types_pb2.Segment, _Mapping]] = ...) -> None: ...

class WorkerReadyRequest(_message.Message):
    __slots__ = ("workerid",)
    WORKERID_FIELD_NUMBER: _ClassVar[int]
    workerid: int
    def __init__(self, workerid: _Optional[int] = ...) -> None: ...

class ChangeCountRequest(_message.Message):
    __slots__ = ("objref",)
    OBJREF_FIELD_NUMBER: _ClassVar[int]
    objref: _containers.RepeatedScalarFieldContainer[bytes]
    def __init__(self, objref: _Optional[_Iterable[bytes]] = ...) -> None: ...

class SchedulerDebugInfoRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class FnTableEntry(_message.Message):
    __slots__ = ("workerid", "num_return_vals")
    WORKERID_FIELD_NUMBER: _ClassVar[int]
    NUM_RETURN_VALS_FIELD_NUMBER: _ClassVar[int]
    workerid: _containers.RepeatedScalarFieldContainer[int]
    num_return_vals: int
    def __init__(self, workerid: _Optional[_Iterable[int]] = ..., num_return_vals: _Optional[int] = ...) -> None: ...

class WorkerInfo(_message.Message):
    __slots__ = ("workerid", "pid", "node_id", "state", "running")
    WORKERID_FIELD_NUMBER: _ClassVar[int]
    PID_FIELD_NUMBER: _ClassVar[int]
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    RUNNING_FIELD_NUMBER: _ClassVar[int]
    workerid: int
    pid: int
    node_id: int
    state: str
    running: _containers.RepeatedScalarFieldContainer[bytes]
    def __init__(self, workerid: _Optional[int] = ..., pid: _Optional[int] = ..., node_id: _Optional[int] = ..., state: _Optional[str] = ..., running: _Optional[_Iterable[bytes]] = ...) -> None: ...

class ObjectInfo(_message.Message):
    __slots__ = ("objref", "state", "refcount", "size", "in_shared_memory", "spilled")
    OBJREF_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    REFCOUNT_FIELD_NUMBER: _ClassVar[int]
    SIZE_FIELD_NUMBER: _ClassVar[int]
    IN_SHARED_MEMORY_FIELD_NUMBER: _ClassVar[int]
    SPILLED_FIELD_NUMBER: _ClassVar[int]
    objref: bytes
    state: str
    refcount: int
    size: int
    in_shared_memory: bool
    spilled: bool
    def __init__(self, objref: _Optional[bytes] = ..., state: _Optional[str] = ..., refcount: _Optional[int] = ..., size: _Optional[int] = ..., in_shared_memory: _Optional[bool] = ..., spilled: _Optional[bool] = ...) -> None: ...

class SchedulerDebugInfoReply(_message.Message):
    __slots__ = ("task", "avail_worker", "function_table", "workers", "objects", "total_resources", "available_resources")
    class FunctionTableEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: FnTableEntry
        def __init__(self, key: _Optional[str] = ..., value: _Optional[_Union[FnTableEntry, _Mapping]] = ...) -> None: ...
    class TotalResourcesEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    class AvailableResourcesEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    TASK_FIELD_NUMBER: _ClassVar[int]
    AVAIL_WORKER_FIELD_NUMBER: _ClassVar[int]
    FUNCTION_TABLE_FIELD_NUMBER: _ClassVar[int]
    WORKERS_FIELD_NUMBER: _ClassVar[int]
    OBJECTS_FIELD_NUMBER: _ClassVar[int]
    TOTAL_RESOURCES_FIELD_NUMBER: _ClassVar[int]
    AVAILABLE_RESOURCES_FIELD_NUMBER: _ClassVar[int]
    task: _containers.RepeatedCompositeFieldContainer[_types_pb2.Call]
    avail_worker: _containers.RepeatedScalarFieldContainer[int]
    function_table: _containers.MessageMap[str, FnTableEntry]
    workers: _containers.RepeatedCompositeFieldContainer[WorkerInfo]
    objects: _containers.RepeatedCompositeFieldContainer[ObjectInfo]
    total_resources: _containers.ScalarMap[str, float]
    available_resources: _containers.ScalarMap[str, float]
    def __init__(self, task: _Optional[_Iterable[_Union[_types_pb2.Call, _Mapping]]] = ..., avail_worker: _Optional[_Iterable[int]] = ..., function_table: _Optional[_Mapping[str, FnTableEntry]] = ..., workers: _Optional[_Iterable[_Union[WorkerInfo, _Mapping]]] = ..., objects: _Optional[_Iterable[_Union[ObjectInfo, _Mapping]]] = ..., total_resources: _Optional[_Mapping[str, float]] = ..., available_resources: _Optional[_Mapping[str, float]] = ...) -> None: ...

class DeliverObjRequest(_message.Message):
    __slots__ = ("objstore_address", "objref")
    OBJSTORE_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    OBJREF_FIELD_NUMBER: _ClassVar[int]
    objstore_address: str
    objref: bytes
    def __init__(self, objstore_address: _Optional[str] = ..., objref: _Optional[bytes] = ...) -> None: ...

class ObjChunk(_message.Message):
    __slots__ = ("objref", "totalsize", "data")
    OBJREF_FIELD_NUMBER: _ClassVar[int]
    TOTALSIZE_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    objref: bytes
    totalsize: int
    data: bytes
    def __init__(self, objref: _Optional[bytes] = ..., totalsize: _Optional[int] = ..., data: _Optional[bytes] = ...) -> None: ...

class ObjStoreDebugInfoRequest(_message.Message):
    __slots__ = ("objref",)
    OBJREF_FIELD_NUMBER: _ClassVar[int]
    objref: _containers.RepeatedScalarFieldContainer[bytes]
    def __init__(self, objref: _Optional[_Iterable[bytes]] = ...) -> None: ...

class ObjStoreDebugInfoReply(_message.Message):
    __slots__ = ("objref", "segment", "capacity", "used", "spilled_bytes", "spilled_objects", "pooled")
    OBJREF_FIELD_NUMBER: _ClassVar[int]
    SEGMENT_FIELD_NUMBER: _ClassVar[int]
    CAPACITY_FIELD_NUMBER: _ClassVar[int]
    USED_FIELD_NUMBER: _ClassVar[int]
    SPILLED_BYTES_FIELD_NUMBER: _ClassVar[int]
    SPILLED_OBJECTS_FIELD_NUMBER: _ClassVar[int]
    POOLED_FIELD_NUMBER: _ClassVar[int]
    objref: _containers.RepeatedScalarFieldContainer[bytes]
    segment: _containers.RepeatedCompositeFieldContainer[_types_pb2.Segment]
    capacity: int
    used: int
    spilled_bytes: int
    spilled_objects: int
    pooled: int
    def __init__(self, objref: _Optional[_Iterable[bytes]] = ..., segment: _Optional[_Iterable[_Union[_types_pb2.Segment, _Mapping]]] = ..., capacity: _Optional[int] = ..., used: _Optional[int] = ..., spilled_bytes: _Optional[int] = ..., spilled_objects: _Optional[int] = ..., pooled: _Optional[int] = ...) -> None: ...

class InvokeCallRequest(_message.Message):
    __slots__ = ("call", "resolved", "gpu_ids", "attempt", "owner")
    CALL_FIELD_NUMBER: _ClassVar[int]
    RESOLVED_FIELD_NUMBER: _ClassVar[int]
    GPU_IDS_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    OWNER_FIELD_NUMBER: _ClassVar[int]
    call: _types_pb2.Call
    resolved: _containers.RepeatedCompositeFieldContainer[_types_pb2.ObjectData]
    gpu_ids: _containers.RepeatedScalarFieldContainer[int]
    attempt: int
    owner: int
    def __init__(self, call: _Optional[_Union[_types_pb2.Call, _Mapping]] = ..., resolved: _Optional[_Iterable[_Union[_types_pb2.ObjectData, _Mapping]]] = ..., gpu_ids: _Optional[_Iterable[int]] = ..., attempt: _Optional[int] = ..., owner: _Optional[int] = ...) -> None: ...

class InvokeCallReply(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class Hello(_message.Message):
    __slots__ = ("kind", "pid", "workerid", "cwd", "sys_path", "node_id", "machine", "namespace", "log_job", "resume_actor", "resume_task", "driver_key", "entrypoint", "tool")
    KIND_FIELD_NUMBER: _ClassVar[int]
    PID_FIELD_NUMBER: _ClassVar[int]
    WORKERID_FIELD_NUMBER: _ClassVar[int]
    CWD_FIELD_NUMBER: _ClassVar[int]
    SYS_PATH_FIELD_NUMBER: _ClassVar[int]
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    MACHINE_FIELD_NUMBER: _ClassVar[int]
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    LOG_JOB_FIELD_NUMBER: _ClassVar[int]
    RESUME_ACTOR_FIELD_NUMBER: _ClassVar[int]
    RESUME_TASK_FIELD_NUMBER: _ClassVar[int]
    DRIVER_KEY_FIELD_NUMBER: _ClassVar[int]
    ENTRYPOINT_FIELD_NUMBER: _ClassVar[int]
    TOOL_FIELD_NUMBER: _ClassVar[int]
    kind: str
    pid: int
    workerid: int
    cwd: str
    sys_path: _containers.RepeatedScalarFieldContainer[str]
    node_id: int
    machine: str
    namespace: str
    log_job: int
    resume_actor: bytes
    resume_task: bytes
    driver_key: bytes
    entrypoint: str
    tool: bool
    def __init__(self, kind: _Optional[str] = ..., pid: _Optional[int] = ..., workerid: _Optional[int] = ..., cwd: _Optional[str] = ..., sys_path: _Optional[_Iterable[str]] = ..., node_id: _Optional[int] = ..., machine: _Optional[str] = ..., namespace: _Optional[str] = ..., log_job: _Optional[int] = ..., resume_actor: _Optional[bytes] = ..., resume_task: _Optional[bytes] = ..., driver_key: _Optional[bytes] = ..., entrypoint: _Optional[str] = ..., tool: _Optional[bool] = ...) -> None: ...

class HelloReply(_message.Message):
    __slots__ = ("session_id", "node_id", "node_resources", "store_capacity", "session_dir", "cwd", "sys_path", "inline_threshold", "conn_id", "shm_dir", "node_dir", "joinable", "node_address", "dashboard_url", "infeasible_waits", "reconnect_s", "claimed_actors")
    class NodeResourcesEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    NODE_RESOURCES_FIELD_NUMBER: _ClassVar[int]
    STORE_CAPACITY_FIELD_NUMBER: _ClassVar[int]
    SESSION_DIR_FIELD_NUMBER: _ClassVar[int]
    CWD_FIELD_NUMBER: _ClassVar[int]
    SYS_PATH_FIELD_NUMBER: _ClassVar[int]
    INLINE_THRESHOLD_FIELD_NUMBER: _ClassVar[int]
    CONN_ID_FIELD_NUMBER: _ClassVar[int]
    SHM_DIR_FIELD_NUMBER: _ClassVar[int]
    NODE_DIR_FIELD_NUMBER: _ClassVar[int]
    JOINABLE_FIELD_NUMBER: _ClassVar[int]
    NODE_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    DASHBOARD_URL_FIELD_NUMBER: _ClassVar[int]
    INFEASIBLE_WAITS_FIELD_NUMBER: _ClassVar[int]
    RECONNECT_S_FIELD_NUMBER: _ClassVar[int]
    CLAIMED_ACTORS_FIELD_NUMBER: _ClassVar[int]
    session_id: bytes
    node_id: int
    node_resources: _containers.ScalarMap[str, float]
    store_capacity: int
    session_dir: str
    cwd: str
    sys_path: _containers.RepeatedScalarFieldContainer[str]
    inline_threshold: int
    conn_id: int
    shm_dir: str
    node_dir: str
    joinable: bool
    node_address: str
    dashboard_url: str
    infeasible_waits: bool
    reconnect_s: float
    claimed_actors: _containers.RepeatedScalarFieldContainer[bytes]
    def __init__(self, session_id: _Optional[bytes] = ..., node_id: _Optional[int] = ..., node_resources: _Optional[_Mapping[str, float]] = ..., store_capacity: _Optional[int] = ..., session_dir: _Optional[str] = ..., cwd: _Optional[str] = ..., sys_path: _Optional[_Iterable[str]] = ..., inline_threshold: _Optional[int] = ..., conn_id: _Optional[int] = ..., shm_dir: _Optional[str] = ..., node_dir: _Optional[str] = ..., joinable: _Optional[bool] = ..., node_address: _Optional[str] = ..., dashboard_url: _Optional[str] = ..., infeasible_waits: _Optional[bool] = ..., reconnect_s: _Optional[float] = ..., claimed_actors: _Optional[_Iterable[bytes]] = ...) -> None: ...

class Submit(_message.Message):
    __slots__ = ("calls",)
    CALLS_FIELD_NUMBER: _ClassVar[int]
    calls: _containers.RepeatedCompositeFieldContainer[_types_pb2.Call]
    def __init__(self, calls: _Optional[_Iterable[_Union[_types_pb2.Call, _Mapping]]] = ...) -> None: ...

class Objects(_message.Message):
    __slots__ = ("objects",)
    OBJECTS_FIELD_NUMBER: _ClassVar[int]
    objects: _containers.RepeatedCompositeFieldContainer[_types_pb2.ObjectData]
    def __init__(self, objects: _Optional[_Iterable[_Union[_types_pb2.ObjectData, _Mapping]]] = ...) -> None: ...

class Subscribe(_message.Message):
    __slots__ = ("ids",)
    IDS_FIELD_NUMBER: _ClassVar[int]
    ids: _containers.RepeatedScalarFieldContainer[bytes]
    def __init__(self, ids: _Optional[_Iterable[bytes]] = ...) -> None: ...

class SegmentNames(_message.Message):
    __slots__ = ("names",)
    NAMES_FIELD_NUMBER: _ClassVar[int]
    names: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, names: _Optional[_Iterable[str]] = ...) -> None: ...

class RefDelta(_message.Message):
    __slots__ = ("incr", "decr", "pin", "unpin", "pending", "give_back")
    INCR_FIELD_NUMBER: _ClassVar[int]
    DECR_FIELD_NUMBER: _ClassVar[int]
    PIN_FIELD_NUMBER: _ClassVar[int]
    UNPIN_FIELD_NUMBER: _ClassVar[int]
    PENDING_FIELD_NUMBER: _ClassVar[int]
    GIVE_BACK_FIELD_NUMBER: _ClassVar[int]
    incr: _containers.RepeatedScalarFieldContainer[bytes]
    decr: _containers.RepeatedScalarFieldContainer[bytes]
    pin: _containers.RepeatedScalarFieldContainer[str]
    unpin: _containers.RepeatedScalarFieldContainer[str]
    pending: _containers.RepeatedScalarFieldContainer[bytes]
    give_back: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, incr: _Optional[_Iterable[bytes]] = ..., decr: _Optional[_Iterable[bytes]] = ..., pin: _Optional[_Iterable[str]] = ..., unpin: _Optional[_Iterable[str]] = ..., pending: _Optional[_Iterable[bytes]] = ..., give_back: _Optional[_Iterable[str]] = ...) -> None: ...

class CancelRequest(_message.Message):
    __slots__ = ("object_id", "force", "recursive")
    OBJECT_ID_FIELD_NUMBER: _ClassVar[int]
    FORCE_FIELD_NUMBER: _ClassVar[int]
    RECURSIVE_FIELD_NUMBER: _ClassVar[int]
    object_id: bytes
    force: bool
    recursive: bool
    def __init__(self, object_id: _Optional[bytes] = ..., force: _Optional[bool] = ..., recursive: _Optional[bool] = ...) -> None: ...

class Execute(_message.Message):
    __slots__ = ("invoke",)
    INVOKE_FIELD_NUMBER: _ClassVar[int]
    invoke: InvokeCallRequest
    def __init__(self, invoke: _Optional[_Union[InvokeCallRequest, _Mapping]] = ...) -> None: ...

class TaskDone(_message.Message):
    __slots__ = ("task_id", "returns", "user_error", "cancelled", "not_retryable", "owner", "lineage")
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    RETURNS_FIELD_NUMBER: _ClassVar[int]
    USER_ERROR_FIELD_NUMBER: _ClassVar[int]
    CANCELLED_FIELD_NUMBER: _ClassVar[int]
    NOT_RETRYABLE_FIELD_NUMBER: _ClassVar[int]
    OWNER_FIELD_NUMBER: _ClassVar[int]
    LINEAGE_FIELD_NUMBER: _ClassVar[int]
    task_id: bytes
    returns: _containers.RepeatedCompositeFieldContainer[_types_pb2.ObjectData]
    user_error: bool
    cancelled: bool
    not_retryable: bool
    owner: int
    lineage: _types_pb2.Call
    def __init__(self, task_id: _Optional[bytes] = ..., returns: _Optional[_Iterable[_Union[_types_pb2.ObjectData, _Mapping]]] = ..., user_error: _Optional[bool] = ..., cancelled: _Optional[bool] = ..., not_retryable: _Optional[bool] = ..., owner: _Optional[int] = ..., lineage: _Optional[_Union[_types_pb2.Call, _Mapping]] = ...) -> None: ...

class ActorAddress(_message.Message):
    __slots__ = ("actor_id", "worker_id", "path", "dispatched")
    ACTOR_ID_FIELD_NUMBER: _ClassVar[int]
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    PATH_FIELD_NUMBER: _ClassVar[int]
    DISPATCHED_FIELD_NUMBER: _ClassVar[int]
    actor_id: bytes
    worker_id: int
    path: str
    dispatched: int
    def __init__(self, actor_id: _Optional[bytes] = ..., worker_id: _Optional[int] = ..., path: _Optional[str] = ..., dispatched: _Optional[int] = ...) -> None: ...

class AdoptCalls(_message.Message):
    __slots__ = ("actor_id", "worker_id", "calls", "cancelled", "answered")
    ACTOR_ID_FIELD_NUMBER: _ClassVar[int]
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    CALLS_FIELD_NUMBER: _ClassVar[int]
    CANCELLED_FIELD_NUMBER: _ClassVar[int]
    ANSWERED_FIELD_NUMBER: _ClassVar[int]
    actor_id: bytes
    worker_id: int
    calls: _containers.RepeatedCompositeFieldContainer[_types_pb2.Call]
    cancelled: _containers.RepeatedScalarFieldContainer[bytes]
    answered: _containers.RepeatedScalarFieldContainer[bytes]
    def __init__(self, actor_id: _Optional[bytes] = ..., worker_id: _Optional[int] = ..., calls: _Optional[_Iterable[_Union[_types_pb2.Call, _Mapping]]] = ..., cancelled: _Optional[_Iterable[bytes]] = ..., answered: _Optional[_Iterable[bytes]] = ...) -> None: ...

class Loan(_message.Message):
    __slots__ = ("worker_id", "path", "gpu_ids", "resources", "pid", "busy_task", "pinned_node")
    class ResourcesEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    PATH_FIELD_NUMBER: _ClassVar[int]
    GPU_IDS_FIELD_NUMBER: _ClassVar[int]
    RESOURCES_FIELD_NUMBER: _ClassVar[int]
    PID_FIELD_NUMBER: _ClassVar[int]
    BUSY_TASK_FIELD_NUMBER: _ClassVar[int]
    PINNED_NODE_FIELD_NUMBER: _ClassVar[int]
    worker_id: int
    path: str
    gpu_ids: _containers.RepeatedScalarFieldContainer[int]
    resources: _containers.ScalarMap[str, float]
    pid: int
    busy_task: bytes
    pinned_node: int
    def __init__(self, worker_id: _Optional[int] = ..., path: _Optional[str] = ..., gpu_ids: _Optional[_Iterable[int]] = ..., resources: _Optional[_Mapping[str, float]] = ..., pid: _Optional[int] = ..., busy_task: _Optional[bytes] = ..., pinned_node: _Optional[int] = ...) -> None: ...

class LoanRequest(_message.Message):
    __slots__ = ("resources", "pinned_node")
    class ResourcesEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    RESOURCES_FIELD_NUMBER: _ClassVar[int]
    PINNED_NODE_FIELD_NUMBER: _ClassVar[int]
    resources: _containers.ScalarMap[str, float]
    pinned_node: int
    def __init__(self, resources: _Optional[_Mapping[str, float]] = ..., pinned_node: _Optional[int] = ...) -> None: ...

class LoanRecall(_message.Message):
    __slots__ = ("worker_id",)
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    worker_id: int
    def __init__(self, worker_id: _Optional[int] = ...) -> None: ...

class LoanReturn(_message.Message):
    __slots__ = ("worker_id",)
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    worker_id: int
    def __init__(self, worker_id: _Optional[int] = ...) -> None: ...

class ReturnTasks(_message.Message):
    __slots__ = ("task_ids",)
    TASK_IDS_FIELD_NUMBER: _ClassVar[int]
    task_ids: _containers.RepeatedScalarFieldContainer[bytes]
    def __init__(self, task_ids: _Optional[_Iterable[bytes]] = ...) -> None: ...

class Blocked(_message.Message):
    __slots__ = ("blocked", "object_ids", "task_id", "task_name")
    BLOCKED_FIELD_NUMBER: _ClassVar[int]
    OBJECT_IDS_FIELD_NUMBER: _ClassVar[int]
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    TASK_NAME_FIELD_NUMBER: _ClassVar[int]
    blocked: bool
    object_ids: _containers.RepeatedScalarFieldContainer[bytes]
    task_id: bytes
    task_name: str
    def __init__(self, blocked: _Optional[bool] = ..., object_ids: _Optional[_Iterable[bytes]] = ..., task_id: _Optional[bytes] = ..., task_name: _Optional[str] = ...) -> None: ...

class Closing(_message.Message):
    __slots__ = ("reason",)
    REASON_FIELD_NUMBER: _ClassVar[int]
    reason: str
    def __init__(self, reason: _Optional[str] = ...) -> None: ...

class ClusterWarning(_message.Message):
    __slots__ = ("text",)
    TEXT_FIELD_NUMBER: _ClassVar[int]
    text: str
    def __init__(self, text: _Optional[str] = ...) -> None: ...

class Stalled(_message.Message):
    __slots__ = ("text", "task_ids")
    TEXT_FIELD_NUMBER: _ClassVar[int]
    TASK_IDS_FIELD_NUMBER: _ClassVar[int]
    text: str
    task_ids: _containers.RepeatedScalarFieldContainer[bytes]
    def __init__(self, text: _Optional[str] = ..., task_ids: _Optional[_Iterable[bytes]] = ...) -> None: ...

class CancelTask(_message.Message):
    __slots__ = ("task_id", "recursive")
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    RECURSIVE_FIELD_NUMBER: _ClassVar[int]
    task_id: bytes
    recursive: bool
    def __init__(self, task_id: _Optional[bytes] = ..., recursive: _Optional[bool] = ...) -> None: ...

class Request(_message.Message):
    __slots__ = ("req_id", "create_segment", "query", "create_actor", "kill_actor", "get_actor", "locate", "abort_segment", "create_placement_group", "remove_placement_group", "get_placement_group", "placement_group_table", "get_actor_in", "state_query", "prefetch")
    REQ_ID_FIELD_NUMBER: _ClassVar[int]
    CREATE_SEGMENT_FIELD_NUMBER: _ClassVar[int]
    QUERY_FIELD_NUMBER: _ClassVar[int]
    CREATE_ACTOR_FIELD_NUMBER: _ClassVar[int]
    KILL_ACTOR_FIELD_NUMBER: _ClassVar[int]
    GET_ACTOR_FIELD_NUMBER: _ClassVar[int]
    LOCATE_FIELD_NUMBER: _ClassVar[int]
    ABORT_SEGMENT_FIELD_NUMBER: _ClassVar[int]
    CREATE_PLACEMENT_GROUP_FIELD_NUMBER: _ClassVar[int]
    REMOVE_PLACEMENT_GROUP_FIELD_NUMBER: _ClassVar[int]
    GET_PLACEMENT_GROUP_FIELD_NUMBER: _ClassVar[int]
    PLACEMENT_GROUP_TABLE_FIELD_NUMBER: _ClassVar[int]
    GET_ACTOR_IN_FIELD_NUMBER: _ClassVar[int]
    STATE_QUERY_FIELD_NUMBER: _ClassVar[int]
    PREFETCH_FIELD_NUMBER: _ClassVar[int]
    req_id: int
    create_segment: CreateSegment
    query: str
    create_actor: _types_pb2.Call
    kill_actor: KillActor
    get_actor: str
    locate: bytes
    abort_segment: str
    create_placement_group: PlacementGroupSpec
    remove_placement_group: bytes
    get_placement_group: str
    placement_group_table: bytes
    get_actor_in: ActorLookup
    state_query: StateQuery
    prefetch: Prefetch
    def __init__(self, req_id: _Optional[int] = ..., create_segment: _Optional[_Union[CreateSegment, _Mapping]] = ..., query: _Optional[str] = ..., create_actor: _Optional[_Union[_types_pb2.Call, _Mapping]] = ..., kill_actor: _Optional[_Union[KillActor, _Mapping]] = ..., get_actor: _Optional[str] = ..., locate: _Optional[bytes] = ..., abort_segment: _Optional[str] = ..., create_placement_group: _Optional[_Union[PlacementGroupSpec, _Mapping]] = ..., remove_placement_group: _Optional[bytes] = ..., get_placement_group: _Optional[str] = ..., placement_group_table: _Optional[bytes] = ..., get_actor_in: _Optional[_Union[ActorLookup, _Mapping]] = ..., state_query: _Optional[_Union[StateQuery, _Mapping]] = ..., prefetch: _Optional[_Union[Prefetch, _Mapping]] = ...) -> None: ...

class Prefetch(_message.Message):
    __slots__ = ("object_ids",)
    OBJECT_IDS_FIELD_NUMBER: _ClassVar[int]
    object_ids: _containers.RepeatedScalarFieldContainer[bytes]
    def __init__(self, object_ids: _Optional[_Iterable[bytes]] = ...) -> None: ...

class StateQuery(_message.Message):
    __slots__ = ("what", "filters_json", "limit", "detail")
    WHAT_FIELD_NUMBER: _ClassVar[int]
    FILTERS_JSON_FIELD_NUMBER: _ClassVar[int]
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    DETAIL_FIELD_NUMBER: _ClassVar[int]
    what: str
    filters_json: str
    limit: int
    detail: bool
    def __init__(self, what: _Optional[str] = ..., filters_json: _Optional[str] = ..., limit: _Optional[int] = ..., detail: _Optional[bool] = ...) -> None: ...

class ActorLookup(_message.Message):
    __slots__ = ("name", "namespace")
    NAME_FIELD_NUMBER: _ClassVar[int]
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    name: str
    namespace: str
    def __init__(self, name: _Optional[str] = ..., namespace: _Optional[str] = ...) -> None: ...

class PlacementGroupSpec(_message.Message):
    __slots__ = ("group_id", "bundles", "strategy", "name", "detached")
    GROUP_ID_FIELD_NUMBER: _ClassVar[int]
    BUNDLES_FIELD_NUMBER: _ClassVar[int]
    STRATEGY_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    DETACHED_FIELD_NUMBER: _ClassVar[int]
    group_id: bytes
    bundles: _containers.RepeatedCompositeFieldContainer[PlacementBundle]
    strategy: str
    name: str
    detached: bool
    def __init__(self, group_id: _Optional[bytes] = ..., bundles: _Optional[_Iterable[_Union[PlacementBundle, _Mapping]]] = ..., strategy: _Optional[str] = ..., name: _Optional[str] = ..., detached: _Optional[bool] = ...) -> None: ...

class PlacementBundle(_message.Message):
    __slots__ = ("resources",)
    class ResourcesEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    RESOURCES_FIELD_NUMBER: _ClassVar[int]
    resources: _containers.ScalarMap[str, float]
    def __init__(self, resources: _Optional[_Mapping[str, float]] = ...) -> None: ...

class PlacementGroupInfo(_message.Message):
    __slots__ = ("spec", "state", "bundle_nodes")
    SPEC_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    BUNDLE_NODES_FIELD_NUMBER: _ClassVar[int]
    spec: PlacementGroupSpec
    state: str
    bundle_nodes: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, spec: _Optional[_Union[PlacementGroupSpec, _Mapping]] = ..., state: _Optional[str] = ..., bundle_nodes: _Optional[_Iterable[int]] = ...) -> None: ...

class KillActor(_message.Message):
    __slots__ = ("actor_id", "no_restart", "reason")
    ACTOR_ID_FIELD_NUMBER: _ClassVar[int]
    NO_RESTART_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    actor_id: bytes
    no_restart: bool
    reason: str
    def __init__(self, actor_id: _Optional[bytes] = ..., no_restart: _Optional[bool] = ..., reason: _Optional[str] = ...) -> None: ...

class CreateSegment(_message.Message):
    __slots__ = ("object_id", "size", "holds_refs", "spares")
    OBJECT_ID_FIELD_NUMBER: _ClassVar[int]
    SIZE_FIELD_NUMBER: _ClassVar[int]
    HOLDS_REFS_FIELD_NUMBER: _ClassVar[int]
    SPARES_FIELD_NUMBER: _ClassVar[int]
    object_id: bytes
    size: int
    holds_refs: bool
    spares: int
    def __init__(self, object_id: _Optional[bytes] = ..., size: _Optional[int] = ..., holds_refs: _Optional[bool] = ..., spares: _Optional[int] = ...) -> None: ...

class Reply(_message.Message):
    __slots__ = ("req_id", "error", "error_kind", "segment", "resources", "debug", "actor", "object", "nodes", "placement_groups", "pending_tasks", "state_json", "spares")
    class ResourcesEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    REQ_ID_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    ERROR_KIND_FIELD_NUMBER: _ClassVar[int]
    SEGMENT_FIELD_NUMBER: _ClassVar[int]
    RESOURCES_FIELD_NUMBER: _ClassVar[int]
    DEBUG_FIELD_NUMBER: _ClassVar[int]
    ACTOR_FIELD_NUMBER: _ClassVar[int]
    OBJECT_FIELD_NUMBER: _ClassVar[int]
    NODES_FIELD_NUMBER: _ClassVar[int]
    PLACEMENT_GROUPS_FIELD_NUMBER: _ClassVar[int]
    PENDING_TASKS_FIELD_NUMBER: _ClassVar[int]
    STATE_JSON_FIELD_NUMBER: _ClassVar[int]
    SPARES_FIELD_NUMBER: _ClassVar[int]
    req_id: int
    error: str
    error_kind: str
    segment: _types_pb2.Segment
    resources: _containers.ScalarMap[str, float]
    debug: SchedulerDebugInfoReply
    actor: _types_pb2.ActorSpec
    object: _types_pb2.ObjectData
    nodes: _containers.RepeatedCompositeFieldContainer[NodeInfo]
    placement_groups: _containers.RepeatedCompositeFieldContainer[PlacementGroupInfo]
    pending_tasks: int
    state_json: str
    spares: _containers.RepeatedCompositeFieldContainer[_types_pb2.Segment]
    def __init__(self, req_id: _Optional[int] = ..., error: _Optional[str] = ..., error_kind: _Optional[str] = ..., segment: _Optional[_Union[_types_pb2.Segment, _Mapping]] = ..., resources: _Optional[_Mapping[str, float]] = ..., debug: _Optional[_Union[SchedulerDebugInfoReply, _Mapping]] = ..., actor: _Optional[_Union[_types_pb2.ActorSpec, _Mapping]] = ..., object: _Optional[_Union[_types_pb2.ObjectData, _Mapping]] = ..., nodes: _Optional[_Iterable[_Union[NodeInfo, _Mapping]]] = ..., placement_groups: _Optional[_Iterable[_Union[PlacementGroupInfo, _Mapping]]] = ..., pending_tasks: _Optional[int] = ..., state_json: _Optional[str] = ..., spares: _Optional[_Iterable[_Union[_types_pb2.Segment, _Mapping]]] = ...) -> None: ...

class TaskEventBatch(_message.Message):
    __slots__ = ("start_task_id", "start_name", "start_actor_id", "start_kind", "start_owner", "start_time", "end_task_id", "end_time", "end_error_type", "flush_id", "rss_bytes", "cpu_seconds", "error_task_id", "error_message", "error_traceback")
    START_TASK_ID_FIELD_NUMBER: _ClassVar[int]
    START_NAME_FIELD_NUMBER: _ClassVar[int]
    START_ACTOR_ID_FIELD_NUMBER: _ClassVar[int]
    START_KIND_FIELD_NUMBER: _ClassVar[int]
    START_OWNER_FIELD_NUMBER: _ClassVar[int]
    START_TIME_FIELD_NUMBER: _ClassVar[int]
    END_TASK_ID_FIELD_NUMBER: _ClassVar[int]
    END_TIME_FIELD_NUMBER: _ClassVar[int]
    END_ERROR_TYPE_FIELD_NUMBER: _ClassVar[int]
    FLUSH_ID_FIELD_NUMBER: _ClassVar[int]
    RSS_BYTES_FIELD_NUMBER: _ClassVar[int]
    CPU_SECONDS_FIELD_NUMBER: _ClassVar[int]
    ERROR_TASK_ID_FIELD_NUMBER: _ClassVar[int]
    ERROR_MESSAGE_FIELD_NUMBER: _ClassVar[int]
    ERROR_TRACEBACK_FIELD_NUMBER: _ClassVar[int]
    start_task_id: _containers.RepeatedScalarFieldContainer[bytes]
    start_name: _containers.RepeatedScalarFieldContainer[str]
    start_actor_id: _containers.RepeatedScalarFieldContainer[bytes]
    start_kind: _containers.RepeatedScalarFieldContainer[int]
    start_owner: _containers.RepeatedScalarFieldContainer[int]
    start_time: _containers.RepeatedScalarFieldContainer[float]
    end_task_id: _containers.RepeatedScalarFieldContainer[bytes]
    end_time: _containers.RepeatedScalarFieldContainer[float]
    end_error_type: _containers.RepeatedScalarFieldContainer[str]
    flush_id: int
    rss_bytes: int
    cpu_seconds: float
    error_task_id: _containers.RepeatedScalarFieldContainer[bytes]
    error_message: _containers.RepeatedScalarFieldContainer[str]
    error_traceback: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, start_task_id: _Optional[_Iterable[bytes]] = ..., start_name: _Optional[_Iterable[str]] = ..., start_actor_id: _Optional[_Iterable[bytes]] = ..., start_kind: _Optional[_Iterable[int]] = ..., start_owner: _Optional[_Iterable[int]] = ..., start_time: _Optional[_Iterable[float]] = ..., end_task_id: _Optional[_Iterable[bytes]] = ..., end_time: _Optional[_Iterable[float]] = ..., end_error_type: _Optional[_Iterable[str]] = ..., flush_id: _Optional[int] = ..., rss_bytes: _Optional[int] = ..., cpu_seconds: _Optional[float] = ..., error_task_id: _Optional[_Iterable[bytes]] = ..., error_message: _Optional[_Iterable[str]] = ..., error_traceback: _Optional[_Iterable[str]] = ...) -> None: ...

class MetricPoint(_message.Message):
    __slots__ = ("name", "kind", "description", "tag_keys", "tag_values", "value", "boundaries", "buckets")
    NAME_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    DESCRIPTION_FIELD_NUMBER: _ClassVar[int]
    TAG_KEYS_FIELD_NUMBER: _ClassVar[int]
    TAG_VALUES_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    BOUNDARIES_FIELD_NUMBER: _ClassVar[int]
    BUCKETS_FIELD_NUMBER: _ClassVar[int]
    name: str
    kind: int
    description: str
    tag_keys: _containers.RepeatedScalarFieldContainer[str]
    tag_values: _containers.RepeatedScalarFieldContainer[str]
    value: float
    boundaries: _containers.RepeatedScalarFieldContainer[float]
    buckets: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, name: _Optional[str] = ..., kind: _Optional[int] = ..., description: _Optional[str] = ..., tag_keys: _Optional[_Iterable[str]] = ..., tag_values: _Optional[_Iterable[str]] = ..., value: _Optional[float] = ..., boundaries: _Optional[_Iterable[float]] = ..., buckets: _Optional[_Iterable[int]] = ...) -> None: ...

class MetricsBatch(_message.Message):
    __slots__ = ("points",)
    POINTS_FIELD_NUMBER: _ClassVar[int]
    points: _containers.RepeatedCompositeFieldContainer[MetricPoint]
    def __init__(self, points: _Optional[_Iterable[_Union[MetricPoint, _Mapping]]] = ...) -> None: ...

class TaskEventFlush(_message.Message):
    __slots__ = ("flush_id",)
    FLUSH_ID_FIELD_NUMBER: _ClassVar[int]
    flush_id: int
    def __init__(self, flush_id: _Optional[int] = ...) -> None: ...

class WorkerAddress(_message.Message):
    __slots__ = ("address",)
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    address: str
    def __init__(self, address: _Optional[str] = ...) -> None: ...

class NodeInfo(_message.Message):
    __slots__ = ("node_id", "alive", "address", "resources", "available", "store_capacity", "store_used", "pid", "death", "spilled_bytes")
    class ResourcesEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    class AvailableEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    ALIVE_FIELD_NUMBER: _ClassVar[int]
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    RESOURCES_FIELD_NUMBER: _ClassVar[int]
    AVAILABLE_FIELD_NUMBER: _ClassVar[int]
    STORE_CAPACITY_FIELD_NUMBER: _ClassVar[int]
    STORE_USED_FIELD_NUMBER: _ClassVar[int]
    PID_FIELD_NUMBER: _ClassVar[int]
    DEATH_FIELD_NUMBER: _ClassVar[int]
    SPILLED_BYTES_FIELD_NUMBER: _ClassVar[int]
    node_id: int
    alive: bool
    address: str
    resources: _containers.ScalarMap[str, float]
    available: _containers.ScalarMap[str, float]
    store_capacity: int
    store_used: int
    pid: int
    death: str
    spilled_bytes: int
    def __init__(self, node_id: _Optional[int] = ..., alive: _Optional[bool] = ..., address: _Optional[str] = ..., resources: _Optional[_Mapping[str, float]] = ..., available: _Optional[_Mapping[str, float]] = ..., store_capacity: _Optional[int] = ..., store_used: _Optional[int] = ..., pid: _Optional[int] = ..., death: _Optional[str] = ..., spilled_bytes: _Optional[int] = ...) -> None: ...

class NodeCommand(_message.Message):
    __slots__ = ("seal", "pin", "unpin", "free_segment", "abort_segment", "drop_conn", "create_segment", "start_worker", "kill_worker", "stop_worker", "worker_connected", "worker_disconnected", "set_driver", "cluster_idle", "close", "sync", "pull", "welcome", "heartbeat", "seal_object")
    SEAL_FIELD_NUMBER: _ClassVar[int]
    PIN_FIELD_NUMBER: _ClassVar[int]
    UNPIN_FIELD_NUMBER: _ClassVar[int]
    FREE_SEGMENT_FIELD_NUMBER: _ClassVar[int]
    ABORT_SEGMENT_FIELD_NUMBER: _ClassVar[int]
    DROP_CONN_FIELD_NUMBER: _ClassVar[int]
    CREATE_SEGMENT_FIELD_NUMBER: _ClassVar[int]
    START_WORKER_FIELD_NUMBER: _ClassVar[int]
    KILL_WORKER_FIELD_NUMBER: _ClassVar[int]
    STOP_WORKER_FIELD_NUMBER: _ClassVar[int]
    WORKER_CONNECTED_FIELD_NUMBER: _ClassVar[int]
    WORKER_DISCONNECTED_FIELD_NUMBER: _ClassVar[int]
    SET_DRIVER_FIELD_NUMBER: _ClassVar[int]
    CLUSTER_IDLE_FIELD_NUMBER: _ClassVar[int]
    CLOSE_FIELD_NUMBER: _ClassVar[int]
    SYNC_FIELD_NUMBER: _ClassVar[int]
    PULL_FIELD_NUMBER: _ClassVar[int]
    WELCOME_FIELD_NUMBER: _ClassVar[int]
    HEARTBEAT_FIELD_NUMBER: _ClassVar[int]
    SEAL_OBJECT_FIELD_NUMBER: _ClassVar[int]
    seal: str
    pin: NodeSegments
    unpin: NodeSegments
    free_segment: str
    abort_segment: NodeSegments
    drop_conn: int
    create_segment: NodeCreateSegment
    start_worker: int
    kill_worker: NodeKillWorker
    stop_worker: int
    worker_connected: int
    worker_disconnected: int
    set_driver: int
    cluster_idle: bool
    close: bool
    sync: int
    pull: NodePull
    welcome: NodeWelcome
    heartbeat: bool
    seal_object: NodeRelocate
    def __init__(self, seal: _Optional[str] = ..., pin: _Optional[_Union[NodeSegments, _Mapping]] = ..., unpin: _Optional[_Union[NodeSegments, _Mapping]] = ..., free_segment: _Optional[str] = ..., abort_segment: _Optional[_Union[NodeSegments, _Mapping]] = ..., drop_conn: _Optional[int] = ..., create_segment: _Optional[_Union[NodeCreateSegment, _Mapping]] = ..., start_worker: _Optional[int] = ..., kill_worker: _Optional[_Union[NodeKillWorker, _Mapping]] = ..., stop_worker: _Optional[int] = ..., worker_connected: _Optional[int] = ..., worker_disconnected: _Optional[int] = ..., set_driver: _Optional[int] = ..., cluster_idle: _Optional[bool] = ..., close: _Optional[bool] = ..., sync: _Optional[int] = ..., pull: _Optional[_Union[NodePull, _Mapping]] = ..., welcome: _Optional[_Union[NodeWelcome, _Mapping]] = ..., heartbeat: _Optional[bool] = ..., seal_object: _Optional[_Union[NodeRelocate, _Mapping]] = ...) -> None: ...

class NodePull(_message.Message):
    __slots__ = ("object_id", "address", "key", "size")
    OBJECT_ID_FIELD_NUMBER: _ClassVar[int]
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    KEY_FIELD_NUMBER: _ClassVar[int]
    SIZE_FIELD_NUMBER: _ClassVar[int]
    object_id: bytes
    address: str
    key: str
    size: int
    def __init__(self, object_id: _Optional[bytes] = ..., address: _Optional[str] = ..., key: _Optional[str] = ..., size: _Optional[int] = ...) -> None: ...

class NodePulled(_message.Message):
    __slots__ = ("object_id", "segment", "error")
    OBJECT_ID_FIELD_NUMBER: _ClassVar[int]
    SEGMENT_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    object_id: bytes
    segment: _types_pb2.Segment
    error: str
    def __init__(self, object_id: _Optional[bytes] = ..., segment: _Optional[_Union[_types_pb2.Segment, _Mapping]] = ..., error: _Optional[str] = ...) -> None: ...

class NodeWelcome(_message.Message):
    __slots__ = ("node_id", "session_id", "inline_threshold", "heartbeat_s", "timeout_s")
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    INLINE_THRESHOLD_FIELD_NUMBER: _ClassVar[int]
    HEARTBEAT_S_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_S_FIELD_NUMBER: _ClassVar[int]
    node_id: int
    session_id: str
    inline_threshold: int
    heartbeat_s: float
    timeout_s: float
    def __init__(self, node_id: _Optional[int] = ..., session_id: _Optional[str] = ..., inline_threshold: _Optional[int] = ..., heartbeat_s: _Optional[float] = ..., timeout_s: _Optional[float] = ...) -> None: ...

class NodeSegments(_message.Message):
    __slots__ = ("conn_id", "names")
    CONN_ID_FIELD_NUMBER: _ClassVar[int]
    NAMES_FIELD_NUMBER: _ClassVar[int]
    conn_id: int
    names: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, conn_id: _Optional[int] = ..., names: _Optional[_Iterable[str]] = ...) -> None: ...

class NodeCreateSegment(_message.Message):
    __slots__ = ("conn_id", "request")
    CONN_ID_FIELD_NUMBER: _ClassVar[int]
    REQUEST_FIELD_NUMBER: _ClassVar[int]
    conn_id: int
    request: Request
    def __init__(self, conn_id: _Optional[int] = ..., request: _Optional[_Union[Request, _Mapping]] = ...) -> None: ...

class NodeKillWorker(_message.Message):
    __slots__ = ("worker_id", "reason")
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    worker_id: int
    reason: str
    def __init__(self, worker_id: _Optional[int] = ..., reason: _Optional[str] = ...) -> None: ...

class NodeEvent(_message.Message):
    __slots__ = ("register", "send", "worker_failed_to_start", "worker_exited", "relocate", "store_info", "synced", "pulled", "join", "heartbeat", "memory_pressure")
    REGISTER_FIELD_NUMBER: _ClassVar[int]
    SEND_FIELD_NUMBER: _ClassVar[int]
    WORKER_FAILED_TO_START_FIELD_NUMBER: _ClassVar[int]
    WORKER_EXITED_FIELD_NUMBER: _ClassVar[int]
    RELOCATE_FIELD_NUMBER: _ClassVar[int]
    STORE_INFO_FIELD_NUMBER: _ClassVar[int]
    SYNCED_FIELD_NUMBER: _ClassVar[int]
    PULLED_FIELD_NUMBER: _ClassVar[int]
    JOIN_FIELD_NUMBER: _ClassVar[int]
    HEARTBEAT_FIELD_NUMBER: _ClassVar[int]
    MEMORY_PRESSURE_FIELD_NUMBER: _ClassVar[int]
    register: NodeRegister
    send: NodeSend
    worker_failed_to_start: NodeWorkerExit
    worker_exited: NodeWorkerExit
    relocate: NodeRelocate
    store_info: ObjStoreDebugInfoReply
    synced: int
    pulled: NodePulled
    join: NodeJoin
    heartbeat: bool
    memory_pressure: NodeMemoryPressure
    def __init__(self, register: _Optional[_Union[NodeRegister, _Mapping]] = ..., send: _Optional[_Union[NodeSend, _Mapping]] = ..., worker_failed_to_start: _Optional[_Union[NodeWorkerExit, _Mapping]] = ..., worker_exited: _Optional[_Union[NodeWorkerExit, _Mapping]] = ..., relocate: _Optional[_Union[NodeRelocate, _Mapping]] = ..., store_info: _Optional[_Union[ObjStoreDebugInfoReply, _Mapping]] = ..., synced: _Optional[int] = ..., pulled: _Optional[_Union[NodePulled, _Mapping]] = ..., join: _Optional[_Union[NodeJoin, _Mapping]] = ..., heartbeat: _Optional[bool] = ..., memory_pressure: _Optional[_Union[NodeMemoryPressure, _Mapping]] = ...) -> None: ...

class NodeMemoryPressure(_message.Message):
    __slots__ = ("used", "limit", "threshold", "where", "workers")
    class WorkersEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: int
        value: int
        def __init__(self, key: _Optional[int] = ..., value: _Optional[int] = ...) -> None: ...
    USED_FIELD_NUMBER: _ClassVar[int]
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    THRESHOLD_FIELD_NUMBER: _ClassVar[int]
    WHERE_FIELD_NUMBER: _ClassVar[int]
    WORKERS_FIELD_NUMBER: _ClassVar[int]
    used: int
    limit: int
    threshold: float
    where: str
    workers: _containers.ScalarMap[int, int]
    def __init__(self, used: _Optional[int] = ..., limit: _Optional[int] = ..., threshold: _Optional[float] = ..., where: _Optional[str] = ..., workers: _Optional[_Mapping[int, int]] = ...) -> None: ...

class NodeJoin(_message.Message):
    __slots__ = ("resources", "machine", "host", "pid", "num_workers", "node_id")
    class ResourcesEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    RESOURCES_FIELD_NUMBER: _ClassVar[int]
    MACHINE_FIELD_NUMBER: _ClassVar[int]
    HOST_FIELD_NUMBER: _ClassVar[int]
    PID_FIELD_NUMBER: _ClassVar[int]
    NUM_WORKERS_FIELD_NUMBER: _ClassVar[int]
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    resources: _containers.ScalarMap[str, float]
    machine: str
    host: str
    pid: int
    num_workers: int
    node_id: int
    def __init__(self, resources: _Optional[_Mapping[str, float]] = ..., machine: _Optional[str] = ..., host: _Optional[str] = ..., pid: _Optional[int] = ..., num_workers: _Optional[int] = ..., node_id: _Optional[int] = ...) -> None: ...

class NodeRegister(_message.Message):
    __slots__ = ("node_id", "resources", "capacity", "shm_dir", "pid", "data_address", "node_dir", "machine", "num_workers", "kept", "kept_workers")
    class ResourcesEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    RESOURCES_FIELD_NUMBER: _ClassVar[int]
    CAPACITY_FIELD_NUMBER: _ClassVar[int]
    SHM_DIR_FIELD_NUMBER: _ClassVar[int]
    PID_FIELD_NUMBER: _ClassVar[int]
    DATA_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    NODE_DIR_FIELD_NUMBER: _ClassVar[int]
    MACHINE_FIELD_NUMBER: _ClassVar[int]
    NUM_WORKERS_FIELD_NUMBER: _ClassVar[int]
    KEPT_FIELD_NUMBER: _ClassVar[int]
    KEPT_WORKERS_FIELD_NUMBER: _ClassVar[int]
    node_id: int
    resources: _containers.ScalarMap[str, float]
    capacity: int
    shm_dir: str
    pid: int
    data_address: str
    node_dir: str
    machine: str
    num_workers: int
    kept: _containers.RepeatedCompositeFieldContainer[_types_pb2.ObjectData]
    kept_workers: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, node_id: _Optional[int] = ..., resources: _Optional[_Mapping[str, float]] = ..., capacity: _Optional[int] = ..., shm_dir: _Optional[str] = ..., pid: _Optional[int] = ..., data_address: _Optional[str] = ..., node_dir: _Optional[str] = ..., machine: _Optional[str] = ..., num_workers: _Optional[int] = ..., kept: _Optional[_Iterable[_Union[_types_pb2.ObjectData, _Mapping]]] = ..., kept_workers: _Optional[_Iterable[int]] = ...) -> None: ...

class NodeSend(_message.Message):
    __slots__ = ("conn_id", "kind", "body")
    CONN_ID_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    BODY_FIELD_NUMBER: _ClassVar[int]
    conn_id: int
    kind: int
    body: bytes
    def __init__(self, conn_id: _Optional[int] = ..., kind: _Optional[int] = ..., body: _Optional[bytes] = ...) -> None: ...

class NodeWorkerExit(_message.Message):
    __slots__ = ("worker_id", "reason", "connected")
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    CONNECTED_FIELD_NUMBER: _ClassVar[int]
    worker_id: int
    reason: str
    connected: bool
    def __init__(self, worker_id: _Optional[int] = ..., reason: _Optional[str] = ..., connected: _Optional[bool] = ...) -> None: ...

class NodeRelocate(_message.Message):
    __slots__ = ("object_id", "segment")
    OBJECT_ID_FIELD_NUMBER: _ClassVar[int]
    SEGMENT_FIELD_NUMBER: _ClassVar[int]
    object_id: bytes
    segment: _types_pb2.Segment
    def __init__(self, object_id: _Optional[bytes] = ..., segment: _Optional[_Union[_types_pb2.Segment, _Mapping]] = ...) -> None: ...

class GeneratorItem(_message.Message):
    __slots__ = ("task_id", "index", "data", "owner")
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    INDEX_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    OWNER_FIELD_NUMBER: _ClassVar[int]
    task_id: bytes
    index: int
    data: _types_pb2.ObjectData
    owner: int
    def __init__(self, task_id: _Optional[bytes] = ..., index: _Optional[int] = ..., data: _Optional[_Union[_types_pb2.ObjectData, _Mapping]] = ..., owner: _Optional[int] = ...) -> None: ...

class GeneratorAck(_message.Message):
    __slots__ = ("task_id", "consumed")
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    CONSUMED_FIELD_NUMBER: _ClassVar[int]
    task_id: bytes
    consumed: int
    def __init__(self, task_id: _Optional[bytes] = ..., consumed: _Optional[int] = ...) -> None: ...

class LogChunk(_message.Message):
    __slots__ = ("job", "stream", "name", "pid", "ip", "lines")
    JOB_FIELD_NUMBER: _ClassVar[int]
    STREAM_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    PID_FIELD_NUMBER: _ClassVar[int]
    IP_FIELD_NUMBER: _ClassVar[int]
    LINES_FIELD_NUMBER: _ClassVar[int]
    job: int
    stream: int
    name: str
    pid: int
    ip: str
    lines: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, job: _Optional[int] = ..., stream: _Optional[int] = ..., name: _Optional[str] = ..., pid: _Optional[int] = ..., ip: _Optional[str] = ..., lines: _Optional[_Iterable[str]] = ...) -> None: ...

class LogLines(_message.Message):
    __slots__ = ("chunks",)
    CHUNKS_FIELD_NUMBER: _ClassVar[int]
    chunks: _containers.RepeatedCompositeFieldContainer[LogChunk]
    def __init__(self, chunks: _Optional[_Iterable[_Union[LogChunk, _Mapping]]] = ...) -> None: ...

class LogFlush(_message.Message):
    __slots__ = ("seq",)
    SEQ_FIELD_NUMBER: _ClassVar[int]
    seq: int
    def __init__(self, seq: _Optional[int] = ...) -> None: ...
