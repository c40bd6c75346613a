"""Benchmark support: a throwaway memd on a temp folder (bench scripts are not tests).

Besides starting memd, it records bursts through the socket, waits until a client's
watcher has indexed everything on disk, and rebuilds the watcher's command line for the
`memsearch` CLI, so benches measure the real daemon and compare it with the real CLI.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from memd.cli.client import MemdClient, RemoteError
from tests.support.daemon import DaemonProcess, base_config, write_config

# The memory browser as the default config has it: on (at a free port, so runs side by side
# do not collide). The tests' base config turns it off; a bench that measures memd's
# weight must carry what a user's memd carries.
BROWSER_ON = {"ui": {"enabled": True, "listen": "127.0.0.1:0"}}


@contextlib.contextmanager
def running_daemon(folder: Path | None = None, **config: Any) -> Iterator[DaemonProcess]:
    """Start memd with `config` (paths inside a temp folder) and stop it afterwards.

    With MEMD_BENCH_KEEP=1 in the environment the folder (memd.log, transcripts, child
    logs) is kept and its path printed, to look into what a run did. With `folder`, that
    folder is used (and kept): a second daemon can then serve the first one's memory."""
    with _bench_folder() if folder is None else contextlib.nullcontext(str(folder)) as tmp:
        path = write_config(Path(tmp) / "config.toml", base_config(Path(tmp), **config))
        # memd runs in its own session: make a SIGTERM of the bench stop it too.
        previous = signal.signal(signal.SIGTERM, _interrupt)
        proc = DaemonProcess(path)
        try:
            proc.start(timeout=120)
            yield proc
        finally:
            proc.stop()
            signal.signal(signal.SIGTERM, previous)


@contextlib.contextmanager
def _bench_folder() -> Iterator[str]:
    if not os.environ.get("MEMD_BENCH_KEEP"):
        with tempfile.TemporaryDirectory(prefix="memd-bench-") as tmp:
            yield tmp
        return
    tmp = tempfile.mkdtemp(prefix="memd-bench-")
    try:
        yield tmp
    finally:
        print(f"bench folder kept: {tmp}", file=sys.stderr)


def _interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt


def lost_watch_events(proc: DaemonProcess, client_id: str) -> int:
    """Events the client's watcher dropped, from its log: memsearch 0.4.23's own watcher
    drops a file's change while another file is being indexed ("This event loop is
    already running"); memd's `memsearch_watch` wrapper fixes that, so this should be 0."""
    from memd.config import load_config
    from memd.layout import ClientLayout

    log = ClientLayout(load_config(proc.config_path).memory_dir, client_id).logs_dir / "watch.log"
    try:
        return log.read_text(errors="replace").count("This event loop is already running")
    except FileNotFoundError:
        return 0


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    k = min(len(ordered) - 1, max(0, round(q / 100 * (len(ordered) - 1))))
    return ordered[k]


def machine() -> str:
    """One line naming the machine and its load, printed by every bench."""
    load = " ".join(f"{x:.2f}" for x in os.getloadavg())
    return f"python {sys.version.split()[0]}, {os.cpu_count()} cores, load average {load}"


# -- talking to the daemon ----------------------------------------------------------------


class Connections:
    """One socket connection per thread, so a thread pool can send calls in parallel."""

    def __init__(self, proc: DaemonProcess, timeout: float = 60.0) -> None:
        self.proc = proc
        self.timeout = timeout
        self._local = threading.local()
        self._all: list[MemdClient] = []
        self._lock = threading.Lock()

    def call(self, method: str, params: dict[str, Any] | None = None) -> Any:
        client = getattr(self._local, "client", None)
        if client is None:
            client = self.proc.client(self.timeout)
            self._local.client = client
            with self._lock:
                self._all.append(client)
        return client.call(method, params)

    def close(self) -> None:
        with self._lock:
            for client in self._all:
                client.close()
            self._all.clear()


