"""memd's child programs, and the little the daemon needs to start and watch them.

The programs (each run as `python -m <module>`, forked from memd's zygote or spawned):

- `index_server`: one client's Milvus Lite database on gRPC and JSON sockets;
- `shared_index_server`: every client's index servers in one process;
- `memsearch_watch`: `memsearch watch` with memd's patches;
- `catch_up_child`: a one-shot indexing of the files a new watcher may have missed;
- `embedder`: the bundled embedding models, for the watchers (memsearch's `memd` provider)
  and recall's queries.

They share one start-up routine (`startup.start`: arguments, heap, logging, the engine
prepared for their role, `memd.indexing.engine`) and never import the daemon's side of
indexing (pipelines, settings, maintenance, supervision of children; import-linter,
pyproject.toml): what they need from memd's config comes on their command line or in
their environment.

This face is what the daemon imports: module names, the readiness check of an index
socket, and the catch-up child's file choice and report event. It imports nothing beyond
the standard library, so the daemon does not load a child's code by importing it.
"""

from __future__ import annotations

import socket
from pathlib import Path

INDEX_SERVER = "memd.indexing.children.index_server"
SHARED_INDEX_SERVER = "memd.indexing.children.shared_index_server"
WATCHER = "memd.indexing.children.memsearch_watch"
CATCH_UP = "memd.indexing.children.catch_up_child"
EMBEDDER = "memd.indexing.children.embedder"
# what the zygote preloads
MODULES = (WATCHER, INDEX_SERVER, SHARED_INDEX_SERVER, CATCH_UP, EMBEDDER)

DONE_EVENT = "catch_up_done"  # the catch-up child's report line on stdout


def index_ready(socket_path: Path | str, timeout: float = 0.5) -> bool:
    """True once something accepts connections on the socket; cheap enough for every tick.

    A connect on a Unix socket answers at once: refused for a stale file left by a killed
    server, missing before the server binds.
    """
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(timeout)
    try:
        sock.connect(str(socket_path))
    except OSError:
        return False
    finally:
        sock.close()
    return True


def changed_files(sessions: Path, since: float) -> list[Path]:
    """Session files (not in hidden folders) modified at or after `since`."""
    return [
        p
        for p in sorted(sessions.glob("**/*.md"))
        if not any(part.startswith(".") for part in p.relative_to(sessions).parts)
        and _mtime(p) >= since
    ]


def _mtime(path: Path) -> float:
    try:
        return path.stat().st_mtime
    except OSError:
        return 0.0


__all__ = [
    "CATCH_UP",
    "DONE_EVENT",
    "EMBEDDER",
    "INDEX_SERVER",
    "MODULES",
    "SHARED_INDEX_SERVER",
    "WATCHER",
    "changed_files",
    "index_ready",
]
