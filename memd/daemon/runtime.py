"""The per-client services in force, kept in step with the config (diff -> apply).

One `ClientRuntime` per memory-enabled client bundles what memd runs for it. A config
change is applied per client: added clients are opened, removed or disabled clients are
closed (their state stays on disk), and changed limits are set on the live objects.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import structlog

from memd.access import memory_client
from memd.compaction import Compactor
from memd.config import Config
from memd.daemon.edits import EditWatch
from memd.daemon.privacy import PrivacyDesk, scrubber_of
from memd.errors import ClientDisabled, NotFound
from memd.indexing import IndexSearcher, Pipelines
from memd.layout import ClientLayout
from memd.privacy import PAGE_SIZE, Selector
from memd.recall import RecallCaches, RecallLane
from memd.sessions import ClientSessions, SessionInfo

log = structlog.get_logger()


@dataclass
class ClientRuntime:
    """Everything memd runs for one client, closed with it."""

    layout: ClientLayout
    sessions: ClientSessions
    pipelines: Pipelines
    recall_lane: RecallLane = field(default_factory=RecallLane)  # its own search threads

    @property
    def searcher(self) -> IndexSearcher | None:
        """The client's index for recall; None while its pipeline is (re)starting."""
        return self.pipelines.searcher(self.layout.client_id)

    def wrote(self) -> None:
        """A record landed in sessions/: a watcher parked as idle starts now, not when
        memd's own watch of sessions/ sees the write a second later."""
        self.pipelines.wake(self.layout.client_id)

    async def close(self) -> None:
        try:
            await self.sessions.close()
        finally:
            self.recall_lane.close()


