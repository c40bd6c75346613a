"""memsearch's indexing of one file run under the client's index lock, in every process
that indexes (the watcher and the catch-up child).

`memd.indexing.index_lock` says why (two runs on a growing file leave a stale chunk) and
holds the lock itself; this wraps memsearch's private `MemSearch._index_file`, the one
step both the scan and a single file go through, in it.
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

from memd.indexing.engine.registry import Registry
from memd.indexing.index_lock import locked

GROUP = "memsearch.index_lock"


def installer(path: Path) -> Any:
    """The install function for `path`'s lock (applied under the key `str(path)`)."""

    def install(registry: Registry) -> None:
        from memsearch.core import MemSearch

        original = registry.original(MemSearch, "_index_file")

        @functools.wraps(original)
        async def index_file_locked(self: Any, f: Any, *, force: bool = False) -> int:
            with locked(path):
                result: int = await original(self, f, force=force)
                return result

        registry.replace(GROUP, MemSearch, "_index_file", index_file_locked)

    return install
