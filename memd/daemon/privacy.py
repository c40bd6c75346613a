"""`memory.forget` and `memory.export` wired to the running daemon's services.

A client's memory is still theirs when memory is off for it: a disabled (or no longer
configured) client whose folder exists is served from its files, with a session store
opened just for the call while the config cannot change under it. A live client is
served through its own store, compactor and index pipeline, so recording goes on.
One forget per client runs at a time.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from memd import indexing
from memd.access import check_client_id
from memd.config import Config
from memd.errors import UnknownClient
from memd.layout import ClientLayout
from memd.privacy import Plan, Selector, Target, export_page, forget, plan, query_gate
from memd.privacy.export import Cursor
from memd.recall import recall
from memd.redaction import Scrubber
from memd.sessions import ClientSessions

if TYPE_CHECKING:
    from memd.daemon.runtime import ClientRuntime, Runtime


class PrivacyDesk:
    """Forget and export for every client of one runtime."""

    def __init__(self, runtime: Runtime) -> None:
        self.runtime = runtime
        self._locks: dict[str, asyncio.Lock] = {}

    async def forget(
        self, client_id: str, selector: Selector, dry_run: bool = False
    ) -> dict[str, Any]:
        if self._no_folder(client_id):
            # Nothing was ever recorded: an unknown session is still not_found, a time
            # range matches nothing; and no folder is created for it.
            await asyncio.to_thread(plan, self._layout(client_id), selector, {}, [])
            return {
                "removed": {"exchanges": 0, "files": 0, "index_rows": 0, "sessions": 0},
                "selector": selector.describe(),
                "forgotten": [],
                "forgotten_more": 0,
            }
        lock = self._locks.setdefault(client_id, asyncio.Lock())
        async with lock, self._target(client_id) as target:
            result = await forget(target, selector, dry_run)
            await self.runtime.rebaseline(target.layout)
            return result

    async def redact(
        self, client_id: str, only: list[str] | None, dry_run: bool, rebuild: bool | None = None
    ) -> dict[str, Any]:
        """`memd redact` (memd.sessions.rescrub): a dry run reads only; a real one rewrites
        what the rules change, then rebuilds the index from the markdown, so no row of the
        old text is left in `.memsearch/`, before it returns (`rebuild`: always or never;
        None: when something changed; the CLI's batches rebuild once, at the last)."""
        if self._no_folder(client_id):
            return {"files": [], "titles": 0, "total": 0, "index_rebuilt": False}
        lock = self._locks.setdefault(client_id, asyncio.Lock())
        async with lock, self._target(client_id) as target:
            sessions = target.sessions
            sessions.scrubber = scrubber_of(self.runtime.config)
            files_lock = (
                target.compactor.files_lock(client_id) if target.compactor is not None else None
            )
            result = await sessions.redact(only, dry_run, files_lock)
            result["index_rebuilt"] = False
            wanted = rebuild if rebuild is not None else bool(result["total"])
            if not dry_run and wanted and target.reindex is not None:
                await target.reindex()
                await self.runtime.rebaseline(target.layout)
                result["index_rebuilt"] = True
            return result

    async def export(
        self,
        client_id: str,
        *,
        after: datetime | None,
        before: datetime | None,
        cursor: str | None,
        limit: int,
    ) -> dict[str, Any]:
        if self._no_folder(client_id):
            if cursor is not None:
                Cursor.decode(cursor)  # a bad cursor is still a bad cursor
            return {"exchanges": [], "next_cursor": None}
        async with self._target(client_id) as target:
            conv_ids = target.sessions.conversation_ids()
            return await asyncio.to_thread(
                export_page,
                target.layout,
                conv_ids,
                after=after,
                before=before,
                cursor=cursor,
                limit=limit,
            )

    def _layout(self, client_id: str) -> ClientLayout:
        check_client_id(client_id)
        return ClientLayout(self.runtime.config.memory_dir, client_id)

    def _no_folder(self, client_id: str) -> bool:
        """A client memd runs nothing for and that has no folder: configured, else unknown."""
        layout = self._layout(client_id)
        if client_id in self.runtime.clients or layout.root.is_dir():
            return False
        if client_id not in self.runtime.config.clients:
            raise UnknownClient(
                f"unknown client {client_id!r}: no config and no memory folder",
                data={"client_id": client_id},
            )
        return True

    @contextlib.asynccontextmanager
    async def _target(self, client_id: str) -> AsyncIterator[Target]:
        check_client_id(client_id)
        rt = self.runtime
        live = rt.clients.get(client_id)
        if live is not None:
            yield self._live(live)
            return
        layout = ClientLayout(rt.config.memory_dir, client_id)
        if client_id not in rt.config.clients and not layout.root.is_dir():
            raise UnknownClient(
                f"unknown client {client_id!r}: no config and no memory folder",
                data={"client_id": client_id},
            )
        async with rt._lock:  # no config apply may open this client meanwhile
            sessions = await ClientSessions(layout).open()
            try:
                yield Target(layout, sessions, reindex=lambda: _wipe_index(rt.config, layout))
            finally:
                await sessions.close()

    def _live(self, client: ClientRuntime) -> Target:
        rt = self.runtime
        layout = client.layout
        cid = layout.client_id

        async def search(query: str) -> list[tuple[str, str, int | None]]:
            out = await recall(
                client.searcher,
                query,
                rt.config.search_top_k,
                None,
                None,
                layout,
                settings=query_gate(rt.config.recall),
                lane=client.recall_lane,
            )
            return [
                (str(layout.root / r["source"]), r["heading"], r["conversation"])
                for r in out["results"]
            ]

        async def count_rows(todo: Plan) -> int:
            return await _count_rows(client, todo)

        async def reindex() -> None:
            await rt.pipelines.rebuild(cid)

        return Target(
            layout,
            client.sessions,
            rt.compactor,
            compaction_enabled=rt.config.compaction.enabled,
            search=search,
            count_rows=count_rows,
            reindex=reindex,
        )


async def _count_rows(client: ClientRuntime, todo: Plan) -> int:
    """Rows that hold forgotten text: cut exchanges' headings, and summaries that go."""
    searcher = client.searcher
    if searcher is None:
        return 0
    layout = client.layout
    sources = {str(layout.session_file(sid)): sid for sid in todo.cuts}
    sources.update({str(layout.summary_file(sid)): "" for sid in todo.summaries})
    wanted = await asyncio.to_thread(_cut_headings, layout, todo)
    try:
        rows = await asyncio.to_thread(searcher.headings, sorted(sources))
    except indexing.IndexUnavailableError:
        return 0
    return sum(
        1
        for source, heading in rows
        if not sources[source] or heading in wanted.get(sources[source], ())
    )


def _cut_headings(layout: ClientLayout, todo: Plan) -> dict[str, set[str]]:
    from memd.markdown import exchange_spans

    out: dict[str, set[str]] = {}
    for sid, keys in todo.cuts.items():
        try:
            lines = (
                layout.session_file(sid).read_text(encoding="utf-8", errors="replace").split("\n")
            )
        except FileNotFoundError:
            continue
        out[sid] = {lines[s.start][3:] for s in exchange_spans("\n".join(lines)) if s.key in keys}
    return out


async def _wipe_index(config: Any, layout: ClientLayout) -> None:
    """A disabled client has no index server: its index data is dropped, and rebuilt from
    the markdown files when memory is on again."""
    target = indexing.index_target(config, layout)
    if target.local and not Path(layout.memsearch_dir).is_dir():
        return
    await asyncio.to_thread(indexing.rebuild, layout, target)


def scrubber_of(config: Config) -> Scrubber:
    """The record path's scrubber as `[privacy]` says (the loader checked the patterns)."""
    priv = config.privacy
    return Scrubber(enabled=priv.redact_secrets, patterns=priv.pattern_pairs(), allow=priv.allow)
