"""A call's arguments encoded for the wire, for the client (client.py): refs passed as
refs, small values inline, large ones put into the object store first; refs pickled
inside values registered with the head before the call leaves (escape).

    args, kwargs -> each: an ObjectRef -> its id | serialize -> inline (small) or put
        (large: a ref) -> _protocol/codec.call(template, task id, values) + the job
"""
from __future__ import annotations

import itertools
from collections.abc import Iterable, Sequence
from typing import Any, Protocol

from .._objects.serialization import Serialized, serialize
from .._protocol import codec as _codec
from .._protocol import pb
from .object_ref import ObjectRef, RefCounter


class Putter(Protocol):
    """What encoding uses of the client's values (values.Values)."""

    def put_serialized(self, ser: Serialized) -> ObjectRef: ...


class Encoder(RefCounter, Protocol):
    """What encoding uses of the client (client.CoreClient)."""

    inline_threshold: int
    job_suffix: bytes
    _keep_until_sent: list[ObjectRef]

    @property
    def values(self) -> Putter: ...
    def escape(self, ids: Iterable[bytes]) -> None: ...


def encode_call(client: Encoder, template: bytes, tid: bytes, args: Sequence[Any],
                kwargs: dict[str, Any], refs: list[ObjectRef],
                hold: list[ObjectRef] | None = None) -> bytes:
    """A serialized Call; ``refs`` gets the ref arguments in order (with the puts made for
    large values), which must live until the call is sent; ``hold`` gets refs to those
    pickled inside the arguments."""
    if not args and not kwargs:
        return _codec.call(template, tid) + client.job_suffix
    nested: list[bytes] = []
    values = [_arg_value(client, v, refs, nested) for v in itertools.chain(args, kwargs.values())]
    call = _codec.call(template, tid, values, kwargs, nested) + client.job_suffix
    if nested:
        client.escape(nested)
        if hold is not None:
            hold.extend(ObjectRef(oid, client) for oid in nested)
    return call


def build_call(client: Encoder, tid: bytes, function_id: bytes, args: Sequence[Any],
               kwargs: dict[str, Any], *, num_returns: int, resources: dict[str, float],
               name: str) -> pb.Call:
    """A parsed Call (for requests that carry one, like actor creation); its large
    arguments stay alive until the client's next request is sent."""
    template = pb.Call(function_id=function_id, num_returns=num_returns, resources=resources,
                       name=name).SerializeToString()
    refs: list[ObjectRef] = []
    call = pb.Call.FromString(encode_call(client, template, tid, args, kwargs, refs))
    client.escape([r._id for r in refs])
    client._keep_until_sent = refs
    return call


def _arg_value(client: Encoder, value: object, refs: list[ObjectRef], nested: list[bytes]) -> bytes:
    if type(value) is ObjectRef:
        refs.append(value)
        return _codec.ref_value(value._id)
    ser = serialize(value)
    if ser.size > client.inline_threshold:
        ref = client.values.put_serialized(ser)
        refs.append(ref)
        return _codec.ref_value(ref._id)
    nested.extend(ser.contained)
    return _codec.inline_value(ser.to_bytes())
