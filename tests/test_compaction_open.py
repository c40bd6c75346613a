"""When a client's compaction state is opened: at once if compaction is on or the client has
state on disk, else at its first request. A client that never compacted, while compaction
is off (the default), must hold no database and no thread of compaction's."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path

import pytest

from memd.compaction import Compactor
from memd.compaction.store import STATE_FILE, CompactionStates
from memd.config import parse_config
from memd.daemon.runtime import Runtime
from memd.errors import ClientDisabled
from memd.layout import ClientLayout
from tests.support.compaction import aio, config, write_session

S = CompactionStates
pytest_plugins = ("tests.support.compaction_fixtures",)


def compaction_threads(client_id: str) -> set[threading.Thread]:
    """The client's compaction threads alive now. Tests compare before and after, since a
    closed compactor's thread (an earlier test's) may still be ending. The Thread objects,
    not their idents: a thread that ends frees its ident, and the next one may get it (a
    new thread then looked like the old one: a flaky failure in the suite)."""
    prefix = f"memd-compaction-{client_id}"
    return {t for t in threading.enumerate() if t.name.startswith(prefix)}


@aio
async def test_a_client_that_never_compacted_opens_nothing_while_compaction_is_off(fake, layout):
    sid = "2026-11-30T02-41-07Z-0040"
    raw = write_session(layout, sid, 1)
    comp = await Compactor(config(fake, enabled=False)).start(schedule=False)
    try:
        before = compaction_threads("laptop")
        await comp.add_client(layout)
        assert not (layout.state_dir / STATE_FILE).exists()
        assert compaction_threads("laptop") - before == set()
        assert comp.client_status("laptop") == {} and comp.sessions("laptop") == {}
        # An explicit request opens the state it needs, then runs as on an open client.
        assert await comp.submit("laptop", sid, force=True)
        await comp.drain()
        assert (layout.state_dir / STATE_FILE).exists()
        assert comp.sessions("laptop")[sid]["state"] == S.COMPACTED
    finally:
        await comp.close()
    assert layout.archive_file(sid).read_bytes() == raw


@aio
async def test_a_client_with_state_on_disk_opens_at_once_while_compaction_is_off(fake, layout):
    sid = "2026-11-30T02-41-07Z-0041"
    write_session(layout, sid, 1)
    first = await Compactor(config(fake)).start(schedule=False)
    try:
        before = compaction_threads("laptop")
        await first.add_client(layout)  # compaction on: opened at once
        assert compaction_threads("laptop") - before
        await first.submit("laptop", sid)
        await first.drain()
    finally:
        await first.close()
    second = await Compactor(config(fake, enabled=False)).start(schedule=False)
    try:
        before = compaction_threads("laptop")
        await second.add_client(layout)
        assert compaction_threads("laptop") - before
        assert second.sessions("laptop")[sid]["state"] == S.COMPACTED  # status shows it
        assert second.client_status("laptop") != {}
        # A conversation that resumes gets its transcript back without a reopen.
        assert await second.restore("laptop", sid) == "restored"
    finally:
        await second.close()
    assert layout.session_file(sid).exists() and not layout.summary_file(sid).exists()


@aio
async def test_a_removed_client_is_not_opened_by_a_late_request(fake, layout):
    comp = await Compactor(config(fake, enabled=False)).start(schedule=False)
    try:
        await comp.add_client(layout)
        await comp.close_client("laptop")
        with pytest.raises(KeyError, match="not open"):
            await comp.submit("laptop", "2026-11-30T02-41-07Z-0042", force=True)
        assert not (layout.state_dir / STATE_FILE).exists()
    finally:
        await comp.close()


def test_a_record_inside_a_removed_client_does_not_add_it_back_to_compaction(
    tmp_path: Path,
) -> None:
    """The config removes a client while one of its records is reopening a session: the
    runtime's restore hook refuses it, and compaction stays closed for the client."""
    config = parse_config(
        {
            "memory_dir": str(tmp_path),
            "socket": str(tmp_path / "memd.sock"),
            "clients": {"a": {"memory_enabled": True, "mode": "both"}},
        }
    )
    runtime = Runtime(config)
    sid = "2026-11-30T02-41-07Z-0043"

    async def scenario() -> None:
        client = runtime.clients["a"] = await runtime._open(config, "a")
        hook = client.sessions.on_restore[0]
        try:
            # what Runtime.apply does for a removed client, before its sessions close
            runtime.clients.pop("a")
            await runtime.compactor.close_client("a")
            info = {"client_id": "a", "session_id": sid}
            with pytest.raises(ClientDisabled, match="turned off"):
                await hook(info)
            with pytest.raises(KeyError, match="not open"):
                await runtime.compactor.submit("a", sid, force=True)
            assert runtime.compactor.client_status("a") == {}
        finally:
            await client.close()
            await runtime.compactor.close()

    asyncio.run(scenario())
    assert not (ClientLayout(tmp_path, "a").state_dir / STATE_FILE).exists()


@aio
async def test_a_session_that_ends_after_its_client_was_removed_is_not_compacted(fake, layout):
    """The end hook of a removed client (queued hooks run while its sessions close) leaves
    the session to the LLM-less side: nothing opened, nothing sent, the transcript kept."""
    sid = "2026-11-30T02-41-07Z-0044"
    raw = write_session(layout, sid, 1)
    comp = await Compactor(config(fake)).start(schedule=False)
    try:
        await comp.add_client(layout)
        on_end = comp.on_end_hook(layout)
        await comp.close_client("laptop")
        await on_end({"client_id": "laptop", "session_id": sid})
        await comp.drain()
        assert comp.client_status("laptop") == {} and comp.sessions("laptop") == {}
        with pytest.raises(KeyError, match="not open"):
            await comp.submit("laptop", sid, force=True)
    finally:
        await comp.close()
    assert fake.requests == []
    assert layout.session_file(sid).read_bytes() == raw and not layout.archive_file(sid).exists()
