"""Compaction: summarise ended sessions, archive their transcripts, restore and re-compact them.

On disk, for session S of a client (paths relative to the client root):

1. the summary is written to `.memd/tmp/`, fsynced, and moved to `sessions/S-summary.md`
   (a file moved in from outside the watched tree is a *create* for memsearch's watcher;
   a rename inside it would be ignored), then `sessions/` is fsynced;
2. the transcript moves from `sessions/S.md` to `archive/S.md` (a *delete* for the
   watcher, which drops its chunks), then both folders are fsynced.

A crash between any two steps leaves complete files only, and running the compaction
again converges: the summary records the SHA-256 of the transcript it was made from, so
a summary that is already in place for an unchanged transcript is not asked for again
and only the move is left to do. An LLM failure happens before step 1 and changes
nothing on disk. `restore` undoes 1-2 (transcript back first, so the session never
leaves recall, then the summary is removed) and records its intent first, so an
interrupted restore is finished when the client is opened again.

Per-session state (pending, failed + attempts + next retry, compacted, ...) lives in the
client's own `<root>/.memd/compaction.sqlite3`, so pending and failed compactions resume
after a restart. The `Compactor` runs compactions off the request path with a bound on
how many run at once, and retries failures with exponential backoff.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import inspect
import json
import os
import re
import sqlite3
import tempfile
import threading
import time
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass, field, replace
from datetime import UTC, datetime
from functools import partial
from pathlib import Path
from typing import Any

import structlog

from memd import llm
from memd.config import CompactionConfig
from memd.layout import ClientLayout
from memd.transcript import fsync_dir, heading_time, iso, parse_exchange_title

log = structlog.get_logger()

STATE_FILE = "compaction.sqlite3"
TMP_PREFIX = "compaction."
_HEADING_RE = re.compile(r"^(#{1,6})\s+(.+)$")  # memsearch's chunker splits exactly here
_FENCE_RE = re.compile(r"^ {0,3}(`{3,}|~{3,})")
_PLAIN_RE = re.compile(r"^[A-Za-z0-9_.:/+-]*$")
_TIME = r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC"
_SPAN_RE = re.compile(rf"({_TIME}) – ({_TIME})")
_BREAKS_RE = re.compile("\r\n|[\r\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029]")

CompactedHook = Callable[[str, str], Awaitable[None] | None]
Progress = Callable[[int, int, str], Awaitable[None] | None]


class CompactionStates:
    """Where a session's compaction stands; import-free names shown by status."""

    PENDING = "pending"  # due to run (now, or once compaction is enabled)
    FAILED = "failed"  # the last attempt failed; retried at next_retry
    COMPACTED = "compacted"  # summary in sessions/, transcript in archive/
    RESTORING = "restoring"  # a restore was started; finished when the client reopens
    MISSING = "missing"  # the transcript is gone (deleted by the user): nothing to do


S = CompactionStates
# None: no record (never submitted, or reset by a restore).
_ALLOWED: dict[str | None, frozenset[str | None]] = {
    None: frozenset({S.PENDING, S.COMPACTED, S.RESTORING}),
    S.PENDING: frozenset({S.PENDING, S.FAILED, S.COMPACTED, S.MISSING, S.RESTORING}),
    S.FAILED: frozenset({S.PENDING, S.RESTORING}),
    S.COMPACTED: frozenset({S.PENDING, S.COMPACTED, S.RESTORING}),
    S.MISSING: frozenset({S.PENDING, S.COMPACTED, S.RESTORING}),
    S.RESTORING: frozenset({None, S.RESTORING}),
}


class TranscriptChanged(Exception):
    """The transcript changed while it was being summarised; the summary is stale."""


@dataclass(frozen=True)
class Backoff:
    """Delay before retry n (1-based): base * factor**(n-1), at most cap."""

    base: float = 60.0
    cap: float = 3600.0
    factor: float = 2.0

    def delay(self, attempts: int) -> float:
        return min(self.cap, self.base * self.factor ** max(0, attempts - 1))