class Runtime:
    """Live per-client services; the api reaches a client only through `client()`."""

    def __init__(self, config: Config, clock: Callable[[], float] = time.time) -> None:
        self.config = config
        self.clock = clock
        self.clients: dict[str, ClientRuntime] = {}
        self._lock = asyncio.Lock()
        self._applied = asyncio.Event()  # set once the first config is in force
        self.compactor = Compactor(config.compaction, on_compacted=self._mark_compacted)
        self.pipelines = Pipelines()
        self._started = False
        self._errors: dict[str, str] = {}  # enabled clients that could not be opened
        self.privacy = PrivacyDesk(self)
        self.edits = EditWatch()  # text a person removed from sessions/ (memd.daemon.edits)
        self._rebuilds: dict[str, asyncio.Task[None]] = {}
        # What recall keeps between recalls: one budget for every client, memos let go when idle.
        self.recall_caches = RecallCaches()

    async def forget(
        self, client_id: str, selector: Selector, dry_run: bool = False
    ) -> dict[str, Any]:
        """memory.forget (memd.privacy.forget); also for a client whose memory is off."""
        return await self.privacy.forget(client_id, selector, dry_run)

    async def redact(
        self, client_id: str, only: list[str] | None, dry_run: bool, rebuild: bool | None = None
    ) -> dict[str, Any]:
        """memory.redact: the current rules applied to what is stored (memd.daemon.privacy)."""
        return await self.privacy.redact(client_id, only, dry_run, rebuild)

    async def export(
        self,
        client_id: str,
        *,
        after: datetime | None = None,
        before: datetime | None = None,
        cursor: str | None = None,
        limit: int = PAGE_SIZE,
    ) -> dict[str, Any]:
        """One page of memory.export (memd.privacy.export)."""
        return await self.privacy.export(
            client_id, after=after, before=before, cursor=cursor, limit=limit
        )

    def reset(self, client_id: str) -> bool:
        """Take a client's FATAL children out of FATAL and start them again."""
        return self.pipelines.reset(client_id)

    async def client(self, client_id: str) -> ClientRuntime:
        """The client's services, or the error that says why memory is off for it.

        A call that races a config apply (at start-up, or just after an edit enabled the
        client) waits for the apply to finish instead of failing.
        """
        memory_client(self.config, client_id)
        runtime = self.clients.get(client_id)
        if runtime is None:
            await self._applied.wait()
            async with self._lock:
                memory_client(self.config, client_id)
                runtime = self.clients.get(client_id)
        if runtime is None:
            reason = self._errors.get(client_id)
            raise ClientDisabled(
                f"memory for client {client_id!r} could not be started"
                + (f": {reason}" if reason else ""),
                kind="not_started",
            )
        return runtime

    async def apply(self, new: Config) -> None:
        """Open added clients, close removed ones, update limits on the rest."""
        async with self._lock:
            if not self._started:
                await self.pipelines.start(new)  # first: the zygote imports meanwhile
                await self.compactor.start()
                self._started = True
            wanted = new.enabled_clients()
            for client_id in sorted(set(self.clients) - set(wanted)):
                removed = self.clients.pop(client_id)
                await self.compactor.close_client(client_id)
                await removed.close()
                log.info("client.stopped", client=client_id)
            if new.compaction != self.config.compaction:
                self.compactor.set_config(new.compaction)
            self.config = new
            for client_id in set(self._errors) - set(wanted):
                del self._errors[client_id]
            for client_id in sorted(wanted):
                runtime = self.clients.get(client_id)
                if runtime is None:
                    try:
                        self.clients[client_id] = await self._open(new, client_id)
                    except Exception as exc:  # its folder is broken: the others go on
                        log.exception("client.start_failed", client=client_id)
                        self._errors[client_id] = f"{type(exc).__name__}: {exc}"
                        continue
                    self._errors.pop(client_id, None)
                    log.info("client.started", client=client_id)
                else:
                    runtime.sessions.set_limits(
                        new.session_inactivity_minutes,
                        new.max_session_minutes,
                        new.limits.index_exchange_chars,
                    )
                    runtime.sessions.scrubber = scrubber_of(new)
            await self.pipelines.apply(new)
            self._applied.set()

    async def _open(self, config: Config, client_id: str) -> ClientRuntime:
        layout = ClientLayout(config.memory_dir, client_id)
        layout.ensure()
        await self.compactor.add_client(layout)
        sessions = ClientSessions(
            layout,
            inactivity_minutes=config.session_inactivity_minutes,
            max_minutes=config.max_session_minutes,
            index_exchange_chars=config.limits.index_exchange_chars,
            clock=self.clock,
            on_end=[self.compactor.on_end_hook(layout)],
            on_restore=[self._restore_hook(layout)],
            scrubber=scrubber_of(config),
        )
        await sessions.open()
        await self.rebaseline(layout)
        if config.compaction.enabled:
            # An end whose hook was lost to a crash is still "ended": queue it again.
            for info in await sessions.list_sessions():
                if info["state"] == "ended":
                    await self.compactor.submit(client_id, info["session_id"])
        return ClientRuntime(
            layout=layout,
            sessions=sessions,
            pipelines=self.pipelines,
            recall_lane=RecallLane(self.recall_caches),
        )

    def _restore_hook(self, layout: ClientLayout) -> Callable[[SessionInfo], Awaitable[None]]:
        """A resumed conversation needs its raw transcript back in sessions/ first.

        The compactor opens the client's state itself if it has not yet (a client added
        while compaction was off). A record that was already inside a client's sessions
        when the config removed the client is refused: opening the compactor's state for
        it here would add the removed client back to compaction, which would then keep a
        database and a thread for it, and could compact its sessions after all."""

        async def restore(info: SessionInfo) -> None:
            current = self.clients.get(layout.client_id)
            if current is None or current.layout is not layout:
                raise ClientDisabled(
                    f"memory for client {layout.client_id!r} was turned off while "
                    f"session {info['session_id']} was being reopened",
                    data={"client_id": layout.client_id},
                )
            await self.compactor.restore(info["client_id"], info["session_id"])

        return restore

    async def _mark_compacted(self, client_id: str, session_id: str) -> None:
        runtime = self.clients.get(client_id)
        if runtime is not None:
            await runtime.sessions.mark_compacted(session_id)

    async def monitor(self) -> None:
        """End sessions on time, and drop text a person removed from the index; the
        interval is re-read each round so edits apply."""
        while True:
            await asyncio.sleep(self.config.monitor_interval_seconds)
            await self.expire_all()
            await self.check_edits()

    async def check_edits(self) -> None:
        """Rebuild the index of each client whose transcripts lost text (memd.daemon.edits);
        a rebuild runs in the background, one per client at a time."""
        for client_id, runtime in list(self.clients.items()):
            if client_id in self._rebuilds:
                continue
            try:
                lost = await asyncio.to_thread(self.edits.removed, runtime.layout)
            except OSError:
                log.exception("edits.check_failed", client=client_id)
                continue
            if lost:
                log.info("index.rebuild_after_edit", client=client_id, files=len(lost))
                task = asyncio.create_task(self._rebuild(client_id))
                self._rebuilds[client_id] = task

    async def _rebuild(self, client_id: str) -> None:
        try:
            await self.pipelines.rebuild(client_id)
        except Exception:
            log.exception("index.rebuild_failed", client=client_id)
        finally:
            self._rebuilds.pop(client_id, None)

    async def rebaseline(self, layout: ClientLayout) -> None:
        """memd rewrote this client's files itself (forget, redact) and rebuilt its index:
        what the files are now is the new baseline, not an edit."""
        await asyncio.to_thread(self.edits.removed, layout)

    async def expire_all(self) -> list[dict[str, Any]]:
        ended: list[dict[str, Any]] = []
        for client_id, runtime in list(self.clients.items()):
            try:
                ended += await runtime.sessions.expire()
            except Exception:
                log.exception("monitor.failed", client=client_id)
        return ended  # each end is logged once, by the client's sessions

    def status(self, client_id: str) -> dict[str, Any]:
        runtime = self.clients.get(client_id)
        if runtime is None:
            error = self._errors.get(client_id)
            return {"client_error": error} if error else {}
        return {
            "active_session": runtime.sessions.active_session(),
            "active_sessions": runtime.sessions.active_sessions(),
            "compaction": self.compactor.client_status(client_id),
            "redacted": runtime.sessions.redaction_counts(),
            "index_rebuilding": client_id in self._rebuilds,
            **self.pipelines.status(client_id),
        }

    async def list_sessions(self, client_id: str) -> list[dict[str, Any]]:
        """Sessions with their compaction state merged in (`compaction`, when known).

        A session that spent tokens but has no state (restored, active again) still shows
        them, as `compaction: {"state": null, "tokens": ...}`.
        """
        runtime = await self.client(client_id)
        rows = await runtime.sessions.list_sessions()
        states = self.compactor.sessions(client_id)
        tokens = self.compactor.session_tokens(client_id)
        for row in rows:
            sid = row["session_id"]
            if sid in states:
                row["compaction"] = states[sid]
            elif sid in tokens:
                row["compaction"] = {"state": None, "tokens": tokens[sid]}
        return rows

    async def recompact(self, client_id: str, session_id: str | None) -> list[dict[str, Any]]:
        """Summarise again from archive/ (compacted sessions) or compact now (ended ones).

        For one session or all of the client's; active sessions are left alone. Refused
        while compaction is disabled: nothing is sent to an LLM the config did not name.
        """
        self.compactor.require_enabled()
        rows = await self.list_sessions(client_id)
        if session_id is not None:
            rows = [r for r in rows if r["session_id"] == session_id]
            if not rows:
                raise NotFound(
                    f"client {client_id!r} has no session {session_id!r}",
                    data={"session_id": session_id},
                )
        results: list[dict[str, Any]] = []
        for row in rows:
            sid = row["session_id"]
            if row["state"] == "compacted":
                results += await self.compactor.recompact(client_id, sid)
            elif row["state"] == "ended":
                queued = await self.compactor.submit(client_id, sid, force=True)
                results.append(
                    {"session_id": sid, "result": "queued" if queued else "busy", "error": None}
                )
            elif session_id is not None:
                results.append({"session_id": sid, "result": "active", "error": None})
        return results

    async def close(self) -> None:
        for task in list(self._rebuilds.values()):
            task.cancel()
        await self.compactor.close()
        await self.pipelines.close()
        async with self._lock:
            for client_id, runtime in list(self.clients.items()):
                try:
                    await runtime.close()
                except Exception:
                    log.exception("client.close_failed", client=client_id)
            self.clients.clear()
        self.recall_caches.close()
