"""`memory.forget`: take exchanges out of everything memd keeps, physically.

Order of work, each step safe to repeat:

1. plan: which exchanges the selector names, read from the transcript files
   (`memd.privacy.select`); a selector that names nothing changes nothing, a query
   that names nothing is refused; what the plan names is listed (`forgotten`), and a
   dry run stops here;
2. count the index rows that hold them (for the report), while the index still has them;
3. cut them out of the transcripts, the archive and the session state
   (`ClientSessions.erase`: rewritten atomically; nothing decided is lost, and a record
   arriving meanwhile is refused with `busy` rather than queued behind the rewrite);
4. summaries that covered any of it: regenerated from what is left when compaction is
   configured, otherwise removed (the rest of the archived transcript comes back into
   sessions/, so it stays recallable);
5. the index is rebuilt from the markdown files: Milvus Lite keeps deleted rows in its
   segment files until a compaction it cannot be asked for, so dropping the rows alone
   would leave the text on disk.

Afterwards no file under the client's folder (`.memd/` and `.memsearch/` included)
holds the forgotten text.
"""

from __future__ import annotations

import asyncio
import dataclasses
import threading
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import structlog

from memd.compaction import Compactor, restore_files
from memd.config import RecallConfig
from memd.errors import IndexUnavailable, NotFound
from memd.layout import ClientLayout
from memd.markdown import exchange_spans, fsync_dir
from memd.privacy.select import Hit, Plan, Selector, listing, plan
from memd.sessions import ClientSessions

log = structlog.get_logger()

Hits = list[Hit]  # (source path, heading, conversation) of recall's relevant results


@dataclass
class Target:
    """What forgetting one client's memory needs from whoever runs it (the daemon)."""

    layout: ClientLayout
    sessions: ClientSessions  # open: the live one, or one opened for a disabled client
    compactor: Compactor | None = None  # open for this client (None: client disabled)
    compaction_enabled: bool = False
    search: Callable[[str], Awaitable[Hits]] | None = None
    count_rows: Callable[[Plan], Awaitable[int]] | None = None
    reindex: Callable[[], Awaitable[None]] | None = None


def query_gate(settings: RecallConfig) -> RecallConfig:
    """The recall settings a forget by query searches with: recall's own, whose gate
    (`memd.recall.relevant`, applied inside recall) then keeps no result under
    `min_score`, the relevance recall calls relevant. A recall may show weaker results
    beside a relevant one; a destructive command acts on none of them."""
    return dataclasses.replace(settings, drop_below=max(settings.drop_below, settings.min_score))


async def forget(target: Target, selector: Selector, dry_run: bool = False) -> dict[str, Any]:
    """Forget what `selector` names; the counts of what was removed, and the exchanges by
    name (`forgotten`). With `dry_run`, what would be removed, and nothing changes.

    Raises NotFound when a query matches nothing recall calls relevant: a destructive
    command that found nothing to act on says so rather than reporting zero."""
    layout = target.layout
    external = {cid: key for key, cid in target.sessions.conversation_ids().items()}
    hits: Hits = []
    if selector.query is not None:
        if target.search is None:
            raise IndexUnavailable(
                "forgetting by query needs the client's index: enable "
                "memory for it, or forget by session or time"
            )
        hits = await target.search(selector.query)
    todo = await asyncio.to_thread(plan, layout, selector, external, hits)
    if selector.query is not None and not todo.cuts and not todo.summaries:
        raise NotFound(
            "nothing relevant to that query in memory (recall shows nothing for it): "
            "nothing was forgotten",
            data={"param": "query"},
        )
    listed, more = await asyncio.to_thread(listing, layout, todo)
    removed = {"exchanges": 0, "files": 0, "index_rows": 0, "sessions": 0}
    report: dict[str, Any] = {
        "removed": removed,
        "selector": selector.describe(),
        "forgotten": listed,
        "forgotten_more": more,
    }
    if dry_run:
        return {**report, "dry_run": True}
    if not todo.cuts and not todo.summaries:
        return report
    if target.count_rows is not None:
        removed["index_rows"] = await target.count_rows(todo)
    erased = await target.sessions.erase(todo.cuts, _files_lock(target))
    removed["exchanges"], removed["files"] = erased.exchanges, erased.files
    removed["sessions"] = erased.sessions
    removed["files"] += await _summaries(target, todo)
    if target.reindex is not None:
        await target.reindex()
    log.info("forget.done", client=layout.client_id, **removed)
    return report


async def _summaries(target: Target, todo: Plan) -> int:
    """Regenerate or remove every summary that covered forgotten text; files changed."""
    layout = target.layout
    changed = 0
    moved = False
    for sid in sorted(todo.summaries | set(todo.cuts)):
        if not await asyncio.to_thread(layout.summary_file(sid).exists):
            continue
        left = await asyncio.to_thread(_archived_exchanges, layout, sid)
        if left and target.compactor is not None and target.compaction_enabled:
            [result] = await target.compactor.recompact(layout.client_id, sid)
            if result["result"] == "recompacted":
                changed += 1
                continue
            log.warning(
                "forget.summary_not_regenerated",
                client=layout.client_id,
                session=sid,
                error=result.get("error"),
            )
        if left:  # the rest comes back into sessions/, indexed again; the summary goes
            if target.compactor is not None:
                await target.compactor.restore(layout.client_id, sid)
            else:
                await asyncio.to_thread(restore_files, layout, sid)
            moved = True
        else:
            await asyncio.to_thread(_unlink, layout, sid, _files_lock(target))
        changed += 1
    if moved:
        await target.sessions.resync()  # a restored session is `ended` again
    return changed


def _archived_exchanges(layout: ClientLayout, sid: str) -> int:
    try:
        text = layout.archive_file(sid).read_bytes().decode("utf-8", "replace")
    except FileNotFoundError:
        return 0
    return len(exchange_spans(text))


def _files_lock(target: Target) -> threading.Lock:
    """The lock the client's compaction file steps hold (none run without a compactor)."""
    if target.compactor is None:
        return threading.Lock()
    return target.compactor.files_lock(target.layout.client_id)


def _unlink(layout: ClientLayout, sid: str, lock: threading.Lock) -> None:
    with lock:
        layout.summary_file(sid).unlink(missing_ok=True)
        fsync_dir(layout.sessions)