@dataclass
class Record:
    """One session's compaction state, as stored in compaction.sqlite3."""

    session_id: str
    state: str
    attempts: int = 0  # failed attempts since it was submitted
    last_error: str | None = None
    next_retry: float | None = None
    updated: float = 0.0
    compacted_at: float | None = None
    llm_provider: str | None = None
    llm_model: str | None = None
    parts: int = 0
    requests: int = 0

    def public(self, layout: ClientLayout, running: bool = False) -> dict[str, Any]:
        """What sessions.list and status show for this session."""
        out = asdict(self)
        out["running"] = running
        for key in ("updated", "compacted_at", "next_retry"):
            out[key] = iso(out[key]) if out[key] is not None else None
        if self.state == S.COMPACTED:
            out["summary_path"] = str(layout.summary_file(self.session_id))
            out["archive_path"] = str(layout.archive_file(self.session_id))
        return out


_COLUMNS = [f.name for f in Record.__dataclass_fields__.values()]
_SCHEMA = """
CREATE TABLE IF NOT EXISTS compaction (
    session_id TEXT PRIMARY KEY, state TEXT NOT NULL, attempts INTEGER NOT NULL DEFAULT 0,
    last_error TEXT, next_retry REAL, updated REAL NOT NULL, compacted_at REAL,
    llm_provider TEXT, llm_model TEXT, parts INTEGER NOT NULL DEFAULT 0,
    requests INTEGER NOT NULL DEFAULT 0);
"""


class Store:
    """One client's `.memd/compaction.sqlite3`: its own file, so no schema is shared."""

    def __init__(self, layout: ClientLayout) -> None:
        layout.state_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        path = layout.state_dir / STATE_FILE
        os.close(os.open(path, os.O_RDWR | os.O_CREAT, 0o600))  # private; -wal/-shm follow it
        self.db = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
        self.db.execute("PRAGMA journal_mode=WAL")
        # NORMAL: a lost last commit only means a compaction runs again, and that converges.
        self.db.execute("PRAGMA synchronous=NORMAL")
        self.db.executescript(_SCHEMA)
        self._lock = threading.Lock()

    def load(self) -> dict[str, Record]:
        with self._lock:
            rows = self.db.execute(f"SELECT {', '.join(_COLUMNS)} FROM compaction").fetchall()
        return {row[0]: Record(*row) for row in rows}

    def put(self, rec: Record) -> None:
        marks = ", ".join("?" * len(_COLUMNS))
        with self._lock:
            self.db.execute(f"INSERT OR REPLACE INTO compaction ({', '.join(_COLUMNS)})"
                            f" VALUES ({marks})", tuple(asdict(rec).values()))

    def delete(self, session_id: str) -> None:
        with self._lock:
            self.db.execute("DELETE FROM compaction WHERE session_id = ?", (session_id,))

    def close(self) -> None:
        with self._lock:
            self.db.close()


# --- the summary file -------------------------------------------------------------------


def render_summary(client_id: str, session_id: str, body: str, *, start: datetime,
                   end: datetime, compacted_at: float, provider: str, model: str,
                   parts: int, source_sha256: str) -> str:
    """The summary file: front matter, a dated title, the LLM's text with dated headings.

    memsearch's chunker splits at every `#`..`######` line and keeps the heading as the
    chunk's label, so every heading starts with the session's time range: BM25 finds a
    date, and recall can filter by time (`parse_summary_title`; the range sorts as text
    like exchange headings do). Headings in the LLM's text move one level down under the
    title; `#` lines inside code fences are escaped so code never splits a chunk.
    """
    span = f"{heading_time(start)} – {heading_time(end)}"
    meta = {
        "client_id": client_id, "session_id": session_id,
        "summary_of": f"sessions/{session_id}.md", "archive": f"archive/{session_id}.md",
        "started": iso(start.timestamp()), "ended": iso(end.timestamp()),
        "compacted_at": iso(compacted_at), "llm_provider": provider, "llm_model": model,
        "parts": str(parts), "source_sha256": source_sha256,
    }
    front = "".join(f"{k}: {_yaml_value(v)}\n" for k, v in meta.items())
    return f"---\n{front}---\n\n# {span} · session summary\n\n{shape_body(body, span)}\n"


def shape_body(text: str, span: str) -> str:
    """The LLM's markdown, with headings demoted and dated, and code fences made inert."""
    out: list[str] = []
    fence: str | None = None
    for line in _BREAKS_RE.sub("\n", text).strip().split("\n"):
        if m := _FENCE_RE.match(line):
            mark = m.group(1)
            if fence is None:
                fence = mark
            elif mark[0] == fence[0] and len(mark) >= len(fence):
                fence = None
        elif (m := _HEADING_RE.match(line)) and fence is None:
            level = min(6, len(m.group(1)) + 1)
            line = f"{'#' * level} {span} · summary · {m.group(2).strip()}"
        elif _HEADING_RE.match(line) or line == "---":
            line = "\\" + line
        out.append(line)
    return "\n".join(out)


