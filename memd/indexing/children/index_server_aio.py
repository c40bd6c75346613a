"""The single-client index server's main loop on an asyncio gRPC server.

A thread-pool `grpc.server` runs a completion-queue thread that wakes 5 times a second
to look for signals, plus its own timer threads: an idle per-client index server woke
~13-17 times a second (docs/performance.md, "gRPC's idle wake-ups"). A `grpc.aio` server
sleeps until there is work (~5/s for one, measured). The shared index server already
serves each client this way (`memd.indexing.children.shared_index_server.ClientServer`); the
per-client process now runs that same class for its one client, with the servicer still
synchronous in a thread pool of `workers` threads made on demand.

Same contract as before: the ready line once it serves, exit 1 (nothing left open) when
the database or socket cannot be opened, SIGINT/SIGTERM stop it with a 2 s grace.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import time
from concurrent import futures
from pathlib import Path

import structlog

from memd.indexing.children.shared_index_server import ClientServer

log = structlog.get_logger()


async def _serve(data_dir: Path, socket_path: Path, workers: int) -> int:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    pool = futures.ThreadPoolExecutor(workers, thread_name_prefix="index-rpc")
    server = ClientServer(data_dir, socket_path, pool)
    try:
        await server.start()
    except Exception as exc:  # start() has closed what it opened
        log.error("index.server_failed", error=str(exc), data_dir=str(data_dir))
        pool.shutdown(wait=False)
        return 1
    started = time.monotonic()
    print(json.dumps(server.index.ready_record()), flush=True)
    try:
        await stop.wait()
    finally:
        log.info("index.server_stopping", uptime=round(time.monotonic() - started, 1))
        await server.stop()
        pool.shutdown(wait=False)
    return 0


def serve(data_dir: Path, socket_path: Path, workers: int) -> int:
    """Run until SIGINT/SIGTERM (see the module docstring)."""
    os.umask(0o077)  # database files and the socket are private to the user
    return asyncio.run(_serve(data_dir, socket_path, workers))
