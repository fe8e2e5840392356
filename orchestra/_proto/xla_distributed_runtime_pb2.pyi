from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class DeviceProto(_message.Message):
    __slots__ = ("local_device_ordinal", "name", "vendor", "global_device_id")
    LOCAL_DEVICE_ORDINAL_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    VENDOR_FIELD_NUMBER: _ClassVar[int]
    GLOBAL_DEVICE_ID_FIELD_NUMBER: _ClassVar[int]
    local_device_ordinal: int
    name: str
    vendor: str
    global_device_id: int
    def __init__(self, local_device_ordinal: _Optional[int] = ..., name: _Optional[str] = ..., vendor: _Optional[str] = ..., global_device_id: _Optional[int] = ...) -> None: ...

class LocalTopologyProto(_message.Message):
    __slots__ = ("node_id", "devices")
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    DEVICES_FIELD_NUMBER: _ClassVar[int]
    node_id: int
    devices: _containers.RepeatedCompositeFieldContainer[DeviceProto]
    def __init__(self, node_id: _Optional[int] = ..., devices: _Optional[_Iterable[_Union[DeviceProto, _Mapping]]] = ...) -> None: ...

class GlobalTopologyProto(_message.Message):
    __slots__ = ("nodes",)
    NODES_FIELD_NUMBER: _ClassVar[int]
    nodes: _containers.RepeatedCompositeFieldContainer[LocalTopologyProto]
    def __init__(self, nodes: _Optional[_Iterable[_Union[LocalTopologyProto, _Mapping]]] = ...) -> None: ...

class ConnectRequest(_message.Message):
    __slots__ = ("protocol_version", "timeout_milliseconds", "node_id", "client_id")
    PROTOCOL_VERSION_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_MILLISECONDS_FIELD_NUMBER: _ClassVar[int]
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    CLIENT_ID_FIELD_NUMBER: _ClassVar[int]
    protocol_version: int
    timeout_milliseconds: int
    node_id: int
    client_id: int
    def __init__(self, protocol_version: _Optional[int] = ..., timeout_milliseconds: _Optional[int] = ..., node_id: _Optional[int] = ..., client_id: _Optional[int] = ...) -> None: ...

class ConnectResponse(_message.Message):
    __slots__ = ("session_id",)
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    session_id: int
    def __init__(self, session_id: _Optional[int] = ...) -> None: ...

class EnumerateDevicesRequest(_message.Message):
    __slots__ = ("session_id", "local_topology")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    LOCAL_TOPOLOGY_FIELD_NUMBER: _ClassVar[int]
    session_id: int
    local_topology: LocalTopologyProto
    def __init__(self, session_id: _Optional[int] = ..., local_topology: _Optional[_Union[LocalTopologyProto, _Mapping]] = ...) -> None: ...

class EnumerateDevicesResponse(_message.Message):
    __slots__ = ("global_topology",)
    GLOBAL_TOPOLOGY_FIELD_NUMBER: _ClassVar[int]
    global_topology: GlobalTopologyProto
    def __init__(self, global_topology: _Optional[_Union[GlobalTopologyProto, _Mapping]] = ...) -> None: ...

class KeyValueGetRequest(_message.Message):
    __slots__ = ("session_id", "key", "timeout_milliseconds")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    KEY_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_MILLISECONDS_FIELD_NUMBER: _ClassVar[int]
    session_id: int
    key: bytes
    timeout_milliseconds: int
    def __init__(self, session_id: _Optional[int] = ..., key: _Optional[bytes] = ..., timeout_milliseconds: _Optional[int] = ...) -> None: ...

class KeyValueGetResponse(_message.Message):
    __slots__ = ("found", "value")
    FOUND_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    found: bool
    value: bytes
    def __init__(self, found: _Optional[bool] = ..., value: _Optional[bytes] = ...) -> None: ...

class KeyValueSetRequest(_message.Message):
    __slots__ = ("session_id", "key", "value")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    KEY_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    session_id: int
    key: bytes
    value: bytes
    def __init__(self, session_id: _Optional[int] = ..., key: _Optional[bytes] = ..., value: _Optional[bytes] = ...) -> None: ...

class KeyValueSetResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class HeartbeatRequest(_message.Message):
    __slots__ = ("session_id", "node_id")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    session_id: int
    node_id: int
    def __init__(self, session_id: _Optional[int] = ..., node_id: _Optional[int] = ...) -> None: ...

class HeartbeatResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ShutdownRequest(_message.Message):
    __slots__ = ("session_id", "node_id")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    session_id: int
    node_id: int
    def __init__(self, session_id: _Optional[int] = ..., node_id: _Optional[int] = ...) -> None: ...

class ShutdownResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...
