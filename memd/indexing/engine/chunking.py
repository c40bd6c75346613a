"""memd's indexing size policy inside memsearch: its chunker sees `index_view(text)`.

memd cuts a giant exchange for the index when it writes it (memd.markdown.overflow): the
file keeps all of it, and memsearch's chunker is given the file with the part past the
marker blanked out line for line, so chunks keep their true line numbers. Both indexers
of a client's files install it, the watcher and the catch-up child (their roles in
`memd.indexing.engine.roles`): their chunk ids must agree, or each would drop the
other's chunks as stale.
"""

from __future__ import annotations

from typing import Any

from memd.indexing.engine.registry import Registry
from memd.markdown import index_view

GROUP = "memsearch.chunking"


def install(registry: Registry) -> None:
    """Make memsearch's indexing chunk `index_view(text)`."""
    import memsearch.core

    chunk_markdown = registry.original(memsearch.core, "chunk_markdown")

    def chunk_indexed_part(text: str, *args: Any, **kwargs: Any) -> Any:
        """memsearch's chunker over what memd indexes of a transcript."""
        return chunk_markdown(index_view(text), *args, **kwargs)

    registry.replace(GROUP, memsearch.core, "chunk_markdown", chunk_indexed_part)