def parse_summary_title(title: str) -> tuple[datetime, datetime] | None:
    """The time range a summary heading (chunk heading text, without `#`) covers."""
    m = _SPAN_RE.search(title)
    if not m or "summary" not in title:
        return None
    start, end = (datetime.strptime(g, "%Y-%m-%d %H:%M:%S UTC").replace(tzinfo=UTC)
                  for g in m.groups())
    return start, end


def read_front_matter(text: str) -> dict[str, str]:
    lines = text.split("\n")
    if not lines or lines[0] != "---":
        return {}
    meta: dict[str, str] = {}
    for line in lines[1:]:
        if line == "---":
            return meta
        key, _, value = line.partition(":")
        value = value.strip()
        if value.startswith('"'):
            with contextlib.suppress(ValueError):
                value = json.loads(value)
        meta[key.strip()] = value
    return {}


def _yaml_value(value: str) -> str:
    return value if _PLAIN_RE.match(value) else json.dumps(value, ensure_ascii=False)


def _split_front_matter(text: str) -> tuple[dict[str, str], str]:
    meta = read_front_matter(text)
    if not meta:
        return {}, text
    end = text.find("\n---\n", 4)
    return meta, text[end + 5:] if end >= 0 else ""


def _span(body: str, meta: dict[str, str], fallback: float) -> tuple[datetime, datetime]:
    """First and last exchange time; else the front matter's start; else the file time."""
    times = [parsed[0] for line in body.split("\n") if line.startswith("## ")
             and (parsed := parse_exchange_title(line[3:]))]
    if times:
        return min(times), max(times)
    try:
        start = datetime.strptime(meta.get("started", ""), "%Y-%m-%dT%H:%M:%SZ")
        start = start.replace(tzinfo=UTC)
    except ValueError:
        start = datetime.fromtimestamp(fallback, UTC)
    return start, start


# --- file steps (blocking; run in threads, one client's steps at a time) ------------------

_LOCKS: dict[Path, threading.Lock] = {}
_LOCKS_GUARD = threading.Lock()


def _files_lock(layout: ClientLayout) -> threading.Lock:
    """Serialises one client's file moves, also against a step a cancelled task left running."""
    with _LOCKS_GUARD:
        return _LOCKS.setdefault(layout.root, threading.Lock())


def _read(path: Path) -> bytes | None:
    try:
        return path.read_bytes()
    except FileNotFoundError:
        return None


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def summary_meta(layout: ClientLayout, session_id: str) -> dict[str, str]:
    """The front matter of the session's summary, or {} when there is none."""
    data = _read(layout.summary_file(session_id))
    return read_front_matter(data.decode("utf-8", "replace")) if data else {}


def _install_summary(layout: ClientLayout, session_id: str, text: str, source: Path,
                     digest: str) -> None:
    """Steps 1: temp file in .memd/tmp, fsync, move into sessions/, fsync the folder."""
    with _files_lock(layout):
        data = _read(source)
        if data is None or _sha256(data) != digest:
            raise TranscriptChanged(f"{source.name} changed while it was summarised")
        layout.tmp_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=layout.tmp_dir, prefix=f"{TMP_PREFIX}{session_id}.",
                                   suffix=".tmp")
        try:
            with os.fdopen(fd, "wb") as fh:
                fh.write(text.encode("utf-8"))
                fh.flush()
                os.fsync(fh.fileno())
            os.chmod(tmp, 0o600)
            os.replace(tmp, layout.summary_file(session_id))
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        fsync_dir(layout.sessions)


def _archive_transcript(layout: ClientLayout, session_id: str, digest: str) -> None:
    """Step 2: move the transcript the summary was made from to archive/, fsync both."""
    with _files_lock(layout):
        live, dest = layout.session_file(session_id), layout.archive_file(session_id)
        data = _read(live)
        if data is None:
            return  # already moved
        if _sha256(data) != digest:
            raise TranscriptChanged(f"{live.name} changed after it was summarised")
        layout.archive.mkdir(mode=0o700, parents=True, exist_ok=True)
        _set_aside(dest)
        os.replace(live, dest)
        fsync_dir(layout.archive)
        fsync_dir(layout.sessions)


