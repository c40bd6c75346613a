"""Resuming sessions: a conversation continues in its own session file, restored if compacted.

Real files, real sqlite, a fake clock; compaction runs the real Compactor against the
HTTP LLM stand-in in tests/support/fake_llm.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import sqlite3
import subprocess
import sys
import textwrap
import time
from collections import Counter
from collections.abc import AsyncIterator, Iterator
from contextlib import AbstractAsyncContextManager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from memd.compaction.service import Compactor
from memd.config import CompactionConfig
from memd.errors import StorageError
from memd.layout import ClientLayout
from memd.markdown import transcript
from memd.markdown.transcript import Part
from memd.sessions.store import Change, StateStore
from memd.sessions.tracker import ClientSessions
from tests.support.fake_llm import FakeLLM
from tests.support.sessions import T0, Clock, archive, open_sessions, run

CLIENT = "c1"


def store(root: Path, clock: Clock, **kw: Any) -> AbstractAsyncContextManager[ClientSessions]:
    kw.setdefault("max_minutes", 60)
    return open_sessions(root, clock, CLIENT, **kw)


def u(text: str) -> dict[str, Any]:
    return {"role": "user", "content": text}


def a(text: str) -> dict[str, Any]:
    return {"role": "assistant", "content": text}


def texts(path: Path) -> list[str]:
    parsed = transcript.read_transcript(path)
    return [p.text for c in parsed.conversations for e in c.exchanges for p in e.parts]


def iso(minutes: float) -> str:
    return transcript.iso(T0 + minutes * 60)


async def by_id(cs: ClientSessions) -> dict[str, dict[str, Any]]:
    return {s["session_id"]: s for s in await cs.list_sessions()}


# --- ended sessions ---------------------------------------------------------------------


def test_continuation_of_an_ended_session_appends_in_place(tmp_path: Path) -> None:
    layout = ClientLayout(tmp_path, CLIENT)

    async def scenario() -> None:
        clock = Clock()
        events: list[tuple[str, str, str]] = []
        async with store(
            tmp_path,
            clock,
            on_end=[lambda i: events.append(("end", i["session_id"], i["state"]))],
            on_resume=[lambda i: events.append(("resume", i["session_id"], i["old_state"]))],
            on_restore=[lambda i: events.append(("restore", i["session_id"], i["state"]))],
        ) as cs:
            first = await cs.record_chat([u("q1 FACT-a")], a("a1"))
            m1 = await cs.record_exchange("mcp-1", "mcp question", "mcp answer")
            s1 = first["session_id"]
            clock.at(5)
            await cs.close_active()
            clock.at(10)
            other = await cs.record_chat([u("another chat")], a("another reply"))
            s2 = other["session_id"]
            assert s2 != s1
            current_before = layout.session_file(s2).read_bytes()
            clock.at(12)
            cont = await cs.record_chat([u("q1 FACT-a"), a("a1"), u("q2")], a("a2"))
            m2 = await cs.record_exchange("mcp-1", "mcp again", "mcp reply")
            new = await cs.record_chat([u("third chat")], a("third reply"))
            sessions = await by_id(cs)
            current = cs.active_session()
            actives = [x["session_id"] for x in cs.active_sessions()]

        assert (cont["session_id"], cont["conversation"], cont["match"], cont["appended"]) == (
            s1,
            1,
            "continuation",
            2,
        )
        assert (m2["session_id"], m2["conversation"]) == (s1, m1["conversation"])
        assert new["session_id"] == s2, "new conversations still go to the current session"
        assert layout.session_file(s2).read_bytes().startswith(current_before)
        assert "q2" not in layout.session_file(s2).read_text()
        assert texts(layout.session_file(s1)) == [
            "q1 FACT-a",
            "a1",
            "mcp question",
            "mcp answer",
            "q2",
            "a2",
            "mcp again",
            "mcp reply",
        ]
        parsed = transcript.read_transcript(layout.session_file(s1))
        assert [c.number for c in parsed.conversations] == [1, 2, 1, 2]
        assert parsed.conversations[2].info.endswith("continued")  # no "continued from"
        assert (
            sessions[s1]["state"],
            sessions[s1]["resumed"],
            sessions[s1]["resumes"],
            sessions[s1]["ended"],
        ) == ("active", iso(12), 1, None)
        assert sessions[s1]["expires"] == iso(12 + 30)
        assert (sessions[s2]["resumed"], sessions[s2]["resumes"]) == (None, 0)
        assert current is not None and current["session_id"] == s2
        assert actives == [s1, s2]
        assert events == [("end", s1, "ended"), ("restore", s1, "ended"), ("resume", s1, "ended")]

    run(scenario)


def test_duplicate_of_an_ended_conversation_does_not_reopen_it(tmp_path: Path) -> None:
    async def scenario() -> None:
        clock = Clock()
        async with store(tmp_path, clock) as cs:
            first = await cs.record_chat([u("q1")], a("a1"))
            await cs.close_active()
            clock.at(3)
            again = await cs.record_chat([u("q1")], a("a1"))
            [row] = await cs.list_sessions()
        assert (again["match"], again["appended"]) == ("duplicate", 0)
        assert (row["session_id"], row["state"], row["resumes"]) == (
            first["session_id"],
            "ended",
            0,
        )

    run(scenario)


def test_late_record_reopens_its_due_session_in_one_step(tmp_path: Path) -> None:
    """The monitor has not run yet: the session ends at its deadline and resumes at once."""

    async def scenario() -> None:
        clock = Clock()
        ended: list[str] = []
        restores: list[str] = []
        async with store(
            tmp_path,
            clock,
            inactivity_minutes=10,
            on_end=[lambda i: ended.append(i["session_id"])],
            on_restore=[lambda i: restores.append(i["session_id"])],
        ) as cs:
            first = await cs.record_chat([u("q1")], a("a1"))
            clock.at(11)
            cont = await cs.record_chat([u("q1"), a("a1"), u("q2")], a("a2"))
            fresh = await cs.record_exchange("new-mcp", "u", "a")
            rows = await by_id(cs)
        sid = first["session_id"]
        assert cont["session_id"] == sid and fresh["session_id"] != sid
        assert (rows[sid]["state"], rows[sid]["resumed"], rows[sid]["resumes"]) == (
            "active",
            iso(11),
            1,
        )
        assert ended == [] and restores == []  # nothing left sessions/: nothing to undo
        assert texts(Path(first["path"])) == ["q1", "a1", "q2", "a2"]

    run(scenario)


def test_concurrent_continuations_reopen_once(tmp_path: Path) -> None:
    async def scenario() -> None:
        clock = Clock()
        restores: list[str] = []

        async def slow_restore(info: dict[str, Any]) -> None:
            await asyncio.sleep(0.02)
            restores.append(info["session_id"])

        async with store(tmp_path, clock, on_restore=[slow_restore]) as cs:
            first = await cs.record_exchange("mcp-1", "u0", "a0")
            await cs.close_active()
            clock.at(1)
            results = await asyncio.gather(
                *(cs.record_exchange("mcp-1", f"u{i}", f"a{i}") for i in range(1, 6))
            )
            [row] = await cs.list_sessions()
        assert {r["session_id"] for r in results} == {first["session_id"]}
        assert restores == [first["session_id"]] and row["resumes"] == 1
        assert sorted(texts(Path(first["path"]))) == sorted(
            [f"u{i}" for i in range(6)] + [f"a{i}" for i in range(6)]
        )

    run(scenario)


def test_end_hooks_finish_before_the_restore_hook(tmp_path: Path) -> None:
    """A restore must never be overtaken by the end hook that queues a compaction."""

    async def scenario() -> None:
        clock = Clock()
        order: list[str] = []

        async def slow_end(info: dict[str, Any]) -> None:
            await asyncio.sleep(0.05)
            order.append("end")

        async with store(
            tmp_path,
            clock,
            inactivity_minutes=10,
            on_end=[slow_end],
            on_restore=[lambda i: order.append("restore")],
        ) as cs:
            await cs.record_chat([u("q1")], a("a1"))
            clock.at(20)
            expired, cont = await asyncio.gather(
                cs.expire(), cs.record_chat([u("q1"), a("a1"), u("q2")], a("a2"))
            )
        assert len(expired) == 1 and cont["match"] == "continuation"
        assert order == ["end", "restore"]

    run(scenario)


# --- compacted sessions -----------------------------------------------------------------


def test_compacted_session_without_hooks_is_restored_by_the_store(tmp_path: Path) -> None:
    layout = ClientLayout(tmp_path, CLIENT)

    async def scenario() -> None:
        clock = Clock()
        ended: list[dict[str, Any]] = []
        async with store(tmp_path, clock, on_end=[ended.append]) as cs:
            first = await cs.record_chat([u("q1")], a("a1"))
            sid = first["session_id"]
            await cs.close_active()
            raw = layout.session_file(sid).read_bytes()
            archive(layout, sid)
            layout.summary_file(sid).write_text("---\nsession_id: x\n---\n\n# summary\n")
            await cs.mark_compacted(sid)
            assert (await by_id(cs))[sid]["path"] == str(layout.archive_file(sid))
            clock.at(40)
            cont = await cs.record_chat([u("q1"), a("a1"), u("q2")], a("a2"))
            row = (await by_id(cs))[sid]
            live = layout.session_file(sid).read_bytes()
            clock.at(40 + 30)
            [info] = await cs.expire()
        assert cont["session_id"] == sid and live.startswith(raw)
        assert texts(layout.session_file(sid)) == ["q1", "a1", "q2", "a2"]
        assert not layout.archive_file(sid).exists()
        assert not layout.summary_file(sid).exists()
        assert (row["state"], row["path"], row["resumes"]) == (
            "active",
            str(layout.session_file(sid)),
            1,
        )
        assert (info["session_id"], info["end_reason"]) == (sid, "inactivity")
        assert [e["session_id"] for e in ended] == [sid, sid]

    run(scenario)


def test_failing_restore_hook_writes_nothing_and_a_retry_works(tmp_path: Path) -> None:
    layout = ClientLayout(tmp_path, CLIENT)

    async def scenario() -> None:
        clock = Clock()
        broken = True

        def restore_hook(info: dict[str, Any]) -> None:
            if broken:
                raise OSError("disk on fire")

        async with store(tmp_path, clock, on_restore=[restore_hook]) as cs:
            first = await cs.record_exchange("mcp-1", "u1", "a1")
            sid = first["session_id"]
            await cs.close_active()
            archive(layout, sid)
            layout.summary_file(sid).write_text("# the summary\n")
            await cs.mark_compacted(sid)
            archived = layout.archive_file(sid).read_bytes()
            clock.at(5)
            with pytest.raises(StorageError) as caught:
                await cs.record_exchange("mcp-1", "u2", "a2")
            assert caught.value.kind == "storage_error" and "disk on fire" in str(caught.value)
            [row] = await cs.list_sessions()
            assert (row["state"], row["resumes"]) == ("compacted", 0)
            assert layout.archive_file(sid).read_bytes() == archived
            assert not layout.session_file(sid).exists()
            assert layout.summary_file(sid).exists()
            assert cs.active_sessions() == []
            broken = False
            again = await cs.record_exchange("mcp-1", "u2", "a2")
        assert (again["session_id"], again["conversation"]) == (sid, 1)
        assert texts(layout.session_file(sid)) == ["u1", "a1", "u2", "a2"]

    run(scenario)


@pytest.fixture
def fake() -> Iterator[FakeLLM]:
    with FakeLLM() as server:
        server.retry_after_ms = 5
        yield server


@contextlib.asynccontextmanager
async def compacting(
    root: Path, clock: Clock, fake: FakeLLM
) -> AsyncIterator[tuple[ClientSessions, Compactor]]:
    """Sessions wired to a real Compactor the way the daemon wires them."""
    layout = ClientLayout(root, CLIENT)
    layout.ensure()
    comp = Compactor(
        CompactionConfig(
            enabled=True, llm_model="fake-model", base_url=fake.base_url, api_key="sk-test"
        )
    )

    async def restore(info: dict[str, Any]) -> None:
        await comp.restore(info["client_id"], info["session_id"])

    sessions = ClientSessions(
        layout,
        clock=clock,
        inactivity_minutes=30,
        max_minutes=60,
        on_end=[comp.on_end_hook(layout)],
        on_restore=[restore],
    )

    async def mark(client_id: str, session_id: str) -> None:
        await sessions.mark_compacted(session_id)

    comp.on_compacted = mark
    await comp.start(schedule=False)
    await comp.open_client(layout)
    try:
        async with sessions:
            yield sessions, comp
    finally:
        await comp.close()


def test_compacted_session_is_restored_appended_and_compacted_again(
    tmp_path: Path, fake: FakeLLM
) -> None:
    layout = ClientLayout(tmp_path, CLIENT)

    async def scenario() -> None:
        clock = Clock()
        async with compacting(tmp_path, clock, fake) as (cs, comp):
            first = await cs.record_chat([u("my cat is FACT-cat")], a("Nice cat."))
            sid = first["session_id"]
            clock.at(31)
            assert len(await cs.expire()) == 1
            await comp.drain()
            assert (await by_id(cs))[sid]["state"] == "compacted"
            assert "FACT-cat" in layout.summary_file(sid).read_text()
            archived = layout.archive_file(sid).read_bytes()
            assert not layout.session_file(sid).exists()

            clock.at(100)
            cont = await cs.record_chat(
                [u("my cat is FACT-cat"), a("Nice cat."), u("and my dog is FACT-dog")],
                a("Nice dog."),
            )
            assert cont["session_id"] == sid and cont["match"] == "continuation"
            live = layout.session_file(sid).read_bytes()
            assert live.startswith(archived) and b"FACT-dog" in live
            assert not layout.archive_file(sid).exists()
            assert not layout.summary_file(sid).exists()
            assert comp.sessions(CLIENT) == {}  # its compaction state was reset
            row = (await by_id(cs))[sid]
            assert (row["state"], row["resumed"], row["resumes"]) == ("active", iso(100), 1)

            clock.at(100 + 30)
            [info] = await cs.expire()
            assert info["session_id"] == sid
            await comp.drain()
            row = (await by_id(cs))[sid]
        assert row["state"] == "compacted" and row["resumes"] == 1
        summary = layout.summary_file(sid).read_text()
        assert "FACT-cat" in summary and "FACT-dog" in summary
        assert layout.archive_file(sid).read_bytes() == live
        assert not layout.session_file(sid).exists()
        assert len(fake.requests) == 2

    run(scenario)


def test_resume_cancels_a_compaction_in_flight(tmp_path: Path, fake: FakeLLM) -> None:
    """An ended session whose summary is still being written resumes without losing bytes."""
    layout = ClientLayout(tmp_path, CLIENT)

    async def scenario() -> None:
        clock = Clock()
        fake.set_mode("hang")
        async with compacting(tmp_path, clock, fake) as (cs, comp):
            first = await cs.record_exchange("mcp-1", "FACT-one", "ok")
            sid = first["session_id"]
            await cs.close_active()
            for _ in range(200):  # wait until the LLM call is open
                if fake.in_flight:
                    break
                await asyncio.sleep(0.01)
            assert fake.in_flight == 1
            clock.at(10)
            again = await cs.record_exchange("mcp-1", "FACT-two", "ok")
            fake.set_mode("ok")
            await comp.drain()
            row = (await by_id(cs))[sid]
        assert again["session_id"] == sid and row["state"] == "active"
        assert texts(layout.session_file(sid)) == ["FACT-one", "ok", "FACT-two", "ok"]
        assert not layout.archive_file(sid).exists()
        assert not layout.summary_file(sid).exists()

    run(scenario)


# --- timing -------------------------------------------------------------------------------


def test_max_duration_restarts_at_resume(tmp_path: Path) -> None:
    async def scenario() -> None:
        clock = Clock()
        async with store(tmp_path, clock, inactivity_minutes=30, max_minutes=60) as cs:
            first = await cs.record_exchange("mcp-1", "u", "a")
            clock.at(10)
            await cs.close_active()
            clock.at(100)  # long past started + 60 min
            await cs.record_exchange("mcp-1", "u", "a")
            assert await cs.expire() == []
            for minute in (120, 140, 155):  # busy: never idle for 30 minutes
                clock.at(minute)
                await cs.record_exchange("mcp-1", "u", "a")
                assert await cs.expire() == []
            clock.at(159.9)
            assert await cs.expire() == []
            clock.at(160.1)
            [info] = await cs.expire()
        assert (info["session_id"], info["end_reason"], info["ended"], info["started"]) == (
            first["session_id"],
            "max_duration",
            iso(160),
            iso(0),
        )
        assert (info["resumed"], info["resumes"]) == (iso(100), 1)

    run(scenario)


def test_two_active_sessions_expire_independently(tmp_path: Path) -> None:
    async def scenario() -> None:
        clock = Clock()
        ended: list[str] = []
        async with store(
            tmp_path,
            clock,
            inactivity_minutes=30,
            max_minutes=600,
            on_end=[lambda i: ended.append(i["session_id"])],
        ) as cs:
            old = (await cs.record_exchange("old", "u", "a"))["session_id"]
            await cs.close_active()
            clock.at(5)
            cur = (await cs.record_exchange("new", "u", "a"))["session_id"]
            clock.at(50)
            await cs.record_exchange("old", "u", "a")  # reopens `old`
            await cs.record_exchange("new", "u", "a")  # `cur` was idle 45 min: ends, and
            cur2 = cs.active_session()  # its conversation reopens it
            assert cur2 is None
            newest = (await cs.record_exchange("newest", "u", "a"))["session_id"]
            clock.at(70)
            await cs.record_exchange("new", "u", "a")
            await cs.record_exchange("newest", "u", "a")
            clock.at(80.1)
            [first] = await cs.expire()
            assert first["session_id"] == old and first["ended"] == iso(80)
            assert {s["session_id"] for s in cs.active_sessions()} == {cur, newest}
            clock.at(100.1)
            rest = await cs.expire()
            assert sorted(x["session_id"] for x in rest) == sorted([cur, newest])
            assert cs.active_sessions() == []
        assert ended == [old, old, cur, newest] or ended == [old, old, newest, cur]

    run(scenario)


def test_close_active_ends_the_current_session_first_then_resumed_ones(tmp_path: Path) -> None:
    async def scenario() -> None:
        clock = Clock()
        async with store(tmp_path, clock) as cs:
            old = (await cs.record_exchange("old", "u", "a"))["session_id"]
            await cs.close_active()
            clock.at(1)
            cur = (await cs.record_exchange("new", "u", "a"))["session_id"]
            clock.at(2)
            await cs.record_exchange("old", "u", "a")
            closed = await cs.close_active()
            assert await cs.close_active() == []
        assert [(c["session_id"], c["state"], c["end_reason"]) for c in closed] == [
            (cur, "ended", "closed"),
            (old, "ended", "closed"),
        ]

    run(scenario)


# --- durability -------------------------------------------------------------------------

OLD_SCHEMA = """
CREATE TABLE sessions (
    session_id TEXT PRIMARY KEY, state TEXT NOT NULL, started REAL NOT NULL,
    last_activity REAL NOT NULL, ended REAL, end_reason TEXT,
    conversations INTEGER NOT NULL, last_conv INTEGER,
    size INTEGER NOT NULL DEFAULT 0, tail BLOB);
