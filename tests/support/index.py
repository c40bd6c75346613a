"""A real per-client index for tests: index server + `memsearch watch` + an IndexSearcher.

Built from memd's own command lines (`memd.indexing.daemon.plan`), so the tests index exactly as the
daemon does: the embedded model served by the real embedder child (`tests.support.embedder`,
reached through memsearch's `memd` provider), one
`python -m memd.indexing.children.index_server` per client on a Unix socket, one
`memsearch watch` on the
client's `sessions/`. `wait_for` polls the real search until the watcher has caught up;
`rows` reads the collection's chunks directly, to check exactly what is indexed.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

from memd.config import Config, parse_config
from memd.indexing.children import index_ready
from memd.indexing.daemon.maintenance import watcher_ready
from memd.indexing.daemon.plan import (
    index_server_command,
    index_target,
    memsearch_toml,
    watcher_command,
)
from memd.indexing.daemon.settings import Command, ensure_dirs
from memd.indexing.query.search import IndexSearcher, IndexUnavailableError
from memd.indexing.targets import Endpoint
from memd.layout import ClientLayout, write_memsearch_toml
from tests.support.embedding import EMBEDDER

T = TypeVar("T")


def client_config(memory_dir: Path, *client_ids: str) -> Config:
    """A config with memory on for each of `client_ids` (embedded model, local index)."""
    return parse_config(
        {
            "memory_dir": str(memory_dir),
            "clients": {cid: {"memory_enabled": True, "mode": "both"} for cid in client_ids},
        }
    )


class _Child:
    """One spawned command in its own process group, output to a log file."""

    def __init__(self, command: Command, log_path: Path) -> None:
        self.log_path = log_path
        with open(log_path, "ab") as log:
            self.proc = subprocess.Popen(
                list(command.argv),
                env=dict(command.env),
                cwd=str(command.cwd),
                stdout=log,
                stderr=log,
                start_new_session=True,
            )

    def alive(self) -> bool:
        return self.proc.poll() is None

    def stop(self, sig: int = signal.SIGINT, timeout: float = 15.0) -> None:
        """SIGINT first (memsearch watch cleans up only on KeyboardInterrupt), then SIGKILL."""
        if self.proc.poll() is not None:
            return
        try:
            os.killpg(self.proc.pid, sig)
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(5)
        except ProcessLookupError:
            pass

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-8000:]
        except FileNotFoundError:
            return ""


class ClientIndex:
    """Everything one client's recall needs, started for real; `stop()` always cleans up."""

    def __init__(self, config: Config, client_id: str, endpoint: Endpoint) -> None:
        self.config = config
        self.layout = ClientLayout(config.memory_dir, client_id)
        self._endpoint = endpoint  # the embedder child's (tests.support.embedder)
        self.index_server: _Child | None = None
        self.watcher: _Child | None = None
        self.searcher: IndexSearcher | None = None
        self._milvus: Any = None  # a plain pymilvus client for `rows`

    def start(self, timeout: float = 60.0) -> ClientIndex:
        ensure_dirs(self.layout)
        write_memsearch_toml(self.layout, memsearch_toml(self.config, self.layout))
        self.start_index_server(timeout)
        self.watcher = _Child(
            watcher_command(self.config, self.layout, self._endpoint),
            self.layout.logs_dir / "watcher.log",
        )
        self.searcher = IndexSearcher(
            index_target(self.config, self.layout),
            self.config.embedding,
            root=self.layout.root,
            embedder=EMBEDDER,
        )
        return self

    def start_index_server(self, timeout: float = 60.0) -> None:
        command = index_server_command(self.config, self.layout)
        assert command is not None, "tests run the local (Milvus Lite) mode"
        self.index_server = _Child(command, self.layout.logs_dir / "index-server.log")
        socket_path = Path(index_target(self.config, self.layout).uri.removeprefix("unix:"))
        deadline = time.monotonic() + timeout
        while not index_ready(socket_path):
            if not self.index_server.alive():
                raise RuntimeError(f"index server died:\n{self.index_server.log()}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"index server not ready:\n{self.index_server.log()}")
            time.sleep(0.05)

    def wait_for(self, probe: Callable[[IndexSearcher], T | None], timeout: float = 60.0) -> T:
        """Poll `probe(searcher)` until it returns something truthy (the watcher caught up)."""
        assert self.searcher is not None
        deadline = time.monotonic() + timeout
        last: Any = None
        while time.monotonic() < deadline:
            if self.watcher is not None and not self.watcher.alive():
                raise RuntimeError(f"watcher died:\n{self.watcher.log()}")
            try:
                last = probe(self.searcher)
            except IndexUnavailableError as exc:
                last = exc
            if last:
                return last
            time.sleep(0.2)
        watcher_log = self.watcher.log() if self.watcher else ""
        raise TimeoutError(f"index did not catch up (last probe: {last!r}):\n{watcher_log}")

    def wait_rows(self, at_least: int, timeout: float = 60.0) -> int:
        return self.wait_for(lambda s: (n := s.count(timeout=5)) >= at_least and n, timeout)

    def wait_watching(self, timeout: float = 60.0) -> None:
        """Until the watcher has done its initial scan and watches `sessions/`."""
        assert self.watcher is not None
        deadline = time.monotonic() + timeout
        # The log line comes before memsearch's observer starts (see watcher_ready): a
        # file written in between would not be indexed, so wait for the inotify watch too.
        while "Watching" not in self.watcher.log() or not watcher_ready(
            self.watcher.proc.pid, self.layout.sessions
        ):
            if not self.watcher.alive():
                raise RuntimeError(f"watcher died:\n{self.watcher.log()}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"watcher not watching:\n{self.watcher.log()}")
            time.sleep(0.1)

    def rows(
        self,
        fields: Sequence[str] = ("source", "heading", "content"),
    ) -> list[dict[str, Any]]:
        """Every chunk in the client's collection ([] before anything was indexed)."""
        from pymilvus import MilvusClient

        if self.watcher is not None and not self.watcher.alive():
            raise RuntimeError(f"watcher died:\n{self.watcher.log()}")
        target = index_target(self.config, self.layout)
        if self._milvus is None:
            self._milvus = MilvusClient(uri=target.uri, token=target.token)
        if not self._milvus.has_collection(target.collection):
            return []
        return self._milvus.query(
            target.collection, filter='chunk_hash != ""', output_fields=list(fields), limit=10_000
        )

    def stop(self) -> None:
        if self._milvus is not None:
            self._milvus.close()
            self._milvus = None
        if self.searcher is not None:
            self.searcher.close()
            self.searcher = None
        for child in (self.watcher, self.index_server):
            if child is not None:
                child.stop()
        self.watcher = self.index_server = None


def daemon_index_contents(config_path: Path, runtime: str, client_id: str) -> list[str]:
    """Every chunk's text in a running daemon's index of `client_id`, read through the
    client's own index socket ([] before anything was indexed). `runtime` is the daemon's
    $XDG_RUNTIME_DIR, where a long socket path is moved to."""
    from pymilvus import MilvusClient

    from memd.config import load_config

    config = load_config(config_path)
    before = os.environ.get("XDG_RUNTIME_DIR")
    os.environ["XDG_RUNTIME_DIR"] = runtime
    try:
        target = index_target(config, ClientLayout(config.memory_dir, client_id))
    finally:
        if before is None:
            os.environ.pop("XDG_RUNTIME_DIR", None)
        else:
            os.environ["XDG_RUNTIME_DIR"] = before
    milvus = MilvusClient(uri=target.uri, token=target.token)
    try:
        if not milvus.has_collection(target.collection):
            return []
        rows = milvus.query(
            target.collection, filter='chunk_hash != ""', output_fields=["content"], limit=16_384
        )
    finally:
        milvus.close()
    return [str(row["content"]) for row in rows]