def record_burst(
    conns: Connections,
    client_id: str,
    sessions: Sequence[Sequence[dict[str, Any]]],
    threads: int = 8,
    between: Callable[[], Any] | None = None,
) -> float:
    """Record every session's exchanges (many in flight), closing the session after each.

    Each exchange is a dict with conversation_id, user, assistant and optional timestamp.
    `between` runs after each session is closed (e.g. to wait for the watcher). Returns
    the seconds spent recording, `between` not counted.
    """
    spent = 0.0
    with ThreadPoolExecutor(threads) as pool:
        for exchanges in sessions:
            start = time.perf_counter()
            calls = [
                pool.submit(conns.call, "memory.record_exchange", {"client_id": client_id, **ex})
                for ex in exchanges
            ]
            for call in calls:
                call.result()
            conns.call("sessions.close", {"client_id": client_id})
            spent += time.perf_counter() - start
            if between is not None:
                between()
    return spent


def wait_searchable(proc: DaemonProcess, client_id: str, timeout: float = 120.0) -> None:
    """Until the client's index answers recall (a client just enabled by a config edit
    may first be refused as not started, then as index_unavailable)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            proc.call("memory.recall", {"client_id": client_id, "query": "ping"})
            return
        except RemoteError:
            if time.monotonic() > deadline:
                raise
        time.sleep(0.2)


# -- the index: what should be in it, what is -----------------------------------------------


@dataclass(frozen=True)
class IndexView:
    """A client's index as the watcher and recall see it (pymilvus straight to the socket)."""

    uri: str
    collection: str
    sessions: Path
    max_chunk_size: int = 1500
    overlap_lines: int = 2

    @classmethod
    def of(cls, proc: DaemonProcess, client_id: str) -> IndexView:
        from memd.config import load_config
        from memd.indexing.daemon.plan import index_target
        from memd.indexing.daemon.settings import IndexSettings
        from memd.layout import ClientLayout

        config = load_config(proc.config_path)
        layout = ClientLayout(config.memory_dir, client_id)
        target = index_target(config, layout)
        settings = IndexSettings()
        return cls(
            target.uri,
            target.collection,
            layout.sessions,
            settings.max_chunk_size,
            settings.overlap_lines,
        )

    def client(self) -> Any:
        """A private channel: pymilvus shares channels per URI by default, and a shared one
        the index server has sent GOAWAY (too_many_pings) can fail to reconnect."""
        from pymilvus import MilvusClient

        return MilvusClient(uri=self.uri, timeout=30, dedicated=True)

    def count(self, client: Any) -> int:
        if not client.has_collection(self.collection):
            return 0
        rows = client.query(
            collection_name=self.collection,
            filter="",
            output_fields=["count(*)"],
            consistency_level="Strong",
        )
        return int(rows[0]["count(*)"]) if rows else 0

    def _count_retrying(self, client: Any) -> int:
        from pymilvus.exceptions import MilvusException

        for _ in range(5):
            try:
                return self.count(client)
            except MilvusException:
                time.sleep(0.5)
        return self.count(client)

    def expected(self) -> int:
        """Chunks memsearch's chunker makes of the files now in sessions/ (ids are unique)."""
        from memsearch.chunker import chunk_markdown, compute_chunk_id

        total = 0
        for path in _markdown_files(self.sessions):
            source = str(path.resolve())
            chunks = chunk_markdown(
                path.read_text(encoding="utf-8"),
                source=source,
                max_chunk_size=self.max_chunk_size,
                overlap_lines=self.overlap_lines,
            )
            total += len(
                {
                    compute_chunk_id(c.source, c.start_line, c.end_line, c.content_hash, "m")
                    for c in chunks
                }
            )
        return total

    def wait_complete(
        self, timeout: float = 1800.0, stall: float = 30.0, progress: bool = True
    ) -> tuple[int, float]:
        """Poll until the index holds exactly the chunks of the files on disk.

        Returns (chunks, seconds waited). Raises Stalled when the count has not moved
        for `stall` seconds (a dropped watcher event never comes back by itself).
        """
        start = time.monotonic()
        want = self.expected()
        client = self.client()
        try:
            last_print, moved, seen = 0.0, start, -1
            while True:
                have = self._count_retrying(client)
                now = time.monotonic()
                if have == want:
                    return have, now - start
                if have != seen:
                    seen, moved = have, now
                if now - moved > stall:
                    raise Stalled(have, want)
                if now - start > timeout:
                    raise TimeoutError(f"index has {have} of {want} chunks after {timeout} s")
                if progress and now - last_print > 10:
                    print(
                        f"    indexing: {have}/{want} chunks after {now - start:.0f} s", flush=True
                    )
                    last_print = now
                time.sleep(0.05 if want - have < 50 else 0.5)
        finally:
            client.close()