CREATE TABLE conversations (
    conv INTEGER PRIMARY KEY, kind TEXT NOT NULL, external_id TEXT, session_id TEXT,
    number INTEGER NOT NULL, exchanges INTEGER NOT NULL, last_active REAL NOT NULL);
CREATE TABLE nodes (
    hash BLOB PRIMARY KEY, conv INTEGER NOT NULL, exchange INTEGER NOT NULL, parent BLOB
) WITHOUT ROWID;
"""


def test_state_database_of_the_first_release_is_migrated(tmp_path: Path) -> None:
    """A state.sqlite3 written by the first release (no resume columns) opens and works."""
    layout = ClientLayout(tmp_path, CLIENT)
    layout.ensure()
    sid = "2027-01-15T08-00-00Z-0abc"
    when = datetime.fromtimestamp(T0, UTC)
    body = (
        transcript.front_matter(CLIENT, sid, T0)
        + transcript.conversation_header(1, when)
        + transcript.exchange_block(1, when, [Part("User", "u1"), Part("Assistant", "a1")])
    ).encode()
    layout.session_file(sid).write_bytes(body)
    db = sqlite3.connect(layout.state_dir / "state.sqlite3")
    db.executescript(OLD_SCHEMA)
    db.execute(
        "INSERT INTO sessions VALUES (?, 'active', ?, ?, NULL, NULL, 1, 1, ?, ?)",
        (sid, T0, T0, len(body), transcript.tail_digest(body)),
    )
    db.execute("INSERT INTO conversations VALUES (1, 'mcp', 'mcp-1', ?, 1, 1, ?)", (sid, T0))
    db.commit()
    db.close()

    async def scenario() -> None:
        clock = Clock(T0 + 60)
        async with store(tmp_path, clock) as cs:
            [row] = await cs.list_sessions()
            assert (row["state"], row["resumed"], row["resumes"]) == ("active", None, 0)
            assert cs.active_session() is not None
            r = await cs.record_exchange("mcp-1", "u2", "a2")
            await cs.close_active()
            clock.at(5)
            r2 = await cs.record_exchange("mcp-1", "u3", "a3")
        assert r["session_id"] == r2["session_id"] == sid
        assert texts(layout.session_file(sid)) == ["u1", "a1", "u2", "a2", "u3", "a3"]

    run(scenario)


def test_state_follows_the_file_after_a_crash_around_a_move(tmp_path: Path) -> None:
    """Restored but not committed -> ended (compacted again); archived, mark lost -> compacted."""
    layout = ClientLayout(tmp_path, CLIENT)

    async def scenario() -> None:
        clock = Clock()
        async with store(tmp_path, clock) as cs:
            one = (await cs.record_exchange("one", "u", "a"))["session_id"]
            await cs.close_active()
            two = (await cs.record_exchange("two", "u", "a"))["session_id"]
            await cs.close_active()
            archive(layout, one)
            await cs.mark_compacted(one)
        transcript.restore(layout, one)  # a resume died between its restore and its commit
        archive(layout, two)  # a compaction died before its mark
        async with store(tmp_path, clock) as cs:
            rows = await by_id(cs)
        assert (rows[one]["state"], rows[one]["path"]) == ("ended", str(layout.session_file(one)))
        assert (rows[two]["state"], rows[two]["path"]) == (
            "compacted",
            str(layout.archive_file(two)),
        )

    run(scenario)


def test_reopen_commits_the_restored_size_so_recovery_cuts_only_what_follows(
    tmp_path: Path,
) -> None:
    """A crash after a resume's commit but before its first append commit is cut back."""
    layout = ClientLayout(tmp_path, CLIENT)

    async def scenario() -> None:
        async with store(tmp_path, Clock()) as cs:
            sid = (await cs.record_exchange("mcp-1", "u1", "a1"))["session_id"]
            await cs.close_active()
            archive(layout, sid)
            await cs.mark_compacted(sid)
        raw = layout.archive_file(sid).read_bytes()
        disk = StateStore(layout)
        [sess] = disk.open().sessions
        sess.state, sess.resumed, sess.resumes = "active", T0 + 60, 1
        disk.commit([Change(session_rows=[sess.row()], reopen=sid)])  # what a resume commits
        disk.close()
        with open(layout.session_file(sid), "ab") as fh:  # an append that was never committed
            fh.write(
                transcript.exchange_block(
                    2, datetime.fromtimestamp(T0 + 60, UTC), [Part("User", "lost")]
                ).encode()
            )
        async with store(tmp_path, Clock(T0 + 120)) as cs:
            assert layout.session_file(sid).read_bytes() == raw
            [row] = await cs.list_sessions()
            again = await cs.record_exchange("mcp-1", "u2", "a2")
        assert (row["state"], row["resumes"], again["session_id"]) == ("active", 1, sid)
        assert texts(layout.session_file(sid)) == ["u1", "a1", "u2", "a2"]

    run(scenario)


