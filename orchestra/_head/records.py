"""The scheduler's durable records as the bytes the head's state store keeps, and back.
No I/O.

    Durable(table, key, record) --Head.carry_out: encode(table, record)--> the store
    the store's rows (a restarted head) --read(rows)--> records, and the rows no head
        can read (said in words, deleted) --> _scheduler/durable.py restore(), JobBook

The tables (_scheduler/durable.py): ACTORS (ActorRecord, kept as a DurableActor
message), GROUPS (a detached group's GroupSpec, as a PlacementGroupSpec), JOBS (JobRecord, as a
DurableJob), NODES (bytes, written and read as they are).
"""
from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from .._protocol import pb
from .._scheduler.durable import ACTORS, GROUPS, JOBS, ActorRecord
from .._scheduler.jobs import JobRecord
from . import inbound, outbound

_NAMES = {ACTORS: "actor", GROUPS: "placement group", JOBS: "job"}


def encode(table: str, record: Any) -> bytes | None:
    """The bytes of ``record`` of ``table`` (None stays None: a deletion)."""
    if record is None:
        return None
    if table == ACTORS:
        rec = pb.DurableActor(creation=outbound.call_out(record.creation), restarts=record.restarts,
                              revived=record.revived, node_id=record.node_id,
                              owner_key=record.owner_key)
        if record.cls is not None:
            rec.cls.CopyFrom(record.cls.wire)
        return rec.SerializeToString()
    if table == GROUPS:
        return outbound.group_spec(record).SerializeToString()
    if table == JOBS:
        return pb.DurableJob(**dataclasses.asdict(record)).SerializeToString()
    return bytes(record)


def decode(table: str, data: bytes) -> Any:
    """The record ``data`` holds; an exception (protobuf's DecodeError, ...) when it is
    no such record."""
    if table == ACTORS:
        rec = pb.DurableActor.FromString(data)
        return ActorRecord(inbound.call_in(rec.creation), rec.restarts, rec.revived,
                           inbound.function_in(rec.cls) if rec.HasField("cls") else None,
                           rec.node_id, rec.owner_key)
    if table == GROUPS:
        return inbound.group_spec(pb.PlacementGroupSpec.FromString(data))
    if table == JOBS:
        job = pb.DurableJob.FromString(data)
        return JobRecord(**{f.name: getattr(job, f.name) for f in dataclasses.fields(JobRecord)})
    return data


def read(rows: Mapping[str, Mapping[str, bytes]]
         ) -> tuple[dict[str, dict[str, Any]], list[tuple[str, str, str]]]:
    """The records of the store's ``rows`` (table -> key -> bytes), and those no head
    can read: (table, key, why in words), for the head to say and delete."""
    records: dict[str, dict[str, Any]] = {}
    bad: list[tuple[str, str, str]] = []
    for table, kept in rows.items():
        out = records.setdefault(table, {})
        for key, data in kept.items():
            try:
                out[key] = decode(table, data)
            except Exception as exc:   # noqa: BLE001 - any record no head can read
                bad.append((table, key, f"{_NAMES.get(table, table)} {key}: {exc}"))
    return records, bad
