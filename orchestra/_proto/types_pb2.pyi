from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Segment(_message.Message):
    __slots__ = ("name", "size", "node_id", "capacity", "reused", "path", "allocated")
    NAME_FIELD_NUMBER: _ClassVar[int]
    SIZE_FIELD_NUMBER: _ClassVar[int]
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    CAPACITY_FIELD_NUMBER: _ClassVar[int]
    REUSED_FIELD_NUMBER: _ClassVar[int]
    PATH_FIELD_NUMBER: _ClassVar[int]
    ALLOCATED_FIELD_NUMBER: _ClassVar[int]
    name: str
    size: int
    node_id: int
    capacity: int
    reused: bool
    path: str
    allocated: int
    def __init__(self, name: _Optional[str] = ..., size: _Optional[int] = ..., node_id: _Optional[int] = ..., capacity: _Optional[int] = ..., reused: _Optional[bool] = ..., path: _Optional[str] = ..., allocated: _Optional[int] = ...) -> None: ...

class Value(_message.Message):
    __slots__ = ("ref", "inline")
    REF_FIELD_NUMBER: _ClassVar[int]
    INLINE_FIELD_NUMBER: _ClassVar[int]
    ref: bytes
    inline: bytes
    def __init__(self, ref: _Optional[bytes] = ..., inline: _Optional[bytes] = ...) -> None: ...

class ObjectData(_message.Message):
    __slots__ = ("object_id", "inline", "segment", "error", "contained")
    OBJECT_ID_FIELD_NUMBER: _ClassVar[int]
    INLINE_FIELD_NUMBER: _ClassVar[int]
    SEGMENT_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    CONTAINED_FIELD_NUMBER: _ClassVar[int]
    object_id: bytes
    inline: bytes
    segment: Segment
    error: bytes
    contained: _containers.RepeatedScalarFieldContainer[bytes]
    def __init__(self, object_id: _Optional[bytes] = ..., inline: _Optional[bytes] = ..., segment: _Optional[_Union[Segment, _Mapping]] = ..., error: _Optional[bytes] = ..., contained: _Optional[_Iterable[bytes]] = ...) -> None: ...

class Call(_message.Message):
    __slots__ = ("task_id", "function_id", "args", "kwarg_names", "num_returns", "resources", "max_retries", "name", "nested", "retry_exceptions", "actor", "actor_id", "method", "retry_on", "placement", "generator", "generator_backpressure", "max_calls", "runtime_env", "job")
    class ResourcesEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    FUNCTION_ID_FIELD_NUMBER: _ClassVar[int]
    ARGS_FIELD_NUMBER: _ClassVar[int]
    KWARG_NAMES_FIELD_NUMBER: _ClassVar[int]
    NUM_RETURNS_FIELD_NUMBER: _ClassVar[int]
    RESOURCES_FIELD_NUMBER: _ClassVar[int]
    MAX_RETRIES_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    NESTED_FIELD_NUMBER: _ClassVar[int]
    RETRY_EXCEPTIONS_FIELD_NUMBER: _ClassVar[int]
    ACTOR_FIELD_NUMBER: _ClassVar[int]
    ACTOR_ID_FIELD_NUMBER: _ClassVar[int]
    METHOD_FIELD_NUMBER: _ClassVar[int]
    RETRY_ON_FIELD_NUMBER: _ClassVar[int]
    PLACEMENT_FIELD_NUMBER: _ClassVar[int]
    GENERATOR_FIELD_NUMBER: _ClassVar[int]
    GENERATOR_BACKPRESSURE_FIELD_NUMBER: _ClassVar[int]
    MAX_CALLS_FIELD_NUMBER: _ClassVar[int]
    RUNTIME_ENV_FIELD_NUMBER: _ClassVar[int]
    JOB_FIELD_NUMBER: _ClassVar[int]
    task_id: bytes
    function_id: bytes
    args: _containers.RepeatedCompositeFieldContainer[Value]
    kwarg_names: _containers.RepeatedScalarFieldContainer[str]
    num_returns: int
    resources: _containers.ScalarMap[str, float]
    max_retries: int
    name: str
    nested: _containers.RepeatedScalarFieldContainer[bytes]
    retry_exceptions: bool
    actor: ActorSpec
    actor_id: bytes
    method: str
    retry_on: bytes
    placement: Placement
    generator: int
    generator_backpressure: int
    max_calls: int
    runtime_env: RuntimeEnvSpec
    job: int
    def __init__(self, task_id: _Optional[bytes] = ..., function_id: _Optional[bytes] = ..., args: _Optional[_Iterable[_Union[Value, _Mapping]]] = ..., kwarg_names: _Optional[_Iterable[str]] = ..., num_returns: _Optional[int] = ..., resources: _Optional[_Mapping[str, float]] = ..., max_retries: _Optional[int] = ..., name: _Optional[str] = ..., nested: _Optional[_Iterable[bytes]] = ..., retry_exceptions: _Optional[bool] = ..., actor: _Optional[_Union[ActorSpec, _Mapping]] = ..., actor_id: _Optional[bytes] = ..., method: _Optional[str] = ..., retry_on: _Optional[bytes] = ..., placement: _Optional[_Union[Placement, _Mapping]] = ..., generator: _Optional[int] = ..., generator_backpressure: _Optional[int] = ..., max_calls: _Optional[int] = ..., runtime_env: _Optional[_Union[RuntimeEnvSpec, _Mapping]] = ..., job: _Optional[int] = ...) -> None: ...

