"""Every client's index server in one process: `[supervision] shared_index_server = true`.

Each client keeps exactly what `memd.indexing.children.index_server` gives it alone: its own
Milvus Lite database in its own data folder (and that folder's lock), its own gRPC
server on its own Unix socket, the unclean-stop sidecar purge and the ready line; so
watchers, recall, forget, rebuild and export do not know the difference. What is shared
is the interpreter: the imports (~85 MB), gRPC's process-wide threads (event engine,
timers) and the Milvus Lite engine's code, which 20 separate servers pay 20 times.

One gRPC server per client, not one server with a port per client: a servicer sees no
socket, only the client-chosen `:authority` header (through a private attribute), and
the clients' databases must not mix; nor can a started server take another port. The
servers are `grpc.aio` ones on one event loop (see `ClientServer`): the thread-pool
servers' per-server polling would keep most of the idle CPU this process saves.

memd owns the list of clients: a JSON manifest, `{"clients": {id: {"data_dir": ...,
"socket": ...}}}`, that it rewrites whole. The process reads it at start, so a restart
after a crash brings every client back by itself, and again on each `{"op": "sync"}`
line on its control socket, answering with what serves and what failed. The control
socket is bound only after the start's clients are all opened (or have failed), so
"the control socket answers" is memd's readiness check for the whole process. One
client that cannot open (a locked or broken folder) is reported and skipped; the
others serve.

Run: python -m memd.indexing.children.shared_index_server --manifest PATH --control PATH
Prints {"event": "index_server_ready", ...} per client as it serves, and
{"event": "shared_index_server_ready", ...} once the control socket answers.
SIGINT/SIGTERM: stop every client's server (2 s grace), close the databases, remove the
sockets.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import signal
import sys
from concurrent import futures
from pathlib import Path
from typing import Any

import structlog

from memd.indexing import children, engine
from memd.indexing.children import index_server, startup
from memd.indexing.children.index_server import IndexServer

log = structlog.get_logger()

CONTROL_TIMEOUT = 30.0  # seconds a control connection may take to send its line
MAX_LINE = 64 * 1024
# Threads running every client's calls, made on demand. Not fewer: at 20 clients under
# bench/load.py, 16 were all held by writes (each waits for its client's write lock and
# flush) and recalls queued behind them past memd's 10 s timeout (21 % index_unavailable);
# with 64 none failed.
WORKERS = 64


def zygote_preload() -> None:
    """What memd's zygote imports before forking this: the index server's modules and
    gRPC's asyncio layer (importing it starts no thread; its poller starts with a server)."""
    import grpc.aio  # noqa: F401

    index_server.zygote_preload()


def read_manifest(path: Path) -> dict[str, tuple[Path, Path]]:
    """client id -> (data dir, socket); a missing manifest means no clients yet."""
    try:
        raw = json.loads(path.read_text())
    except FileNotFoundError:
        return {}
    clients = raw.get("clients") if isinstance(raw, dict) else None
    if not isinstance(clients, dict):
        raise ValueError(f"{path}: 'clients' must be an object")
    out: dict[str, tuple[Path, Path]] = {}
    for client_id, entry in clients.items():
        if not isinstance(entry, dict):
            raise ValueError(f"{path}: client {client_id!r} must be an object")
        out[str(client_id)] = (Path(entry["data_dir"]), Path(entry["socket"]))
    return out


class ClientServer:
    """One client's `IndexServer` served by an asyncio gRPC server.

    The thread-pool `grpc.server` of the single-client process runs one completion-queue
    thread per server that wakes 5 times a second: 20 of them in one process cost
    ~120 wake-ups/s and 0.8 % of a core idle (measured). `grpc.aio` servers share the
    process's one poller, which sleeps until there is work (20 idle: 8 wake-ups/s,
    0.08 %). The servicer stays synchronous and runs in the shared thread pool."""

    def __init__(self, data_dir: Path, sock: Path, pool: futures.ThreadPoolExecutor) -> None:
        self.index = IndexServer(data_dir, sock)
        self._pool = pool
        self._server: Any = None

    @property
    def place(self) -> tuple[Path, Path]:
        return (self.index.data_dir, self.index.socket_path)

    async def start(self) -> None:
        import grpc

        try:
            await asyncio.to_thread(self.index.open_database)
            self._server = grpc.aio.server(
                migration_thread_pool=self._pool, options=list(index_server.GRPC_OPTIONS)
            )
            self.index.bind(self._server)
            await self._server.start()
        except BaseException:
            await self.stop(grace=0)
            raise

    async def stop(self, grace: float = 2.0) -> None:
        if self._server is not None:
            server, self._server = self._server, None
            with contextlib.suppress(Exception):
                await asyncio.wait_for(server.stop(grace), grace + 3)
        await asyncio.to_thread(self.index.close_database)