def _set_aside(path: Path) -> None:
    """Keep an existing, different file at `path` as `<name>.prev-N` (never lose a transcript)."""
    if not path.exists():
        return
    n = 1
    while (aside := path.with_name(f"{path.name}.prev-{n}")).exists():
        n += 1
    os.replace(path, aside)
    log.warning("compaction.archive_set_aside", path=str(path), aside=str(aside))


def restore_files(layout: ClientLayout, session_id: str) -> str:
    """Transcript from archive/ back into sessions/, then the summary removed.

    Returns "restored", or "missing" when no transcript exists in either folder (then
    the summary, the only trace left, is kept). Idempotent.
    """
    with _files_lock(layout):
        live, arch = layout.session_file(session_id), layout.archive_file(session_id)
        summary = layout.summary_file(session_id)
        if arch.exists():
            if live.exists():  # both: the live one is the newer; keep the other aside
                _set_aside(arch)
            else:
                os.replace(arch, live)  # moved in from outside: a create for the watcher
                fsync_dir(layout.sessions)
            fsync_dir(layout.archive)
        elif not live.exists():
            return "missing"
        if summary.exists():
            summary.unlink()  # a delete for the watcher: its chunks are dropped
            fsync_dir(layout.sessions)
        return "restored"


def sweep_tmp(layout: ClientLayout) -> int:
    """Remove summary temp files a crash left behind (only ours: other modules share tmp/)."""
    removed = 0
    for path in layout.tmp_dir.glob(f"{TMP_PREFIX}*.tmp"):
        path.unlink(missing_ok=True)
        removed += 1
    return removed


# --- one compaction -------------------------------------------------------------------------


@dataclass
class Outcome:
    """What one compaction or re-compaction did."""

    session_id: str
    result: str  # compacted | already | missing | recompacted | not_compacted
    parts: int = 0
    requests: int = 0
    largest_request: int = 0
    llm_provider: str | None = None
    llm_model: str | None = None
    compacted_at: float | None = None


async def compact_session(layout: ClientLayout, session_id: str, settings: llm.LLMSettings,
                          *, max_request_chars: int = llm.DEFAULT_MAX_REQUEST_CHARS,
                          clock: Callable[[], float] = time.time) -> Outcome:
    """Summarise an ended session and archive its transcript; safe to run again after a crash.

    Raises llm.LLMError (nothing on disk changed), TranscriptChanged or OSError.
    """
    live = layout.session_file(session_id)
    data = await asyncio.to_thread(_read, live)
    if data is None:
        if not await asyncio.to_thread(layout.archive_file(session_id).exists):
            return Outcome(session_id, "missing")
        meta = await asyncio.to_thread(summary_meta, layout, session_id)
        return Outcome(session_id, "already", llm_provider=meta.get("llm_provider"),
                       llm_model=meta.get("llm_model"))
    digest = _sha256(data)
    meta = await asyncio.to_thread(summary_meta, layout, session_id)
    if meta.get("source_sha256") == digest:  # a crash came after step 1: only the move is left
        out = Outcome(session_id, "compacted", llm_provider=meta.get("llm_provider"),
                      llm_model=meta.get("llm_model"), compacted_at=clock())
    else:
        text, out = await _summarise(layout, session_id, data, live, settings,
                                     max_request_chars, clock)
        await asyncio.to_thread(_install_summary, layout, session_id, text, live, digest)
    await asyncio.to_thread(_archive_transcript, layout, session_id, digest)
    log.info("compaction.done", client=layout.client_id, session=session_id, parts=out.parts,
             requests=out.requests)
    return out


async def recompact_session(layout: ClientLayout, session_id: str, settings: llm.LLMSettings,
                            *, max_request_chars: int = llm.DEFAULT_MAX_REQUEST_CHARS,
                            clock: Callable[[], float] = time.time) -> Outcome:
    """Summarise a compacted session again from archive/ and replace its summary atomically."""
    if await asyncio.to_thread(layout.session_file(session_id).exists):
        return Outcome(session_id, "not_compacted")  # live in sessions/: not ours to touch
    arch = layout.archive_file(session_id)
    data = await asyncio.to_thread(_read, arch)
    if data is None:
        return Outcome(session_id, "missing")
    text, out = await _summarise(layout, session_id, data, arch, settings, max_request_chars,
                                 clock)
    await asyncio.to_thread(_install_summary, layout, session_id, text, arch, _sha256(data))
    log.info("compaction.recompacted", client=layout.client_id, session=session_id,
             parts=out.parts, requests=out.requests)
    return replace(out, result="recompacted")


