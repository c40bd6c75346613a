"""Which rows of a Milvus Lite collection a search may see, kept per generation.

Lite 3.2.2 decides it (the newest version of each primary key, not deleted) in Python
loops over every row of every segment, on every search. It only changes when the set of
(immutable) segments or the tombstones change, so `generation` keeps it with the read
snapshot it belongs to and derives the next one from the previous: only the keys of
segments that came or went, or whose tombstone changed, are looked at again. Used by
`memd.indexing.engine.lite_search`, which patches Lite's searches to use it.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

_CACHE = "_memd_visible"  # attribute on a Collection: its last Generation
BUILDING = threading.RLock()  # derivations and BM25 index builds: one at a time


@dataclass
class Generation:
    """What a search may see of one read snapshot, and what it may reuse."""

    segments: tuple[Any, ...]  # kept alive, so ids in `masks` stay theirs
    deletes: dict[Any, int]  # the tombstones: key -> seq of its last delete
    newest: dict[Any, int]  # key -> seq of its newest version in `segments`
    masks: dict[int, np.ndarray]  # id(segment) -> its rows that are live versions
    units: dict[tuple[int, str], np.ndarray] = field(default_factory=dict)

    def matches(self, segments: tuple[Any, ...], deletes: dict[Any, int]) -> bool:
        return (
            len(segments) == len(self.segments)
            and all(a is b for a, b in zip(segments, self.segments, strict=True))
            and deletes == self.deletes
        )

    def unit_vectors(self, seg: Any, name: str) -> np.ndarray:
        """The segment's vectors scaled to length 1 (zero vectors stay zero), as Lite's
        cosine distance computes them."""
        key = (id(seg), name)
        unit = self.units.get(key)
        if unit is None:
            vectors, _nulls = seg.vector_data(name)
            vectors = np.asarray(vectors, dtype=np.float32)
            norms = np.linalg.norm(vectors, axis=1, keepdims=True)
            unit = vectors / np.where(norms == 0, 1.0, norms)
            self.units[key] = unit
        return unit


def generation(coll: Any) -> tuple[tuple[Any, ...], Any, Generation] | None:
    """The read snapshot and its visibility, or None when Lite's own code must decide
    (rows or deletes still in the memtable).

    The memtable is checked before the snapshot is taken: a row that was in it then is
    answered by Lite's code; a row flushed since is in the snapshot's segments."""
    if coll._memtable.size():
        return None
    segments, deltas = coll._read_snapshot()
    cached: Generation | None = getattr(coll, _CACHE, None)
    if cached is not None and cached.matches(segments, deltas._map):
        return segments, deltas, cached
    with BUILDING:  # one thread derives it; the others then find it
        cached = getattr(coll, _CACHE, None)
        if cached is not None and cached.matches(segments, deltas._map):
            return segments, deltas, cached
        fresh = _derive(cached, segments, dict(deltas._map))
        setattr(coll, _CACHE, fresh)
    return segments, deltas, fresh


def search_snapshot(coll: Any, read_snapshot: Callable[[Any], Any]) -> Any:
    """Lite's read snapshot for a search; while another thread holds the maintenance lock,
    the last one taken if the segment cache has not changed since.

    Lite's background compaction holds that lock while it merges segments (30-150 ms
    measured at 10k chunks), and every search waited for it. A compaction changes which
    files hold the rows, not which rows are visible, and segments are immutable, so the
    snapshot from before it answers the same. Anything that does change the segment cache
    (a flush, a finished compaction, a load) counts in `_memd_refreshes` under the lock; a
    snapshot taken before such a change is not reused."""
    lock = coll._maintenance_lock
    if lock.acquire(blocking=False):
        try:
            refreshes = getattr(coll, "_memd_refreshes", 0)
            snap = read_snapshot(coll)
        finally:
            lock.release()
        coll._memd_last_snapshot = (refreshes, snap)
        return snap
    last = getattr(coll, "_memd_last_snapshot", None)
    if last is not None and last[0] == getattr(coll, "_memd_refreshes", 0):
        return last[1]
    return read_snapshot(coll)


def _derive(
    prev: Generation | None, segments: tuple[Any, ...], deletes: dict[Any, int]
) -> Generation:
    """The visibility of a new snapshot, from the previous one where that is cheaper.

    A flush adds a segment, a compaction swaps some for their merge, a delete adds a
    tombstone: only the keys in segments that came or went, or whose tombstone changed,
    can change which row is visible. Everything else is copied."""
    if prev is None:
        return _full(segments, deletes)
    before, now = {id(s) for s in prev.segments}, {id(s) for s in segments}
    moved = [s for s in segments if id(s) not in before]
    moved += [s for s in prev.segments if id(s) not in now]
    changed = {pk for seg in moved for pk in seg.pks}
    changed.update(pk for pk, seq in deletes.items() if prev.deletes.get(pk) != seq)
    changed.update(pk for pk in prev.deletes if pk not in deletes)
    if len(changed) > len(prev.newest) // 2:
        return _full(segments, deletes)
    newest = dict(prev.newest)
    for pk in changed:
        seqs = [int(s.seqs[row]) for s in segments if (row := s.pk_to_row.get(pk)) is not None]
        if seqs:
            newest[pk] = max(seqs)
        else:
            newest.pop(pk, None)
    masks = {}
    for seg in segments:
        if id(seg) not in before:
            masks[id(seg)] = _mask(seg, newest, deletes)
            continue
        mask = prev.masks[id(seg)]
        rows = [(row, pk) for pk in changed if (row := seg.pk_to_row.get(pk)) is not None]
        if rows:
            mask = mask.copy()
            for row, pk in rows:
                seq = int(seg.seqs[row])
                mask[row] = newest[pk] == seq and deletes.get(pk, -1) <= seq
        masks[id(seg)] = mask
    units = {k: v for k, v in prev.units.items() if k[0] in now}  # still right
    return Generation(segments, deletes, newest, masks, units)


def _full(segments: tuple[Any, ...], deletes: dict[Any, int]) -> Generation:
    newest: dict[Any, int] = {}
    for seg in segments:
        for pk, seq in zip(seg.pks, seg.seqs.tolist(), strict=True):
            if seq > newest.get(pk, -1):
                newest[pk] = seq
    masks = {id(seg): _mask(seg, newest, deletes) for seg in segments}
    return Generation(segments, deletes, newest, masks)


def _mask(seg: Any, newest: dict[Any, int], deletes: dict[Any, int]) -> np.ndarray:
    """The segment's rows holding their key's newest version, not deleted since."""
    seqs = seg.seqs.tolist()
    return np.fromiter(
        (
            newest[pk] == seq and deletes.get(pk, -1) <= seq
            for pk, seq in zip(seg.pks, seqs, strict=True)
        ),
        dtype=bool,
        count=len(seqs),
    )