class SharedIndexServer:
    """The clients' servers, kept in step with the manifest (one sync at a time)."""

    def __init__(self, manifest: Path, workers: int = WORKERS) -> None:
        self.manifest = manifest
        self._pool = futures.ThreadPoolExecutor(workers, thread_name_prefix="index-rpc")
        self._servers: dict[str, ClientServer] = {}
        self._failed: dict[str, str] = {}
        self._lock = asyncio.Lock()
        self._closed = False

    async def sync(self) -> dict[str, Any]:
        """Stop the clients no longer listed (or moved), start the new ones; a client
        that failed before is tried again."""
        async with self._lock:
            if self._closed:
                return {"ok": True, **self._report()}
            try:
                wanted = await asyncio.to_thread(read_manifest, self.manifest)
            except (OSError, ValueError, KeyError, TypeError) as exc:
                log.error("index.manifest_unreadable", path=str(self.manifest), error=str(exc))
                return {"ok": False, "error": f"manifest: {exc}", **self._report()}
            for client_id in sorted(set(self._servers) | set(self._failed)):
                server = self._servers.get(client_id)
                moved = server is not None and server.place != wanted.get(client_id)
                if client_id not in wanted or moved:
                    await self._remove(client_id)
            for client_id, (data_dir, sock) in sorted(wanted.items()):
                if client_id not in self._servers:
                    await self._add(client_id, data_dir, sock)
            return {"ok": True, **self._report()}

    async def _add(self, client_id: str, data_dir: Path, sock: Path) -> None:
        server = ClientServer(data_dir, sock, self._pool)
        try:
            await server.start()
        except Exception as exc:
            log.error(
                "index.server_failed", client=client_id, error=str(exc), data_dir=str(data_dir)
            )
            self._failed[client_id] = f"{type(exc).__name__}: {exc}"
            return
        self._failed.pop(client_id, None)
        self._servers[client_id] = server
        print(json.dumps({**server.index.ready_record(), "client": client_id}), flush=True)

    async def _remove(self, client_id: str) -> None:
        self._failed.pop(client_id, None)
        server = self._servers.pop(client_id, None)
        if server is None:
            return
        try:
            await server.stop(grace=1.0)
        except Exception:
            log.exception("index.server_stop_failed", client=client_id)
        log.info("index.client_removed", client=client_id)

    def _report(self) -> dict[str, Any]:
        return {"serving": sorted(self._servers), "failed": dict(self._failed)}

    def report(self) -> dict[str, Any]:
        return {"ok": True, **self._report()}

    async def close(self) -> None:
        """Stop every client's server; later syncs do nothing."""
        async with self._lock:
            self._closed = True
            for client_id in sorted(self._servers):
                await self._remove(client_id)
        self._pool.shutdown(wait=False, cancel_futures=True)


async def _answer(
    shared: SharedIndexServer, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
) -> None:
    """One request line, one answer line; any bad input gets an error answer."""
    try:
        line = await asyncio.wait_for(reader.readline(), CONTROL_TIMEOUT)
        try:
            request = json.loads(line)
            op = request.get("op") if isinstance(request, dict) else None
        except ValueError:
            op = None
        if op == "sync":
            answer = await shared.sync()
        elif op == "status":
            answer = shared.report()
        else:
            answer = {"ok": False, "error": 'expected {"op": "sync"} or {"op": "status"}'}
        writer.write(json.dumps(answer).encode() + b"\n")
        await writer.drain()
    except (OSError, TimeoutError, ValueError) as exc:
        log.warning("index.control_failed", error=str(exc))
    finally:
        writer.close()


async def _serve(manifest: Path, control: Path, workers: int) -> int:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    shared = SharedIndexServer(manifest, workers)
    await shared.sync()
    try:
        index_server.check_private_dir(control.parent)
        control.unlink(missing_ok=True)  # a stale one from a killed process
        listener = await asyncio.start_unix_server(
            lambda r, w: _answer(shared, r, w), path=str(control), limit=MAX_LINE
        )
        os.chmod(control, 0o600)
    except Exception as exc:
        log.error("index.control_failed", error=str(exc), control=str(control))
        await shared.close()
        return 1
    ready = {"event": "shared_index_server_ready", "control": str(control), "pid": os.getpid()}
    print(json.dumps(ready), flush=True)
    try:
        await stop.wait()
    finally:
        log.info("index.shared_server_stopping", clients=len(shared.report()["serving"]))
        listener.close()
        control.unlink(missing_ok=True)
        await shared.close()
    return 0


def serve(manifest: Path, control: Path, workers: int = WORKERS) -> int:
    """Run until SIGINT/SIGTERM."""
    os.umask(0o077)
    return asyncio.run(_serve(manifest, control, workers))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog=f"python -m {children.SHARED_INDEX_SERVER}",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--manifest", type=Path, required=True, help="memd's list of clients")
    parser.add_argument("--control", type=Path, required=True, help="control socket path")
    parser.add_argument("--workers", type=int, default=WORKERS, help="threads for all calls")
    args = startup.start(engine.INDEX_SERVER, parser, argv)
    return serve(args.manifest.absolute(), args.control.absolute(), args.workers)


if __name__ == "__main__":
    sys.exit(main())