class Stalled(Exception):
    """The index stopped short of the files on disk."""

    def __init__(self, have: int, want: int) -> None:
        super().__init__(f"index stalled at {have} of {want} chunks")
        self.have = have
        self.want = want


def restart_watcher(proc: DaemonProcess, client_id: str, timeout: float = 120.0) -> None:
    """SIGKILL the client's watcher; memd's supervisor starts a new one, which indexes
    everything that changed since (memsearch's start-up scan)."""
    old = proc.call("daemon.status")["clients"][client_id]["watcher"]["pid"]
    os.kill(old, signal.SIGKILL)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        watcher = proc.call("daemon.status")["clients"][client_id]["watcher"]
        if watcher["pid"] not in (None, old) and watcher["state"] == "RUNNING":
            return
        time.sleep(0.2)
    raise TimeoutError(f"watcher of {client_id} did not come back")


def wait_indexed(
    proc: DaemonProcess, view: IndexView, client_id: str, progress: bool = True
) -> tuple[int, float, int]:
    """`view.wait_complete`, restarting the watcher when the index stalls.

    Returns (chunks, seconds waited, watcher restarts).
    """
    start = time.monotonic()
    restarts = 0
    while True:
        try:
            chunks, _ = view.wait_complete(progress=progress)
            return chunks, time.monotonic() - start, restarts
        except Stalled as exc:
            if restarts >= 3:
                raise
            print(
                f"    {exc}; memsearch watch dropped {lost_watch_events(proc, client_id)} "
                "events so far: restarting the watcher",
                flush=True,
            )
            restart_watcher(proc, client_id)
            restarts += 1


def _markdown_files(folder: Path) -> Iterable[Path]:
    return sorted(p for p in folder.rglob("*.md") if p.is_file())


# -- the memsearch command line the watcher runs --------------------------------------------


@dataclass(frozen=True)
class MemsearchCli:
    """`python -m memsearch` with the watcher's settings: its options, environment and folder."""

    options: tuple[str, ...]
    env: dict[str, str]
    cwd: Path

    @classmethod
    def of_watcher(cls, proc: DaemonProcess, client_id: str) -> MemsearchCli:
        """Read the running watcher's argv, environment and cwd from /proc."""
        status = proc.call("daemon.status")["clients"][client_id]
        pid = status["watcher"]["pid"]
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().decode().split("\0")[:-1]
        environ = Path(f"/proc/{pid}/environ").read_bytes().decode().split("\0")
        env = dict(item.split("=", 1) for item in environ if "=" in item)
        cwd = Path(os.readlink(f"/proc/{pid}/cwd"))
        # argv: python -m memsearch watch <sessions> --provider ... ; keep the options.
        at = argv.index("watch")
        return cls(tuple(argv[at + 2 :]), env, cwd)

    def argv(self, command: str, *args: str) -> list[str]:
        return [sys.executable, "-m", "memsearch", command, *args, *self.options]
