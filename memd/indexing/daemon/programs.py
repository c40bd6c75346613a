"""The child programs memd starts, as the daemon side knows them: one place.

The children (index server, shared index server, watch wrapper, catch-up child) are
their own programs; memd names them by module in command lines, and uses three things of
theirs: the socket probe `index_ready`, and the catch-up child's report event and file
selection. Every such name the daemon side uses is here, so a move of the children
touches this module only (its names are those of the children's own face,
`memd.indexing.children`, where the children get one). Children never import the daemon
side.
"""

from __future__ import annotations

from memd.indexing.children import (
    CATCH_UP,
    DONE_EVENT,
    INDEX_SERVER,
    MODULES,
    SHARED_INDEX_SERVER,
    WATCHER,
    changed_files,
    index_ready,
)

__all__ = [
    "CATCH_UP",
    "DONE_EVENT",
    "INDEX_SERVER",
    "MODULES",
    "SHARED_INDEX_SERVER",
    "WATCHER",
    "changed_files",
    "index_ready",
]