async def _summarise(layout: ClientLayout, session_id: str, data: bytes, source: Path,
                     settings: llm.LLMSettings, max_request_chars: int,
                     clock: Callable[[], float]) -> tuple[str, Outcome]:
    meta, body = _split_front_matter(data.decode("utf-8", "replace"))
    body = body.lstrip("\n")
    start, end = _span(body, meta, (await asyncio.to_thread(source.stat)).st_mtime)
    span = f"{heading_time(start)} – {heading_time(end)}"
    if body.strip():
        result = await llm.summarize(body, partial(llm.complete, settings), span=span,
                                     max_request_chars=max_request_chars)
    else:  # nothing was said: no reason to ask anyone
        result = llm.Summary("This session recorded no messages.", parts=0)
    now = clock()
    text = render_summary(layout.client_id, session_id, result.text, start=start, end=end,
                          compacted_at=now, provider=settings.provider, model=settings.model,
                          parts=result.parts, source_sha256=_sha256(data))
    out = Outcome(session_id, "compacted", parts=result.parts, requests=result.requests,
                  largest_request=result.largest_request, llm_provider=settings.provider,
                  llm_model=settings.model, compacted_at=now)
    return text, out


def restore(layout: ClientLayout, session_id: str) -> str:
    """Undo a compaction without a running Compactor (tools, tests); see Compactor.restore.

    Records the intent first, so a crash midway is finished by the next Compactor that
    opens this client. Returns "restored" or "missing".
    """
    store = Store(layout)
    try:
        now = time.time()
        rec = store.load().get(session_id) or Record(session_id, S.RESTORING)
        store.put(replace(rec, state=S.RESTORING, updated=now))
        result = restore_files(layout, session_id)
        store.delete(session_id)
        return result
    finally:
        store.close()


# --- the service ----------------------------------------------------------------------------

Key = tuple[str, str]  # (client_id, session_id)


@dataclass
class _Client:
    layout: ClientLayout
    store: Store
    records: dict[str, Record] = field(default_factory=dict)