RECORDER = textwrap.dedent("""
    import asyncio, json, sys
    from pathlib import Path
    import structlog
    from memd.markdown import transcript
    from memd.layout import ClientLayout
    from memd.sessions.tracker import ClientSessions

    def archive(layout, session_id):  # a compaction's file step, by hand
        layout.archive_file(session_id).parent.mkdir(parents=True, exist_ok=True)
        Path(layout.session_file(session_id)).replace(layout.archive_file(session_id))

    structlog.configure(logger_factory=structlog.PrintLoggerFactory(sys.stderr))

    async def main(root, step):
        layout = ClientLayout(Path(root), "crash")
        cs = ClientSessions(layout, inactivity_minutes=60, max_minutes=600)
        await cs.open()
        out = sys.stdout
        if step == "setup":
            old = await cs.record_exchange("resumed-conv", "first", "first reply")
            await cs.close_active()
            archive(layout, old["session_id"])
            await cs.mark_compacted(old["session_id"])
            cur = await cs.record_exchange("current-conv", "now", "now reply")
            print(json.dumps({"old": old["session_id"], "current": cur["session_id"]}))
            await cs.close()
        elif step == "fire":
            async def one(i):
                r = await cs.record_exchange("resumed-conv", f"user {i}",
                                             f"assistant {i}\\n" + "x" * (i % 300))
                out.write(f"ack {i} {r['session_id']}\\n")
                out.flush()

            await asyncio.gather(*(one(i) for i in range(600)))
            out.write("all acknowledged\\n")
            out.flush()
            await asyncio.sleep(3600)  # wait for the kill
        else:
            rows = await cs.list_sessions()
            current = cs.active_session()
            r = await cs.record_exchange("resumed-conv", "after restart", "ok")
            print(json.dumps({"rows": rows, "current": current, "again": r}))
            await cs.close()

    asyncio.run(main(*sys.argv[1:]))
""")


