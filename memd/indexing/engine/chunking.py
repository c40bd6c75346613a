"""memd's indexing size policy inside memsearch: its chunker sees `index_view(text)`.

memd cuts a giant exchange for the index when it writes it (memd.markdown.overflow): the
file keeps all of it, and memsearch's chunker is given the file with the part past the
marker blanked out line for line, so chunks keep their true line numbers. Both indexers
of a client's files install it, the watcher (memd.indexing.memsearch_watch) and the
daemon's catch-up (memd.indexing.maintenance): their chunk ids must agree, or each
would drop the other's chunks as stale.
"""

from __future__ import annotations

from typing import Any

import memsearch.core

from memd.markdown import index_view

_chunk_markdown = memsearch.core.chunk_markdown


def chunk_indexed_part(text: str, *args: Any, **kwargs: Any) -> Any:
    """memsearch's chunker over what memd indexes of a transcript."""
    return _chunk_markdown(index_view(text), *args, **kwargs)


def install() -> None:
    """Make memsearch's indexing chunk `index_view(text)` (idempotent)."""
    memsearch.core.chunk_markdown = chunk_indexed_part
