"""One client's Milvus Lite database served over gRPC on a Unix socket, flushed after every write.

Milvus Lite locks its data directory, so a watcher and memd's recall cannot both open it.
This process owns the database and serves it on `unix:<socket>`; the watcher (memsearch
with `--milvus-uri unix:<socket>`) and recall (pymilvus) are both clients.

Milvus Lite keeps new rows in a memtable until it reaches 128 MB; hybrid search scans it
row by row (measured: ~0.25 ms per row, 1.4 s at 10k rows against ~17 ms once flushed).
The servicer (`memd.indexing.engine.servicer`) flushes the collection after every
Insert/Upsert/Delete, so rows never linger unflushed; size-tiered compaction keeps the
resulting small segments few.

Milvus Lite writes its per-segment vector index sidecars (`*.idx`) in place, so a kill -9
during a write leaves a truncated file that makes every later load of the collection fail
("No data left in file"), for recall and watcher alike. The sidecars are derived data: the
server marks the database open while it runs, and after an unclean stop it deletes them
before opening, so they are rebuilt from the flushed segments.

Milvus Lite also reopens indexed collections "released", so the server loads them all on
start; otherwise a watcher that outlives a restart of this server fails every event.

Run: python -m memd.indexing.children.index_server --data-dir DIR --socket PATH
Prints one JSON line {"event": "index_server_ready", ...} on stdout once it serves.
SIGINT/SIGTERM: stop serving (2 s grace), close the database, remove the socket.
"""

from __future__ import annotations

import argparse
import os
import stat
import sys
from pathlib import Path
from typing import Any

import structlog

from memd.indexing import children, engine, index_requests
from memd.indexing.children import query_server, startup
from memd.indexing.engine import servicer

log = structlog.get_logger()

MAX_MESSAGE_BYTES = 256 * 1024 * 1024
OPEN_MARKER = ".memd-open"  # present while a server has the database open
DEFAULT_WORKERS = 8
GRPC_OPTIONS = (
    ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
    ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
    # pymilvus pings every 10 s even when idle; gRPC's default server policy (5 min)
    # answers that with GOAWAY too_many_pings and the client reconnects. Allow the pings.
    ("grpc.keepalive_permit_without_calls", 1),
    ("grpc.http2.min_ping_interval_without_data_ms", 5000),
    ("grpc.http2.max_ping_strikes", 0),
)


def zygote_preload() -> None:
    """What memd's zygote imports before forking index servers: the servicer's modules."""
    servicer.servicer_class()


class IndexServer:
    """One client's index: open the database, bind it to a gRPC server, close both down.

    The gRPC server is a `grpc.aio` one owned by a `ClientServer`
    (`memd.indexing.children.shared_index_server`): the single-client process (`serve`,
    `memd.indexing.children.index_server_aio`) runs one, the shared index server one per
    client in a single process. There is no thread-pool server any more: it woke 13-17
    times a second idle (docs/performance.md, "gRPC's idle wake-ups").
    """

    def __init__(self, data_dir: Path, socket_path: Path):
        self.data_dir = data_dir
        self.socket_path = socket_path
        self._db: Any = None
        self._bound = False
        self._queries: query_server.QueryServer | None = None  # memd's recall requests

    def open_database(self) -> None:
        """Open the database first: if another process holds its lock we fail before
        touching a socket that process may be serving. Blocking (a purge rebuilds)."""
        from milvus_lite.db import MilvusLite

        engine.prepare_index_server()  # done at start already; before any analyzer is built
        self.data_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        self._db = MilvusLite(str(self.data_dir))
        marker = self.data_dir / OPEN_MARKER
        if marker.exists():  # we hold the lock now, so no live server is using these files
            purge_index_sidecars(self.data_dir)
        marker.touch()
        load_all_collections(self._db)
        check_private_dir(self.socket_path.parent)
        self.socket_path.unlink(missing_ok=True)  # a stale one from a killed server

    def bind(self, server: Any) -> None:
        """Add the servicer and the socket to a not yet started `grpc.aio` server (the
        caller's `ClientServer` owns that server, starts and stops it)."""
        from pymilvus.grpc_gen import milvus_pb2_grpc

        milvus_pb2_grpc.add_MilvusServiceServicer_to_server(
            servicer.servicer_class()(self._db), server
        )
        server.add_insecure_port(f"unix:{self.socket_path}")
        self._bound = True
        os.chmod(self.socket_path, 0o600)
        self._queries = query_server.QueryServer(
            index_requests.query_socket_path(self.socket_path), self._db
        )
        self._queries.start()  # memd's recall requests, beside gRPC (both processes)

    def ready_record(self) -> dict[str, Any]:
        """The JSON line printed once this client's index serves (memd and tests read it)."""
        return {
            "event": "index_server_ready",
            "socket": str(self.socket_path),
            "data_dir": str(self.data_dir),
            "pid": os.getpid(),
        }

    def close_database(self) -> None:
        """Close the database (clearing the open marker) and remove the socket; once the
        gRPC server serving them has stopped."""
        if self._queries is not None:
            self._queries.stop()
            self._queries = None
        if self._db is not None:
            self._db.close()
            self._db = None
            (self.data_dir / OPEN_MARKER).unlink(missing_ok=True)
        if self._bound:
            self.socket_path.unlink(missing_ok=True)
            self._bound = False


def load_all_collections(db: Any) -> int:
    """Load every collection, as a Milvus server keeps them loaded across restarts.

    Milvus Lite reopens indexed collections "released", and memsearch loads a collection
    only when its store is created: a watcher that outlives an index-server restart would
    fail every later event ("call load() before search/get/query").
    """
    loaded = 0
    for database in db.list_databases():
        for name in db.list_collections(database_name=database):
            col = db.get_collection(name, database_name=database)
            if col.load_state != "loaded":
                col.load()
                loaded += 1
    return loaded


def purge_index_sidecars(data_dir: Path) -> int:
    """Delete the vector index sidecars of every collection; Milvus Lite rebuilds them."""
    removed = 0
    for path in data_dir.glob("**/partitions/*/indexes/*.idx"):
        path.unlink(missing_ok=True)
        removed += 1
    log.warning(
        "index.sidecars_purged", data_dir=str(data_dir), files=removed, reason="unclean shutdown"
    )
    return removed


def check_private_dir(path: Path) -> None:
    """The socket's folder must be ours and closed to others (it may live under /tmp)."""
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    st = path.lstat()
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid() or st.st_mode & 0o077:
        raise PermissionError(f"{path} must be a directory owned by this user with mode 0700")


def serve(data_dir: Path, socket_path: Path, workers: int = DEFAULT_WORKERS) -> int:
    """Run until SIGINT/SIGTERM, on an asyncio gRPC server (fewer idle wake-ups than the
    thread-pool one: memd.indexing.children.index_server_aio)."""
    from memd.indexing.children import index_server_aio

    return index_server_aio.serve(data_dir, socket_path, workers)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog=f"python -m {children.INDEX_SERVER}",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--data-dir", type=Path, required=True, help="Milvus Lite data directory")
    parser.add_argument("--socket", type=Path, required=True, help="Unix socket path to serve on")
    parser.add_argument("--workers", type=int, default=DEFAULT_WORKERS, help="gRPC worker threads")
    args = startup.start(engine.INDEX_SERVER, parser, argv)
    return serve(args.data_dir.absolute(), args.socket.absolute(), args.workers)


if __name__ == "__main__":
    sys.exit(main())
