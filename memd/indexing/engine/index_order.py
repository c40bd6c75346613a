"""memsearch's indexing of one file, with a changed chunk's new version stored before the
old one is deleted: a fact already indexed never drops out of recall while its file grows.

memsearch 0.4.23's `MemSearch._index_file` deletes a file's stale chunks first and only
then embeds and stores the new ones. A chunk's id holds its lines and content, so when a
transcript grows, the chunk of what was its last exchange often gets a new id (its end
line moves), and between the delete and the store, the embedding time, nothing of that
exchange is in the index: recall answered "No relevant memories found." for a fact it
had found the moment before (measured: 120 ms on an idle machine, every few records; the
CI failure of stop 35, tests/test_proxy_responses.py). Here the new chunks are embedded
and stored first, and the stale ones deleted after, also when storing failed (as
memsearch would have left them deleted). Meanwhile both versions are in the index;
recall never shows two results that share a line (memd.recall.shown), so the overlap
costs no duplicate.

This is memsearch's function with its two steps swapped; the helpers it calls are looked
up in `memsearch.core` at each call, so memd's chunking (engine/chunking.py) applies.
"""

from __future__ import annotations

import functools
from typing import Any

from memd.indexing.engine.registry import Registry

GROUP = "memsearch.index_order"


def install(registry: Registry) -> None:
    """Make `MemSearch._index_file` store new chunks before deleting stale ones."""
    from memsearch.core import MemSearch

    original = registry.original(MemSearch, "_index_file")

    @functools.wraps(original)
    async def index_file_new_first(self: Any, f: Any, *, force: bool = False) -> int:
        stale, new = _plan(self, f, force)
        try:
            return int(await self._embed_and_store(new)) if new else 0
        finally:
            if stale:
                self._store.delete_by_hashes(sorted(stale))

    registry.replace(GROUP, MemSearch, "_index_file", index_file_new_first)


def _plan(search: Any, f: Any, force: bool) -> tuple[set[str], list[Any]]:
    """memsearch's bookkeeping for one file: the ids in the index that are no longer
    among its chunks (stale), and the chunks to embed (all with `force`, else
    those whose id the index lacks)."""
    import memsearch.core as core

    source = str(f.path)
    text = core.read_utf8_text_replace(f.path)
    chunks = core.chunk_markdown(
        text,
        source=source,
        max_chunk_size=search._max_chunk_size,
        overlap_lines=search._overlap_lines,
    )
    model = search._embedder.model_name
    ids = [
        core.compute_chunk_id(c.source, c.start_line, c.end_line, c.content_hash, model)
        for c in chunks
    ]
    old_ids = search._store.hashes_by_source(source)
    stale = old_ids - set(ids)
    new = (
        list(chunks) if force else [c for c, i in zip(chunks, ids, strict=True) if i not in old_ids]
    )
    return stale, new
