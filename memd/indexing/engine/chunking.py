"""memd's indexing size policy inside memsearch: its chunker sees `index_view(text)`,
without the blank lines at its end (`settled_end`).

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
        return chunk_markdown(settled_end(index_view(text)), *args, **kwargs)

    registry.replace(GROUP, memsearch.core, "chunk_markdown", chunk_indexed_part)


def settled_end(text: str) -> str:
    """`text` ending with one line break: the blank lines after a transcript's last
    exchange belong to the next one's heading once it is written. memsearch's last chunk
    ends at the file's last line, so with them it ended one line later than the same
    exchange does once another follows: every record changed the previous exchange's
    chunk id, and the watcher embedded that exchange again (tests/test_index_order.py)."""
    stripped = text.rstrip("\n")
    return stripped + "\n" if stripped else text
