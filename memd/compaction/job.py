"""One compaction or re-compaction of one session: ask the LLM, then the file steps.

All network work happens before any file changes, so an LLM failure changes nothing on
disk. The summary records the SHA-256 of the transcript it was made from, so running a
compaction again after a crash converges: a summary already in place for an unchanged
transcript is not asked for again and only the move is left to do.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from functools import partial
from pathlib import Path

import structlog

from memd.compaction import llm
from memd.compaction.base import Base, compaction_key, find_base
from memd.compaction.files import (
    FileGuard,
    StepHook,
    archive_transcript,
    install_summary,
    read_bytes,
    restore_files,
    sha256,
    summary_meta,
)
from memd.compaction.store import Record, S, Store
from memd.compaction.update import summarize_update
from memd.compaction.usage import Usage
from memd.layout import ClientLayout
from memd.markdown import render_summary, span_text, split_front_matter, transcript_span

log = structlog.get_logger()


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
    incremental: bool = False  # made from a base and the exchanges since


async def compact_session(
    layout: ClientLayout,
    session_id: str,
    settings: llm.LLMSettings,
    *,
    max_request_chars: int = llm.DEFAULT_MAX_REQUEST_CHARS,
    clock: Callable[[], float] = time.time,
    step_hook: StepHook | None = None,
    usage: Usage | None = None,
    guard: FileGuard | None = None,
) -> Outcome:
    """Summarise an ended session and archive its transcript; safe to run again after a crash.

    A session that resumed after an earlier compaction has a base (memd.compaction.base):
    then only what the transcript gained since is summarised, next to the base. Every
    answered LLM call is added to `usage`, also when the compaction fails later.
    `guard` is the client's (the Compactor's); without one, nothing else may touch the
    client's files meanwhile. Raises llm.LLMError (nothing on disk changed),
    TranscriptChanged, Superseded or OSError.
    """
    guard = guard or FileGuard()
    token = guard.token(session_id)  # before anything is read
    live = layout.session_file(session_id)
    data = await asyncio.to_thread(read_bytes, live)
    if data is None:
        return await _not_live(layout, session_id)
    digest = sha256(data)
    meta = await asyncio.to_thread(summary_meta, layout, session_id)
    if meta.get("source_sha256") == digest:  # a crash came after step 1: only the move is left
        out = _as_recorded(session_id, "compacted", meta, compacted_at=clock())
    else:
        key = compaction_key(settings.provider, settings.model, max_request_chars)
        base = await asyncio.to_thread(find_base, layout, session_id, data, key)
        text, out = await _summarise(
            layout, session_id, data, live, settings, max_request_chars, clock, usage, base
        )
        await asyncio.to_thread(
            install_summary, layout, session_id, text, live, digest, guard, token, step_hook
        )
    await asyncio.to_thread(archive_transcript, layout, session_id, digest, guard, token, step_hook)
    log.info(
        "compaction.done",
        client=layout.client_id,
        session=session_id,
        parts=out.parts,
        requests=out.requests,
        incremental=out.incremental,
    )
    return out


async def recompact_session(
    layout: ClientLayout,
    session_id: str,
    settings: llm.LLMSettings,
    *,
    max_request_chars: int = llm.DEFAULT_MAX_REQUEST_CHARS,
    clock: Callable[[], float] = time.time,
    step_hook: StepHook | None = None,
    usage: Usage | None = None,
    guard: FileGuard | None = None,
) -> Outcome:
    """Summarise a compacted session again from archive/ and replace its summary atomically.

    Always from the whole archived transcript, never from a base: this is how summaries
    are made anew after the settings changed.
    """
    guard = guard or FileGuard()
    token = guard.token(session_id)
    if await asyncio.to_thread(layout.session_file(session_id).exists):
        return Outcome(session_id, "not_compacted")  # live in sessions/: not ours to touch
    arch = layout.archive_file(session_id)
    data = await asyncio.to_thread(read_bytes, arch)
    if data is None:
        return Outcome(session_id, "missing")
    text, out = await _summarise(
        layout, session_id, data, arch, settings, max_request_chars, clock, usage
    )
    await asyncio.to_thread(
        install_summary, layout, session_id, text, arch, sha256(data), guard, token, step_hook
    )
    log.info(
        "compaction.recompacted",
        client=layout.client_id,
        session=session_id,
        parts=out.parts,
        requests=out.requests,
    )
    return replace(out, result="recompacted")


async def _summarise(
    layout: ClientLayout,
    session_id: str,
    data: bytes,
    source: Path,
    settings: llm.LLMSettings,
    max_request_chars: int,
    clock: Callable[[], float],
    usage: Usage | None,
    base: Base | None = None,
) -> tuple[str, Outcome]:
    meta, body = split_front_matter(data.decode("utf-8", "replace"))
    body = body.lstrip("\n")
    start, end = transcript_span(body, meta, (await asyncio.to_thread(source.stat)).st_mtime)
    if base is not None and base.started is not None:
        start = min(start, base.started)
    call = partial(llm.complete, settings, usage=usage)
    new = data[base.source_bytes :].decode("utf-8", "replace") if base else ""
    result = await _ask(call, base, body, new, span_text(start, end), max_request_chars)
    now = clock()
    text = render_summary(
        layout.client_id,
        session_id,
        result.text,
        start=start,
        end=end,
        compacted_at=now,
        provider=settings.provider,
        model=settings.model,
        parts=result.parts,
        source_sha256=sha256(data),
        extra={
            "source_bytes": str(len(data)),
            "compaction_key": compaction_key(settings.provider, settings.model, max_request_chars),
        },
    )
    out = Outcome(
        session_id,
        "compacted",
        parts=result.parts,
        requests=result.requests,
        largest_request=result.largest_request,
        llm_provider=settings.provider,
        llm_model=settings.model,
        compacted_at=now,
        incremental=base is not None,
    )
    return text, out


async def _ask(
    call: llm.Complete,
    base: Base | None,
    body: str,
    new: str,
    span: str,
    max_request_chars: int,
) -> llm.Summary:
    """The summary: the base updated with what is new, the whole body, or no call at all."""
    if base is not None and new.strip():
        return await summarize_update(
            base.body, new, call, span=span, max_request_chars=max_request_chars
        )
    if base is not None:  # nothing new (only blank lines): the base says it all
        return llm.Summary(base.body, parts=0)
    if body.strip():
        return await llm.summarize(body, call, span=span, max_request_chars=max_request_chars)
    # nothing was said: no reason to ask anyone
    return llm.Summary("This session recorded no messages.", parts=0)


async def _not_live(layout: ClientLayout, session_id: str) -> Outcome:
    """No transcript in sessions/: compacted already (archived), or missing."""
    if not await asyncio.to_thread(layout.archive_file(session_id).exists):
        return Outcome(session_id, "missing")
    meta = await asyncio.to_thread(summary_meta, layout, session_id)
    return _as_recorded(session_id, "already", meta)


def _as_recorded(
    session_id: str, result: str, meta: dict[str, str], compacted_at: float | None = None
) -> Outcome:
    """An outcome whose summary is already written: its model as the summary records it."""
    return Outcome(
        session_id,
        result,
        llm_provider=meta.get("llm_provider"),
        llm_model=meta.get("llm_model"),
        compacted_at=compacted_at,
    )


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
