"""Every client's index server in one process: `[supervision] shared_index_server = true`.

Each client keeps exactly what `memd.indexing.index_server` gives it alone: its own
Milvus Lite database in its own data folder (and that folder's lock), its own gRPC
server on its own Unix socket, the unclean-stop sidecar purge and the ready line; so
watchers, recall, forget, rebuild and export do not know the difference. What is shared
is the interpreter: the imports (~85 MB), gRPC's process-wide threads (event engine,
timers) and the Milvus Lite engine's code, which 20 separate servers pay 20 times.

One gRPC server per client, not one server with a port per client: a servicer cannot
tell which socket a call came in on, and the clients' databases must not mix.

memd owns the list of clients: a JSON manifest, `{"clients": {id: {"data_dir": ...,
"socket": ...}}}`, that it rewrites whole. The process reads it at start, so a restart
after a crash brings every client back by itself, and again on each `{"op": "sync"}`
line on its control socket, answering with what serves and what failed. The control
socket is bound only after the start's clients are all opened (or have failed), so
"the control socket answers" is memd's readiness check for the whole process. One
client that cannot open (a locked or broken folder) is reported and skipped; the
others serve.

Run: python -m memd.indexing.shared_index_server --manifest PATH --control PATH
Prints {"event": "index_server_ready", ...} per client as it serves, and
{"event": "shared_index_server_ready", ...} once the control socket answers.
SIGINT/SIGTERM: stop every client's server (2 s grace), close the databases, remove the
sockets.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import socket
import sys
import threading
from pathlib import Path
from typing import Any

import structlog

from memd.indexing import index_server
from memd.indexing.index_server import IndexServer, open_index_server

log = structlog.get_logger()

CONTROL_TIMEOUT = 30.0  # seconds a control connection may take to send its line
MAX_LINE = 64 * 1024
WORKERS = 4  # gRPC worker threads per client (created on demand)


def zygote_preload() -> None:
    """What memd's zygote imports before forking this: the index server's modules."""
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


class SharedIndexServer:
    """The clients' `IndexServer`s, kept in step with the manifest (thread-safe)."""

    def __init__(self, manifest: Path, workers: int = WORKERS) -> None:
        self.manifest = manifest
        self._workers = workers
        self._servers: dict[str, IndexServer] = {}
        self._failed: dict[str, str] = {}
        self._lock = threading.Lock()  # the control thread syncs, the main thread closes
        self._closed = False

    def sync(self) -> dict[str, Any]:
        """Stop the clients no longer listed (or moved), start the new ones; a client
        that failed before is tried again."""
        with self._lock:
            if self._closed:
                return self._report()
            try:
                wanted = read_manifest(self.manifest)
            except (OSError, ValueError, KeyError, TypeError) as exc:
                log.error("index.manifest_unreadable", path=str(self.manifest), error=str(exc))
                return {"ok": False, "error": f"manifest: {exc}", **self._report()}
            for client_id in sorted(set(self._servers) | set(self._failed)):
                server = self._servers.get(client_id)
                place = (server.data_dir, server.socket_path) if server else None
                if client_id not in wanted or (place is not None and place != wanted[client_id]):
                    self._remove(client_id)
            for client_id, (data_dir, sock) in sorted(wanted.items()):
                if client_id not in self._servers:
                    self._add(client_id, data_dir, sock)
            return {"ok": True, **self._report()}

    def _add(self, client_id: str, data_dir: Path, sock: Path) -> None:
        try:
            server = open_index_server(data_dir, sock, self._workers)
        except Exception as exc:
            log.error(
                "index.server_failed", client=client_id, error=str(exc), data_dir=str(data_dir)
            )
            self._failed[client_id] = f"{type(exc).__name__}: {exc}"
            return
        self._failed.pop(client_id, None)
        self._servers[client_id] = server
        print(json.dumps({**server.ready_record(), "client": client_id}), flush=True)

    def _remove(self, client_id: str) -> None:
        self._failed.pop(client_id, None)
        server = self._servers.pop(client_id, None)
        if server is None:
            return
        try:
            server.stop(grace=1.0)
        except Exception:
            log.exception("index.server_stop_failed", client=client_id)
        log.info("index.client_removed", client=client_id)

    def _report(self) -> dict[str, Any]:
        return {"serving": sorted(self._servers), "failed": dict(self._failed)}

    def report(self) -> dict[str, Any]:
        with self._lock:
            return {"ok": True, **self._report()}

    def close(self) -> None:
        """Stop every client's server; later syncs do nothing."""
        with self._lock:
            self._closed = True
            for client_id in sorted(self._servers):
                self._remove(client_id)


def _bind_control(path: Path) -> socket.socket:
    index_server._check_private_dir(path.parent)
    path.unlink(missing_ok=True)  # a stale one from a killed process
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.bind(str(path))
    os.chmod(path, 0o600)
    sock.listen(16)
    return sock


def _answer(shared: SharedIndexServer, conn: socket.socket) -> None:
    """One request line, one answer line; any bad input gets an error answer."""
    conn.settimeout(CONTROL_TIMEOUT)
    with conn, conn.makefile("rwb") as stream:
        line = stream.readline(MAX_LINE)
        try:
            request = json.loads(line)
            op = request.get("op") if isinstance(request, dict) else None
        except ValueError:
            op = None
        if op == "sync":
            answer = shared.sync()
        elif op == "status":
            answer = shared.report()
        else:
            answer = {"ok": False, "error": 'expected {"op": "sync"} or {"op": "status"}'}
        stream.write(json.dumps(answer).encode() + b"\n")
        stream.flush()


def _control_loop(shared: SharedIndexServer, listener: socket.socket) -> None:
    """Serve control requests one at a time until the listener is closed."""
    while True:
        try:
            conn, _ = listener.accept()
        except OSError:
            return  # closed by the main thread on stop
        try:
            _answer(shared, conn)
        except Exception:
            log.exception("index.control_failed")


def serve(manifest: Path, control: Path, workers: int = WORKERS) -> int:
    """Run until SIGINT/SIGTERM; the handlers only set an event."""
    os.umask(0o077)
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    shared = SharedIndexServer(manifest, workers)
    shared.sync()
    try:
        listener = _bind_control(control)
    except Exception as exc:
        log.error("index.control_failed", error=str(exc), control=str(control))
        shared.close()
        return 1
    thread = threading.Thread(
        target=_control_loop, args=(shared, listener), name="index-control", daemon=True
    )
    thread.start()
    ready = {"event": "shared_index_server_ready", "control": str(control), "pid": os.getpid()}
    print(json.dumps(ready), flush=True)
    try:
        stop.wait()
    finally:
        log.info("index.shared_server_stopping", clients=len(shared.report()["serving"]))
        with contextlib.suppress(OSError):
            listener.shutdown(socket.SHUT_RDWR)
        listener.close()
        control.unlink(missing_ok=True)
        shared.close()
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m memd.indexing.shared_index_server",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--manifest", type=Path, required=True, help="memd's list of clients")
    parser.add_argument("--control", type=Path, required=True, help="control socket path")
    parser.add_argument("--workers", type=int, default=WORKERS, help="gRPC workers per client")
    args = parser.parse_args(argv)
    from memd import heap
    from memd.logs import configure_logging

    heap.tune()  # before gRPC's threads start: see memd/heap.py
    configure_logging()
    return serve(args.manifest.absolute(), args.control.absolute(), args.workers)


if __name__ == "__main__":
    sys.exit(main())
