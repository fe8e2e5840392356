"""Slabs: the files in which a store keeps its medium objects, several to a file.

A segment of a size class up to SLAB_MAX is a slot of a slab: a file of SLAB bytes in
the session's directory (``slab-<n>.<carving>``), carved into slots of one class, each
at a multiple of its capacity. A slot is named ``slab-<n>.<carving>@<offset>``; readers
map its range of the file (_objects/segments.py segment_file), a writer maps the whole
slab once (``slab-<n>``: the same file through every carving) and writes its slots
through that map (io.py).

What a slab buys: the memory that objects of one class freed serves those of another.
A file's pages cannot move to another file, so with a file per segment, 1 GB freed by
100 KB objects was no use to 1 MiB ones, which met fresh memory (~2 GB/s here, where
warm memory is written at ~6-8 GB/s). A slab whose slots are all free is carved again
for the class asked for, its pages kept where they fall inside the new slots (recarve).

The store owns every Slab (one thread, the node's event loop; store_slabs.py carves
them); this module decides. A slot's states are the store's segment states, and two
more:

    cold: free, no pages (never written since its slab was carved, or punched); not
        counted in the store's ``used`` or ``pooled``.
    dead: its object was spilled (or was mapped when a head was lost): its name must
        never reach another writer, so it is not reused while its slab lives; its bytes
        stay counted in ``used`` until the slab holds no live slot, and the slab is
        then removed (unlinked, never carved again).

Carving again renames the file (``slab-<n>.<carving + 1>``): every name of the old
carving is gone at once, so a reader that learnt one finds no file (and asks the head),
as it finds no file for a segment removed; a writer's map of the slab stays good (the
same file). When a slab is removed, the store tells each process that wrote into it
(``mappers``, over every carving) to drop its map (DropMaps names the slab's file).

Spills take whole slabs (the store's _spill_units): a slot's memory comes back only
with its file, and a slot spilled alone could not be given back while a reader that
learnt its name just before might still map it.
"""
from __future__ import annotations

SLAB = 8 << 20
# Size classes up to this are slots of slabs (a 1 MiB object's class is 1.25 MiB: six to
# a slab); larger segments are files of their own.
SLAB_MAX = 2 << 20


def is_slot(name: str) -> bool:
    return "@" in name


def slab_ident(name: str) -> str:
    """``slab-<n>`` of a slot's or slab file's name (the slab through every carving)."""
    return name.partition("@")[0].partition(".")[0]


def slot_name(slab: str, offset: int) -> str:
    return f"{slab}@{offset}"


def split_slot(name: str) -> tuple[str, int]:
    """(file name, offset) of segment ``name``: a slot's slab and place, else the name
    itself at 0. ValueError for a malformed offset."""
    base, at, offset = name.partition("@")
    if not at:
        return name, 0
    if not offset.isdigit():
        raise ValueError(f"bad slot offset in {name!r}")
    return base, int(offset)


class Slab:
    """A slab file carved into slots of class ``cap`` (``slots``: their names, by offset)."""

    __slots__ = ("ident", "carving", "name", "cap", "slots", "live", "dead", "cold", "mappers")

    def __init__(self, ident: str, carving: int, cap: int) -> None:
        self.ident = ident            # slab-<n>
        self.carving = carving
        self.name = name = f"{ident}.{carving}"   # its file's
        self.cap = cap
        self.slots = [slot_name(name, i * cap) for i in range(SLAB // cap)]
        self.live = 0     # slots holding an object (writing, sealed, retired, spilling)
        self.dead = 0     # slots whose object was spilled: see the module docstring
        # Cold slots, the one at the lowest offset taken first (popped from the end).
        self.cold: list[str] = []
        # Connections that wrote into it (and so map it whole), in any carving.
        self.mappers: set[int] = set()

    def empty(self) -> bool:
        """No slot holds an object, or is dead: it may be carved again."""
        return self.live == 0 and self.dead == 0


def recarve(old_cap: int, warm: list[int], new_cap: int) -> tuple[list[int], list[tuple[int, int]]]:
    """An empty slab carved into slots of ``new_cap``, its warm slots (free, pages
    present: their offsets, each ``old_cap`` long) those of ``old_cap``.

    Returns (indexes of the new slots that lie wholly inside warm old slots, and so
    keep their pages; ranges (offset, length) to punch: every other byte that may
    have pages). The warm bytes after are never more than before, so the store's
    count of pooled bytes only falls."""
    spans = sorted((o, o + old_cap) for o in warm)
    merged: list[list[int]] = []
    for start, end in spans:
        if merged and merged[-1][1] >= start:
            merged[-1][1] = max(merged[-1][1], end)
        else:
            merged.append([start, end])
    keep: list[int] = []
    punch: list[tuple[int, int]] = []
    n = SLAB // new_cap
    for i in range(n):
        lo, hi = i * new_cap, (i + 1) * new_cap
        if any(s <= lo and hi <= e for s, e in merged):
            keep.append(i)
        elif any(s < hi and lo < e for s, e in merged):
            punch.append((lo, new_cap))
    tail = n * new_cap
    if tail < SLAB and any(e > tail for _, e in merged):
        punch.append((tail, SLAB - tail))
    return keep, punch


__all__ = ["SLAB", "SLAB_MAX", "Slab", "is_slot", "recarve", "slab_ident", "slot_name",
           "split_slot"]