class RuntimeEnvSpec(_message.Message):
    __slots__ = ("env_vars", "working_dir", "py_modules", "setup_hook")
    class EnvVarsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    ENV_VARS_FIELD_NUMBER: _ClassVar[int]
    WORKING_DIR_FIELD_NUMBER: _ClassVar[int]
    PY_MODULES_FIELD_NUMBER: _ClassVar[int]
    SETUP_HOOK_FIELD_NUMBER: _ClassVar[int]
    env_vars: _containers.ScalarMap[str, str]
    working_dir: str
    py_modules: _containers.RepeatedScalarFieldContainer[str]
    setup_hook: bytes
    def __init__(self, env_vars: _Optional[_Mapping[str, str]] = ..., working_dir: _Optional[str] = ..., py_modules: _Optional[_Iterable[str]] = ..., setup_hook: _Optional[bytes] = ...) -> None: ...

class Placement(_message.Message):
    __slots__ = ("strategy", "node_id", "soft", "group_id", "bundle_index", "capture_child_tasks")
    STRATEGY_FIELD_NUMBER: _ClassVar[int]
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    SOFT_FIELD_NUMBER: _ClassVar[int]
    GROUP_ID_FIELD_NUMBER: _ClassVar[int]
    BUNDLE_INDEX_FIELD_NUMBER: _ClassVar[int]
    CAPTURE_CHILD_TASKS_FIELD_NUMBER: _ClassVar[int]
    strategy: str
    node_id: int
    soft: bool
    group_id: bytes
    bundle_index: int
    capture_child_tasks: bool
    def __init__(self, strategy: _Optional[str] = ..., node_id: _Optional[int] = ..., soft: _Optional[bool] = ..., group_id: _Optional[bytes] = ..., bundle_index: _Optional[int] = ..., capture_child_tasks: _Optional[bool] = ...) -> None: ...

class ActorSpec(_message.Message):
    __slots__ = ("actor_id", "name", "max_restarts", "max_concurrency", "is_async", "methods", "class_name", "generator_methods", "namespace", "get_if_exists", "detached", "max_task_retries", "method_num_returns", "restart_count")
    class MethodNumReturnsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    ACTOR_ID_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    MAX_RESTARTS_FIELD_NUMBER: _ClassVar[int]
    MAX_CONCURRENCY_FIELD_NUMBER: _ClassVar[int]
    IS_ASYNC_FIELD_NUMBER: _ClassVar[int]
    METHODS_FIELD_NUMBER: _ClassVar[int]
    CLASS_NAME_FIELD_NUMBER: _ClassVar[int]
    GENERATOR_METHODS_FIELD_NUMBER: _ClassVar[int]
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    GET_IF_EXISTS_FIELD_NUMBER: _ClassVar[int]
    DETACHED_FIELD_NUMBER: _ClassVar[int]
    MAX_TASK_RETRIES_FIELD_NUMBER: _ClassVar[int]
    METHOD_NUM_RETURNS_FIELD_NUMBER: _ClassVar[int]
    RESTART_COUNT_FIELD_NUMBER: _ClassVar[int]
    actor_id: bytes
    name: str
    max_restarts: int
    max_concurrency: int
    is_async: bool
    methods: _containers.RepeatedScalarFieldContainer[str]
    class_name: str
    generator_methods: _containers.RepeatedScalarFieldContainer[str]
    namespace: str
    get_if_exists: bool
    detached: bool
    max_task_retries: int
    method_num_returns: _containers.ScalarMap[str, int]
    restart_count: int
    def __init__(self, actor_id: _Optional[bytes] = ..., name: _Optional[str] = ..., max_restarts: _Optional[int] = ..., max_concurrency: _Optional[int] = ..., is_async: _Optional[bool] = ..., methods: _Optional[_Iterable[str]] = ..., class_name: _Optional[str] = ..., generator_methods: _Optional[_Iterable[str]] = ..., namespace: _Optional[str] = ..., get_if_exists: _Optional[bool] = ..., detached: _Optional[bool] = ..., max_task_retries: _Optional[int] = ..., method_num_returns: _Optional[_Mapping[str, int]] = ..., restart_count: _Optional[int] = ...) -> None: ...