class Compactor:
    """Runs compactions off the request path: a queue, `max_concurrent` workers, retries.

    Every timing decision is made in `step(now)`; `start()` runs a scheduler that calls it
    when the next retry is due (tests may start without it and call `step` themselves).
    """

    def __init__(self, config: CompactionConfig, *, max_concurrent: int = 1,
                 timeout: float = llm.DEFAULT_TIMEOUT,
                 max_request_chars: int = llm.DEFAULT_MAX_REQUEST_CHARS,
                 backoff: Backoff | None = None, clock: Callable[[], float] = time.time,
                 on_compacted: CompactedHook | None = None) -> None:
        if max_concurrent < 1:
            raise ValueError("max_concurrent must be at least 1")
        if max_request_chars < llm.MIN_REQUEST_CHARS:
            raise ValueError(f"max_request_chars must be at least {llm.MIN_REQUEST_CHARS}")
        self.config = config
        self.max_concurrent = max_concurrent
        self.timeout = timeout
        self.max_request_chars = max_request_chars
        self.backoff = backoff or Backoff()
        self.on_compacted = on_compacted
        self._clock = clock
        self._clients: dict[str, _Client] = {}
        self._queue: asyncio.Queue[Key] = asyncio.Queue()
        self._queued: set[Key] = set()
        self._due: dict[Key, float] = {}
        self._running: dict[Key, asyncio.Task[None]] = {}
        self._sem = asyncio.Semaphore(max_concurrent)
        self._wake = asyncio.Event()
        self._open_lock = asyncio.Lock()
        self._tasks: list[asyncio.Task[None]] = []

    # --- lifecycle ------------------------------------------------------------------------

    async def start(self, *, schedule: bool = True) -> Compactor:
        await llm.warm_up(self.config.llm_provider)
        self._tasks = [asyncio.create_task(self._worker(), name=f"compaction-worker-{i}")
                       for i in range(self.max_concurrent)]
        if schedule:
            self._tasks.append(asyncio.create_task(self._scheduler(), name="compaction-timer"))
        return self

    async def close(self) -> None:
        """Stop everything; interrupted compactions stay pending and resume on next start."""
        jobs = list(self._running.values())
        for task in [*self._tasks, *jobs]:
            task.cancel()
        await asyncio.gather(*self._tasks, *jobs, return_exceptions=True)
        self._tasks = []
        for client in self._clients.values():
            client.store.close()
        self._clients.clear()

    def set_config(self, config: CompactionConfig) -> None:
        """A config reload: the next LLM call uses it; enabling lets due work run."""
        self.config = config
        self._wake.set()

    def settings(self) -> llm.LLMSettings:
        return llm.LLMSettings.from_config(self.config, self.timeout)

    async def open_client(self, layout: ClientLayout) -> None:
        """Load the client's state: finish interrupted restores, queue what was pending."""
        async with self._open_lock:
            if layout.client_id not in self._clients:
                await self._open(layout)

    async def _open(self, layout: ClientLayout) -> None:
        store = await asyncio.to_thread(Store, layout)
        records = await asyncio.to_thread(store.load)
        layout.tmp_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        await asyncio.to_thread(sweep_tmp, layout)
        client = self._clients[layout.client_id] = _Client(layout, store, records)
        for rec in list(records.values()):
            key = (layout.client_id, rec.session_id)
            if rec.state == S.RESTORING:
                await self._restore(client, rec.session_id)
            elif rec.state == S.PENDING:
                self._due[key] = self._clock()
            elif rec.state == S.FAILED:
                self._due[key] = rec.next_retry or self._clock()
        self._wake.set()
        log.info("compaction.client_opened", client=layout.client_id, records=len(records))

    async def close_client(self, client_id: str) -> None:
        """The client was disabled or removed: stop its work (its state stays on disk)."""
        client = self._clients.pop(client_id, None)
        if client is None:
            return
        for key in [k for k in self._running if k[0] == client_id]:
            await _cancel(self._running[key])
        for key in [k for k in self._due if k[0] == client_id]:
            del self._due[key]
        self._queued -= {k for k in self._queued if k[0] == client_id}
        client.store.close()

    def on_end_hook(self, layout: ClientLayout) -> Callable[[dict[str, Any]], Awaitable[None]]:
        """For ClientSessions(on_end=[...]): compact the session that ended, if enabled."""

        async def on_end(info: dict[str, Any]) -> None:
            if self.config.enabled:
                await self.open_client(layout)
                await self.submit(layout.client_id, info["session_id"])

        return on_end

    # --- requests -------------------------------------------------------------------------

    async def submit(self, client_id: str, session_id: str, *, force: bool = False) -> bool:
        """Queue a compaction of an *ended* session; False when queued, running or done.

        Without `force` it waits while compaction is disabled; with it (an explicit
        request) it runs now regardless.
        """
        client = self._client(client_id)
        client.layout.session_file(session_id)  # refuses ids that are not file names
        key = (client_id, session_id)
        if key in self._running or key in self._queued:
            return False
        rec = client.records.get(session_id)
        if rec is not None and rec.state == S.COMPACTED and not await asyncio.to_thread(
                client.layout.session_file(session_id).exists):
            return False  # done, and not restored since
        attempts = rec.attempts if rec and rec.state in (S.PENDING, S.FAILED) else 0
        self._set(client, session_id, S.PENDING, attempts=attempts, next_retry=None)
        self._due.pop(key, None)
        if force or self.config.enabled:
            self._enqueue(key)
        else:
            self._due[key] = self._clock()
        return True

    async def restore(self, client_id: str, session_id: str) -> str:
        """Bring a compacted session's transcript back into sessions/ and drop its summary.

        For a conversation that resumes. Cancels a compaction of it that is in flight,
        and resets its state, so it is compacted again when it ends (submit). Returns
        "restored", or "missing" when no transcript exists any more.
        """
        client = self._client(client_id)
        client.layout.session_file(session_id)
        key = (client_id, session_id)
        if key in self._running:
            await _cancel(self._running[key])
        self._queued.discard(key)
        self._due.pop(key, None)
        return await self._restore(client, session_id)

    async def recompact(self, client_id: str, session_id: str | None = None, *,
                        on_progress: Progress | None = None) -> list[dict[str, Any]]:
        """Summarise again from archive/ one compacted session, or all of them (None).

        Runs within the same concurrency bound as compactions; failures are reported per
        session (and shown as `last_error`), the old summary stays in place.
        """
        client = self._client(client_id)
        targets = [session_id] if session_id else await asyncio.to_thread(
            _compacted_ids, client.layout)
        results: list[dict[str, Any]] = []
        for done, sid in enumerate(targets, 1):
            results.append(await self._recompact_one(client, sid))
            if on_progress is not None:
                await _maybe_await(on_progress(done, len(targets), sid))
        return results

    # --- inspection -----------------------------------------------------------------------

    def sessions(self, client_id: str) -> dict[str, dict[str, Any]]:
        """Per-session compaction state for sessions.list (sessions never submitted are absent)."""
        client = self._clients.get(client_id)
        if client is None:
            return {}
        return {sid: rec.public(client.layout, (client_id, sid) in self._running)
                for sid, rec in sorted(client.records.items())}

    def client_status(self, client_id: str) -> dict[str, Any]:
        """Counts per state, what runs, and every failure with its next retry."""
        client = self._clients.get(client_id)
        if client is None:
            return {}
        counts = {state: 0 for state in (S.PENDING, S.FAILED, S.COMPACTED, S.MISSING)}
        for rec in client.records.values():
            counts[rec.state] = counts.get(rec.state, 0) + 1
        failures = [rec.public(client.layout) for rec in client.records.values()
                    if rec.state == S.FAILED]
        return {**counts, "running": sorted(k[1] for k in self._running if k[0] == client_id),
                "queued": sum(1 for k in self._queued if k[0] == client_id),
                "failures": failures}

    def status(self) -> dict[str, Any]:
        cfg = self.config
        return {"enabled": cfg.enabled, "llm_provider": cfg.llm_provider,
                "llm_model": self.settings().model, "max_concurrent": self.max_concurrent,
                "queued": len(self._queued), "running": len(self._running),
                "scheduled": len(self._due),
                "clients": {cid: self.client_status(cid) for cid in sorted(self._clients)}}

    # --- scheduling -----------------------------------------------------------------------

    def step(self, now: float | None = None) -> int:
        """Queue every compaction whose time has come; returns how many were queued."""
        if not self.config.enabled:
            return 0
        now = self._clock() if now is None else now
        # A job that just failed is still running for a moment: its retry waits for it.
        due = [key for key, at in self._due.items() if at <= now and key not in self._running]
        for key in due:
            del self._due[key]
            client = self._clients[key[0]]
            rec = client.records.get(key[1])
            if rec is not None and rec.state == S.FAILED:  # its retry time has come
                self._set(client, key[1], S.PENDING, next_retry=None)
            self._enqueue(key)
        return len(due)

    async def drain(self) -> None:
        """Wait until nothing is queued or running (retries scheduled later don't count)."""
        await self._queue.join()

    def _enqueue(self, key: Key) -> None:
        if key not in self._queued and key not in self._running:
            self._queued.add(key)
            self._queue.put_nowait(key)

    async def _scheduler(self) -> None:
        while True:
            self._wake.clear()
            self.step()
            wait = None
            if self.config.enabled and self._due:
                wait = max(0.0, min(self._due.values()) - self._clock())
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), wait)

    async def _worker(self) -> None:
        while True:
            key = await self._queue.get()
            try:
                if key not in self._queued:
                    continue  # withdrawn (restore, client closed) while it waited
                self._queued.discard(key)
                job = asyncio.create_task(self._compact(key), name=f"compaction:{key[1]}")
                self._running[key] = job
                try:
                    await asyncio.wait([job])
                except asyncio.CancelledError:
                    job.cancel()
                    raise
                finally:
                    self._running.pop(key, None)
                if not job.cancelled() and job.exception() is not None:
                    log.error("compaction.crashed", client=key[0], session=key[1],
                              error=repr(job.exception()))
            finally:
                self._queue.task_done()

    async def _compact(self, key: Key) -> None:
        client_id, sid = key
        client = self._clients.get(client_id)
        rec = client.records.get(sid) if client is not None else None
        if client is None or rec is None or rec.state != S.PENDING:
            return  # restored, or the client closed, while it waited
        async with self._sem:
            settings = self.settings()
            try:
                out = await compact_session(client.layout, sid, settings,
                                            max_request_chars=self.max_request_chars,
                                            clock=self._clock)
            except Exception as exc:  # whatever it was, nothing half-done is left: retry later
                self._fail(client, sid, exc)
                return
        if out.result == "missing":
            self._set(client, sid, S.MISSING, last_error="no transcript in sessions/ or archive/")
            return
        self._set(client, sid, S.COMPACTED, last_error=None, next_retry=None,
                  compacted_at=out.compacted_at or self._clock(),
                  llm_provider=out.llm_provider or settings.provider,
                  llm_model=out.llm_model or settings.model, parts=out.parts,
                  requests=out.requests)
        if self.on_compacted is not None:
            try:
                await _maybe_await(self.on_compacted(client_id, sid))
            except Exception:
                log.exception("compaction.hook_failed", client=client_id, session=sid)

    def _fail(self, client: _Client, sid: str, exc: Exception) -> None:
        rec = client.records[sid]
        attempts = rec.attempts + 1
        delay = self.backoff.delay(attempts)
        retry_at = self._clock() + delay
        error = f"{getattr(exc, 'reason', type(exc).__name__)}: {exc}"
        self._set(client, sid, S.FAILED, attempts=attempts, last_error=error,
                  next_retry=retry_at)
        self._due[(client.layout.client_id, sid)] = retry_at
        self._wake.set()
        log.warning("compaction.failed", client=client.layout.client_id, session=sid,
                    attempts=attempts, retry_in=round(delay, 3), error=error)

    async def _recompact_one(self, client: _Client, sid: str) -> dict[str, Any]:
        client.layout.session_file(sid)
        key = (client.layout.client_id, sid)
        if key in self._running or key in self._queued:
            return {"session_id": sid, "result": "busy", "error": "a compaction is running"}
        async with self._sem:
            settings = self.settings()
            try:
                out = await recompact_session(client.layout, sid, settings,
                                              max_request_chars=self.max_request_chars,
                                              clock=self._clock)
            except Exception as exc:
                error = f"{getattr(exc, 'reason', type(exc).__name__)}: {exc}"
                rec = client.records.get(sid)
                if rec is not None and rec.state == S.COMPACTED:
                    self._set(client, sid, S.COMPACTED, last_error=error)
                log.warning("compaction.recompact_failed", client=client.layout.client_id,
                            session=sid, error=error)
                return {"session_id": sid, "result": "failed", "error": error}
        if out.result == "recompacted":
            self._set(client, sid, S.COMPACTED, last_error=None, next_retry=None,
                      compacted_at=out.compacted_at, llm_provider=out.llm_provider,
                      llm_model=out.llm_model, parts=out.parts, requests=out.requests)
        return {"session_id": sid, "result": out.result, "error": None}

    async def _restore(self, client: _Client, sid: str) -> str:
        self._set(client, sid, S.RESTORING)
        result = await asyncio.to_thread(restore_files, client.layout, sid)
        self._set(client, sid, None)
        log.info("compaction.restored", client=client.layout.client_id, session=sid,
                 result=result)
        return result

    # --- state ----------------------------------------------------------------------------

    def _client(self, client_id: str) -> _Client:
        client = self._clients.get(client_id)
        if client is None:
            raise KeyError(f"compaction is not open for client {client_id!r}")
        return client

    def _set(self, client: _Client, sid: str, state: str | None, **changes: Any) -> None:
        """The one place a session's compaction state changes: checked, logged, persisted."""
        rec = client.records.get(sid)
        old = rec.state if rec else None
        if state not in _ALLOWED[old]:
            raise RuntimeError(f"compaction state of {sid}: {old} -> {state} is not allowed")
        if old != state:
            log.info("compaction.state", client=client.layout.client_id, session=sid,
                     **{"from": old, "to": state})
        if state is None:
            client.records.pop(sid, None)
            client.store.delete(sid)
            return
        rec = replace(rec or Record(sid, state), state=state, updated=self._clock(), **changes)
        client.records[sid] = rec
        client.store.put(rec)


def _compacted_ids(layout: ClientLayout) -> list[str]:
    """Sessions whose transcript is in archive/ and not live again in sessions/."""
    return sorted(p.stem for p in layout.archive.glob("*.md")
                  if not layout.session_file(p.stem).exists())


async def _cancel(task: asyncio.Task[Any]) -> None:
    task.cancel()
    await asyncio.wait([task])


async def _maybe_await(result: Any) -> None:
    if inspect.isawaitable(result):
        await result


__all__ = ["Backoff", "CompactionStates", "Compactor", "Outcome", "Record", "Store",
           "TranscriptChanged", "compact_session", "parse_summary_title", "recompact_session",
           "render_summary", "restore", "restore_files", "summary_meta"]

