"""Fault injection for tests: our processes, real filesystem faults, floods that note acks.

Filesystem faults are real kernel conditions, not mocks, because the tests run as root
(chmod stops nothing) and memd keeps its files open (a `remount,ro` is refused while a
file is open for writing):

- `tmpfs(path, size)`: a small tmpfs on `path`; `fill()` takes every free byte, so writes
  fail with ENOSPC, and `free()` gives them back.
- `ext4_image(path)`: a loop-mounted ext4 with `errors=remount-ro`; `trigger_error()` makes
  the kernel report a filesystem error, after which it is read-only (EROFS) under every
  open file, as a failing disk does. That only clears with unmount + fsck + mount
  (`repair()`), so whoever holds files on it must let go first.

`mount_unavailable()` says why such a mount cannot be made here (None when it can).
"""

from __future__ import annotations

import contextlib
import errno
import functools
import json
import os
import shutil
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import psutil

from memd.cli.client import ClientError, MemdClient, RemoteError
from memd.markdown.transcript import read_transcript

T = TypeVar("T")


# --- waiting and processes ------------------------------------------------------------------


def wait_for(
    predicate: Callable[[], T], timeout: float = 60.0, step: float = 0.1, what: str = "condition"
) -> T:
    """Poll until `predicate()` is truthy and return it; AssertionError after `timeout`."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not met within {timeout:g} s")
        time.sleep(step)


def processes_mentioning(folder: Path, exclude: tuple[int, ...] = ()) -> list[psutil.Process]:
    """Live (non-zombie) processes whose command line mentions `folder`."""
    found = []
    needle = str(folder)
    for proc in psutil.process_iter(["cmdline", "status"]):
        try:
            if proc.pid in exclude or proc.info["status"] == psutil.STATUS_ZOMBIE:
                continue
            if any(needle in part for part in proc.info["cmdline"] or []):
                found.append(proc)
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return found


def alive(pid: int) -> bool:
    """Running (a zombie has died; only nobody has reaped it yet)."""
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def cmdline(proc: psutil.Process) -> str:
    with contextlib.suppress(psutil.Error):
        return " ".join(proc.cmdline())
    return ""


def children_by_client(
    procs: list[psutil.Process], memory_dir: Path, clients: list[str]
) -> dict[str, dict[str, int]]:
    """{client: {"watcher": n, "index_server": n}} counted from command lines."""
    counts = {c: {"watcher": 0, "index_server": 0} for c in clients}
    for proc in procs:
        line = cmdline(proc)
        for client in clients:
            root = f"{memory_dir / client}/"
            watcher = "memd.indexing.watch" in line or "memsearch" in line
            if watcher and f" watch {root}sessions" in line:
                counts[client]["watcher"] += 1
            elif "memd.indexing.children.index_server" in line and root in line:
                counts[client]["index_server"] += 1
    return counts


# --- talking to a daemon ---------------------------------------------------------------------


def call(
    sock: Path, method: str, params: dict[str, Any] | None = None, timeout: float = 30.0
) -> Any:
    with MemdClient(sock, timeout=timeout) as client:
        return client.call(method, params)


def child_status(sock: Path, client: str, name: str) -> dict[str, Any]:
    """`daemon.status` -> clients.<client>.<name> (index_server / watcher), {} if absent."""
    return call(sock, "daemon.status")["clients"].get(client, {}).get(name) or {}


def pipeline_running(sock: Path, client: str) -> bool:
    status = call(sock, "daemon.status")["clients"].get(client, {})
    return all((status.get(n) or {}).get("state") == "RUNNING" for n in ("index_server", "watcher"))


def recall_finds(sock: Path, client: str, query: str, needle: str) -> bool:
    """True once a recall of `query` returns a section containing `needle`."""
    try:
        result = call(sock, "memory.recall", {"client_id": client, "query": query, "top_k": 10})
    except RemoteError as exc:
        if exc.kind == "index_unavailable":
            return False
        raise
    return any(needle in r["content"] for r in result["results"])


# --- transcripts -----------------------------------------------------------------------------


def user_texts(paths: list[Path]) -> list[str]:
    """Every `**User:**` text in these transcripts, in file order."""
    out = []
    for path in paths:
        for conv in read_transcript(path).conversations:
            for exchange in conv.exchanges:
                out += [p.text for p in exchange.parts if p.label == "User"]
    return out


def part_texts(paths: list[Path], label: str) -> list[str]:
    out = []
    for path in paths:
        for conv in read_transcript(path).conversations:
            for exchange in conv.exchanges:
                out += [p.text for p in exchange.parts if p.label == label]
    return out


def exchange_numbers(path: Path) -> dict[int, list[int]]:
    """Conversation number -> its exchange numbers in file order (continued headers merged)."""
    numbers: dict[int, list[int]] = {}
    for conv in read_transcript(path).conversations:
        numbers.setdefault(conv.number, []).extend(e.number for e in conv.exchanges)
    return numbers


def session_paths(sock: Path, client: str) -> list[Path]:
    sessions = call(sock, "sessions.list", {"client_id": client})["sessions"]
    return [Path(s["path"]) for s in sessions]


# --- floods ----------------------------------------------------------------------------------


@dataclass
class Tally:
    """What a flood sent: acknowledged user texts, refused ones (by error kind), and what
    was in flight when the connection broke (its fate is unknown)."""

    acked: list[str] = field(default_factory=list)
    refused: dict[str, list[str]] = field(default_factory=dict)
    in_flight: list[str] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def ack(self, text: str) -> None:
        with self.lock:
            self.acked.append(text)

    def refuse(self, kind: str, text: str) -> None:
        with self.lock:
            self.refused.setdefault(kind, []).append(text)

    def count(self) -> int:
        with self.lock:
            return len(self.acked)


def exchange_flood(
    sock: Path,
    client: str,
    conv: str,
    tally: Tally,
    stop: threading.Event,
    limit: int = 100_000,
    pause: float = 0.0,
    timeout: float = 60.0,
) -> None:
    """record_exchange one call at a time on one connection until `stop` or a lost
    connection (or a call unanswered for `timeout`); user texts are `<client>/<conv>/u<i>`."""
    try:
        with MemdClient(sock, timeout=timeout) as client_conn:
            for i in range(limit):
                if stop.is_set():
                    return
                text = f"{client}/{conv}/u{i}"
                try:
                    client_conn.call(
                        "memory.record_exchange",
                        {
                            "client_id": client,
                            "conversation_id": conv,
                            "user": text,
                            "assistant": f"reply to {text}",
                        },
                    )
                except RemoteError as exc:
                    tally.refuse(exc.kind or str(exc.code), text)
                except ClientError:
                    tally.in_flight.append(text)
                    return
                else:
                    tally.ack(text)
                if pause:
                    time.sleep(pause)
    except ClientError:
        return


@dataclass
class Chat:
    """One OpenAI-style chat as a gateway sends it: the whole history every call.

    `history` holds only acknowledged turns; `pending` is the call whose answer never
    came (connection lost), to be sent again after a restart.
    """

    client: str
    name: str
    history: list[dict[str, Any]] = field(default_factory=list)
    turns: int = 0
    pending: tuple[list[dict[str, Any]], dict[str, Any]] | None = None
    matches: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        if not self.history:
            self.history = [{"role": "system", "content": f"You are chat {self.name}."}]

    def next_call(self) -> tuple[list[dict[str, Any]], dict[str, Any]]:
        user = {"role": "user", "content": f"{self.client}/{self.name}/q{self.turns}"}
        reply = {"role": "assistant", "content": f"{self.client}/{self.name}/a{self.turns}"}
        return [*self.history, user], reply

    def send(
        self, conn: MemdClient, messages: list[dict[str, Any]], reply: dict[str, Any]
    ) -> dict[str, Any]:
        result = conn.call(
            "memory.record_chat",
            {"client_id": self.client, "messages": messages, "response": reply},
        )
        self.matches.append(result["match"])
        self.history = [*messages, reply]
        self.turns += 1
        self.pending = None
        return result


def chat_flood(
    sock: Path,
    chat: Chat,
    tally: Tally,
    stop: threading.Event,
    limit: int = 100_000,
    timeout: float = 60.0,
) -> None:
    """Continue `chat` one turn per call until `stop`, a lost connection or a call
    unanswered for `timeout`; a refused turn is sent again (as a gateway retries)."""
    try:
        with MemdClient(sock, timeout=timeout) as conn:
            for _ in range(limit):
                if stop.is_set():
                    return
                messages, reply = chat.next_call()
                chat.pending = (messages, reply)
                try:
                    chat.send(conn, messages, reply)
                except RemoteError as exc:
                    tally.refuse(exc.kind or str(exc.code), messages[-1]["content"])
                    chat.pending = None
                    continue
                except ClientError:
                    tally.in_flight.append(messages[-1]["content"])
                    return
                tally.ack(messages[-1]["content"])
    except ClientError:
        return


# --- filesystems -----------------------------------------------------------------------------


def _run(*argv: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(list(argv), capture_output=True, text=True, timeout=60, check=check)


@functools.cache
def mount_unavailable() -> str | None:
    """Why a tmpfs cannot be mounted here (not root, no mount(8), refused); None if it can."""
    if os.geteuid() != 0:
        return "mounting a test filesystem needs root"
    if shutil.which("mount") is None or shutil.which("umount") is None:
        return "mount(8)/umount(8) not installed"
    probe = Path(tempfile.mkdtemp(prefix="memd-mount-probe-"))
    try:
        done = _run("mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(probe), check=False)
        if done.returncode != 0:
            return f"mount -t tmpfs refused: {done.stderr.strip()}"
        _run("umount", str(probe), check=False)
        return None
    finally:
        with contextlib.suppress(OSError):
            probe.rmdir()


@functools.cache
def loop_ext4_unavailable() -> str | None:
    """Why a loop-mounted ext4 with a triggerable error cannot be used here; None if it can."""
    reason = mount_unavailable()
    if reason:
        return reason
    for tool in ("mkfs.ext4", "e2fsck", "findmnt"):
        if shutil.which(tool) is None:
            return f"{tool} not installed"
    folder = Path(tempfile.mkdtemp(prefix="memd-ext4-probe-"))
    try:
        with ext4_image(folder / "mnt", size_mb=8) as image:
            if not image.error_trigger().exists():
                return "this kernel has no /sys/fs/ext4/<dev>/trigger_fs_error"
        return None
    except (OSError, subprocess.SubprocessError) as exc:
        return f"cannot loop-mount an ext4 image: {exc}"
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def umount(path: Path) -> None:
    """Unmount; lazily if something still holds files there (it is gone for new opens)."""
    if _run("umount", str(path), check=False).returncode != 0:
        _run("umount", "-l", str(path), check=False)


@dataclass
class TmpfsMount:
    path: Path
    filler: Path

    def free_bytes(self) -> int:
        st = os.statvfs(self.path)
        return st.f_bavail * st.f_frsize

    def fill(self) -> int:
        """Take every free byte (ENOSPC for everyone); returns the bytes taken."""
        taken = 0
        fd = os.open(self.filler, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        try:
            for chunk in (1 << 20, 1 << 12, 1):
                block = b"\0" * chunk
                while True:
                    try:
                        taken += os.write(fd, block)
                    except OSError as exc:
                        if exc.errno != errno.ENOSPC:
                            raise
                        break
        finally:
            os.close(fd)
        return taken

    def free(self) -> None:
        self.filler.unlink(missing_ok=True)


@contextlib.contextmanager
def tmpfs(path: Path, size: str = "64m") -> Iterator[TmpfsMount]:
    """A tmpfs of `size` on `path` (created if missing), unmounted afterwards."""
    path.mkdir(parents=True, exist_ok=True)
    _run("mount", "-t", "tmpfs", "-o", f"size={size},mode=0700", "tmpfs", str(path))
    try:
        yield TmpfsMount(path, path / "filler.bin")
    finally:
        umount(path)


@contextlib.contextmanager
def read_only_tmpfs(path: Path, size: str = "8m") -> Iterator[Path]:
    """An empty tmpfs on `path`, remounted read-only (possible only while nothing has a
    file open for writing there, so before memd touches it)."""
    with tmpfs(path, size):
        _run("mount", "-o", "remount,ro", str(path))
        yield path


@dataclass
class Ext4Image:
    path: Path
    image: Path

    def device(self) -> str:
        return _run("findmnt", "-n", "-o", "SOURCE", "--target", str(self.path)).stdout.strip()

    def error_trigger(self) -> Path:
        return Path("/sys/fs/ext4") / Path(self.device()).name / "trigger_fs_error"

    def trigger_error(self) -> None:
        """A kernel-reported filesystem error: with errors=remount-ro it turns read-only."""
        self.error_trigger().write_text("memd fault test\n")

    def read_only(self) -> bool:
        """Creating a file fails with EROFS (findmnt may still say `rw,...,emergency_ro`)."""
        probe = self.path / ".memd-fault-probe"
        try:
            probe.touch()
        except OSError as exc:
            if exc.errno == errno.EROFS:
                return True
            raise
        probe.unlink()
        return False

    def repair(self) -> str:
        """Unmount (nothing may hold files there), fsck, mount read-write again."""
        _run("umount", str(self.path))
        done = _run("e2fsck", "-f", "-y", str(self.image), check=False)
        if done.returncode not in (0, 1):  # 1: errors corrected
            raise RuntimeError(f"e2fsck failed ({done.returncode}): {done.stdout}{done.stderr}")
        _mount_ext4(self.image, self.path)
        return done.stdout


def _mount_ext4(image: Path, path: Path) -> None:
    _run("mount", "-o", "loop,errors=remount-ro", str(image), str(path))


@contextlib.contextmanager
def ext4_image(path: Path, size_mb: int = 64) -> Iterator[Ext4Image]:
    """A fresh ext4 image of `size_mb` loop-mounted on `path`, unmounted afterwards."""
    path.mkdir(parents=True, exist_ok=True)
    image = path.with_name(path.name + ".ext4")
    with open(image, "wb") as fh:
        fh.truncate(size_mb << 20)
    _run("mkfs.ext4", "-q", "-F", str(image))
    _mount_ext4(image, path)
    try:
        yield Ext4Image(path, image)
    finally:
        if _run("findmnt", "-n", "--target", str(path), check=False).stdout.strip():
            with contextlib.suppress(subprocess.SubprocessError):
                if (
                    Path(
                        _run("findmnt", "-n", "-o", "TARGET", "--target", str(path)).stdout.strip()
                    )
                    == path
                ):
                    umount(path)
        image.unlink(missing_ok=True)


def dump(obj: Any) -> str:
    """Compact JSON for assertion messages."""
    return json.dumps(obj, default=str)[:2000]