@pytest.mark.faults
def test_kill_after_a_resume_keeps_the_resumed_state(tmp_path: Path) -> None:
    script = tmp_path / "recorder.py"
    script.write_text(RECORDER)
    root = tmp_path / "mem"
    layout = ClientLayout(root, "crash")

    def step(name: str) -> dict[str, Any]:
        proc = subprocess.run(
            [sys.executable, str(script), str(root), name],
            capture_output=True,
            text=True,
            timeout=60,
            check=True,
        )
        return json.loads(proc.stdout.strip().splitlines()[-1])

    ids = step("setup")
    proc = subprocess.Popen(
        [sys.executable, str(script), str(root), "fire"],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    assert proc.stdout is not None
    acked: list[str] = []
    deadline = time.monotonic() + 60
    try:
        while len(acked) < 250:
            line = proc.stdout.readline()
            assert line, "recorder exited early"
            _, number, sid = line.split()
            assert sid == ids["old"]
            acked.append(number)
            assert time.monotonic() < deadline
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.communicate(timeout=30)

    after = step("check")
    rows = {r["session_id"]: r for r in after["rows"]}
    old = rows[ids["old"]]
    assert (old["state"], old["resumes"]) == ("active", 1) and old["resumed"] is not None
    assert old["path"] == str(layout.session_file(ids["old"]))
    assert rows[ids["current"]]["state"] == "active"
    assert after["current"]["session_id"] == ids["current"]
    assert after["again"]["session_id"] == ids["old"]
    assert not layout.archive_file(ids["old"]).exists()

    parsed = transcript.read_transcript(layout.session_file(ids["old"]))
    users = Counter(
        p.text
        for c in parsed.conversations
        for e in c.exchanges
        for p in e.parts
        if p.label == "User"
    )
    assert [x for x in acked if users[f"user {x}"] != 1] == []
    assert max(users.values()) == 1 and users["first"] == 1 and users["after restart"] == 1
    numbers = [e.number for c in parsed.conversations for e in c.exchanges]
    assert numbers == list(range(1, len(numbers) + 1))
    for c in parsed.conversations:  # no torn exchange
        for e in c.exchanges:
            assert [p.label for p in e.parts] == ["User", "Assistant"]
