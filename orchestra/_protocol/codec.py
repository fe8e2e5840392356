"""Hand-encoded protobuf: the few messages built on the hot path without protobuf's objects.

    submit()/actor call --Call template + task id + args--> call bytes
        --submit_frame--> SUBMIT frame to the head
        --execute_frame--> EXECUTE frame straight to a worker (direct calls)

Building a ``pb.Call`` and serializing it costs ~10 us of Python per task; concatenating
bytes costs ~1 us. Protobuf's encoding makes this safe: a message is a sequence of
fields, fields may come in any order, and the concatenation of two encodings of one
message type is the encoding of their merge. So a function's fixed fields are serialized
once (the template, by protobuf) and each call appends its own fields.

Every encoding here depends on field numbers of protos/orchestra/_proto/{types,orchestra}.proto;
those fields are marked "hand-encoded in orchestra/_protocol/codec.py" there, and
tests/unit/test_codec.py pins each function against protobuf's own serialization of
the same message.
"""
from __future__ import annotations

from collections.abc import Iterable, Sequence

from .._ids import TASK_ID_LEN
from . import wire as _wire

# Tags: (field number << 3) | wire type; 2 = length-delimited, 0 = varint.
_CALL_TASK_ID = b"\x0a"        # Call.task_id = 1
_CALL_ARGS = b"\x1a"           # Call.args = 3 (Value)
_CALL_KWARG_NAMES = b"\x22"    # Call.kwarg_names = 4
_CALL_NESTED = b"\x4a"         # Call.nested = 9
_VALUE_REF = b"\x0a"           # Value.ref = 1
_VALUE_INLINE = b"\x12"        # Value.inline = 2
_SUBMIT_CALLS = b"\x0a"        # Submit.calls = 1
_EXECUTE_INVOKE = b"\x0a"      # Execute.invoke = 1
_INVOKE_CALL = b"\x0a"         # InvokeCallRequest.call = 1
_INVOKE_RESOLVED = b"\x12"     # InvokeCallRequest.resolved = 2 (ObjectData)
_INVOKE_ATTEMPT_1 = b"\x20\x01"  # InvokeCallRequest.attempt = 4, value 1
_INVOKE_OWNER = b"\x28"        # InvokeCallRequest.owner = 5 (varint)
_CALL_JOB = b"\xf0\x01"        # Call.job = 30 (varint)


def varint(n: int) -> bytes:
    """Protobuf's base-128 varint of a non-negative integer."""
    if n < 0x80:
        return _SMALL[n]
    out = bytearray()
    while n > 0x7F:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


_SMALL = [bytes((i,)) for i in range(0x80)]   # one-byte varints, without a call


def job_field(job: int) -> bytes:
    """``Call.job``, appended to a call's encoding (a later field wins on merge)."""
    return _CALL_JOB + varint(job)


def field(tag: bytes, payload: bytes) -> bytes:
    """A length-delimited field: its tag, the payload's length, the payload."""
    n = len(payload)
    return tag + (_SMALL[n] if n < 0x80 else varint(n)) + payload


_TASK_ID_PREFIX = _CALL_TASK_ID + varint(TASK_ID_LEN)


def ref_value(oid: bytes) -> bytes:
    """A ``Value`` holding a ref (the task receives the object's value)."""
    return field(_VALUE_REF, oid)


def inline_value(pickled: bytes) -> bytes:
    """A ``Value`` holding a pickled value."""
    return field(_VALUE_INLINE, pickled)


def call(template: bytes, task_id: bytes, values: Sequence[bytes] = (),
         kwarg_names: Iterable[str] = (), nested: Iterable[bytes] = ()) -> bytes:
    """A serialized ``Call``: the function's template (its fixed fields, serialized by
    protobuf) with this call's task id, argument ``Value``s (positional then keyword,
    from ref_value/inline_value), keyword names and refs pickled inside the arguments."""
    if len(task_id) == TASK_ID_LEN:
        if not values:   # the common call without arguments: one concatenation
            return template + _TASK_ID_PREFIX + task_id
        parts = [template, _TASK_ID_PREFIX, task_id]
    else:
        parts = [template, field(_CALL_TASK_ID, task_id)]
    parts.extend(field(_CALL_ARGS, v) for v in values)
    parts.extend(field(_CALL_KWARG_NAMES, name.encode()) for name in kwarg_names)
    parts.extend(field(_CALL_NESTED, oid) for oid in nested)
    return b"".join(parts)


def submit_frame(call_bytes: bytes) -> bytes:
    """A SUBMIT frame carrying one serialized ``Call``."""
    return frame(_wire.SUBMIT, field(_SUBMIT_CALLS, call_bytes))


def execute_frame(call_bytes: bytes, resolved: Iterable[bytes], owner: int) -> bytes:
    """An EXECUTE frame for a worker: the call, the serialized ``ObjectData`` of its ref
    arguments in order, attempt 1, and the caller's connection id at the head (the
    owner of results that must go through the head)."""
    n = len(call_bytes)
    inv = [_INVOKE_CALL, _SMALL[n] if n < 0x80 else varint(n), call_bytes]
    for d in resolved:
        inv.append(field(_INVOKE_RESOLVED, d))
    inv.append(_ATTEMPT_1_OWNER)
    inv.append(_SMALL[owner] if owner < 0x80 else varint(owner))
    body = b"".join(inv)
    n = len(body)
    body = b"".join((_EXECUTE_INVOKE, _SMALL[n] if n < 0x80 else varint(n), body))
    return (len(body) + 1).to_bytes(4, "little") + _EXECUTE_KIND + body


_ATTEMPT_1_OWNER = _INVOKE_ATTEMPT_1 + _INVOKE_OWNER
_EXECUTE_KIND = bytes((_wire.EXECUTE,))


def frame(kind: int, body: bytes) -> bytes:
    """A frame of an already serialized message (see _wire.encode)."""
    return (len(body) + 1).to_bytes(4, "little") + bytes((kind,)) + body
