"""record_exchange's exchange_id: a retried exchange is written once, across restarts and kill -9.

Library tests drive ClientSessions with real files, real sqlite and a fake clock; the
daemon tests go through the real socket (and the real `memd record`).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import AbstractAsyncContextManager
from pathlib import Path
from typing import Any

import pytest

from memd.cli.client import MemdClient, RemoteError
from memd.errors import ExchangeConflict, StorageError
from memd.layout import ClientLayout
from memd.markdown import transcript
from memd.sessions.chat import InvalidRecord
from memd.sessions.exchange_keys import MAX_EXCHANGE_ID, check_exchange_id
from memd.sessions.tracker import ClientSessions
from tests.support.daemon import DaemonProcess
from tests.support.fake_llm import FakeLLM
from tests.support.sessions import Clock, archive, open_sessions, run

CLIENT = "c1"


def store(root: Path, clock: Clock, **kw: Any) -> AbstractAsyncContextManager[ClientSessions]:
    kw.setdefault("max_minutes", 120)
    # Room for one key in memory: every earlier key is looked up in the state database.
    kw.setdefault("index_capacity", 1)
    return open_sessions(root, clock, CLIENT, **kw)


def users(path: Path | str) -> list[str]:
    """Every user message in a transcript, in file order."""
    parsed = transcript.read_transcript(Path(path))
    return [
        p.text
        for c in parsed.conversations
        for e in c.exchanges
        for p in e.parts
        if p.label == "User"
    ]


def without_duplicate(result: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in result.items() if k != "duplicate"}


# --- library: ClientSessions ---------------------------------------------------------------


def test_retry_writes_nothing_and_returns_the_first_result(tmp_path: Path) -> None:
    async def scenario() -> None:
        clock = Clock()
        async with store(tmp_path, clock) as cs:
            first = await cs.record_exchange("mcp", "q1", "a1", exchange_id="e1")
            await cs.record_exchange("other", "o1", "o2")  # the file's last section moves on
            size = Path(first["path"]).stat().st_size
            before = await cs.list_sessions()
            clock.advance(5)
            again = await cs.record_exchange("mcp", "q1", "a1", exchange_id="e1")
            assert Path(first["path"]).stat().st_size == size
            assert await cs.list_sessions() == before  # activity times untouched
            nxt = await cs.record_exchange("mcp", "q2", "a2", exchange_id="e2")
        assert first["duplicate"] is False and again["duplicate"] is True
        assert without_duplicate(again) == without_duplicate(first)
        assert nxt["duplicate"] is False and nxt["conversation"] == first["conversation"]
        assert users(first["path"]) == ["q1", "o1", "q2"]

    run(scenario)


def test_without_exchange_id_nothing_changes_but_the_duplicate_flag(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with store(tmp_path, Clock()) as cs:
            one = await cs.record_exchange("mcp", "same", "same")
            two = await cs.record_exchange("mcp", "same", "same")
            none = await cs.record_exchange("mcp", "same", "same", exchange_id=None)
        assert set(one) == {"session_id", "conversation", "path", "duplicate", "redacted"}
        assert one["duplicate"] is two["duplicate"] is none["duplicate"] is False
        assert users(one["path"]) == ["same"] * 3

    run(scenario)


def test_conflicting_text_is_refused_and_writes_nothing(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with store(tmp_path, Clock()) as cs:
            first = await cs.record_exchange("mcp", "q", "a", exchange_id="e1")
            saved = Path(first["path"]).read_bytes()
            for user, assistant in [
                ("q", "other answer"),
                ("other question", "a"),
                ("qa", ""),
                ("", "qa"),
            ]:
                with pytest.raises(ExchangeConflict) as caught:
                    await cs.record_exchange("mcp", user, assistant, exchange_id="e1")
                assert caught.value.kind == "exchange_conflict"
                assert caught.value.code == -32011
                assert "'e1'" in caught.value.message and "'mcp'" in caught.value.message
            assert Path(first["path"]).read_bytes() == saved
            # the original text is still a plain retry (the timestamp only labels it);
            # the key is per conversation
            assert (
                await cs.record_exchange("mcp", "q", "a", "2020-01-01T00:00:00Z", exchange_id="e1")
            )["duplicate"]
            elsewhere = await cs.record_exchange("mcp-2", "q", "other", exchange_id="e1")
            # text the transcript writes the same way (line breaks) is the same exchange
            crlf = await cs.record_exchange("mcp", "l1\nl2", "x", exchange_id="e3")
            again = await cs.record_exchange("mcp", "l1\r\nl2", "x", exchange_id="e3")
        assert elsewhere["duplicate"] is False and elsewhere["conversation"] == 2
        assert crlf["duplicate"] is False and again["duplicate"] is True
        assert users(first["path"]) == ["q", "q", "l1\nl2"]

    run(scenario)


def test_keys_survive_restart_end_and_compaction_without_reopening(tmp_path: Path) -> None:
    layout = ClientLayout(tmp_path, CLIENT)

    async def scenario() -> None:
        clock = Clock()
        restores: list[str] = []
        async with store(tmp_path, clock) as cs:
            first = await cs.record_exchange("mcp", "q1", "a1", exchange_id="e1")
        sid = first["session_id"]
        async with store(tmp_path, clock) as cs:  # a restart: keys come from the state db
            assert (await cs.record_exchange("mcp", "q1", "a1", exchange_id="e1")) == {
                **first,
                "duplicate": True,
            }
            await cs.close_active()
        ended = await _rows(tmp_path, clock)
        clock.advance(10)
        async with store(
            tmp_path, clock, on_restore=[lambda i: restores.append(i["session_id"])]
        ) as cs:
            again = await cs.record_exchange("mcp", "q1", "a1", exchange_id="e1")
            assert await cs.list_sessions() == ended  # still ended, never reopened
        assert again == {**first, "duplicate": True}
        archive(layout, sid)
        async with store(tmp_path, clock) as cs:
            await cs.mark_compacted(sid)
        archived = layout.archive_file(sid).read_bytes()
        compacted = await _rows(tmp_path, clock)
        clock.advance(10)
        async with store(
            tmp_path, clock, on_restore=[lambda i: restores.append(i["session_id"])]
        ) as cs:
            late = await cs.record_exchange("mcp", "q1", "a1", exchange_id="e1")
            with pytest.raises(ExchangeConflict):
                await cs.record_exchange("mcp", "q1", "changed", exchange_id="e1")
            assert await cs.list_sessions() == compacted
        # the path the first call returned, though the transcript now sits in archive/
        assert late == {**first, "duplicate": True}
        assert not layout.session_file(sid).exists()
        assert layout.archive_file(sid).read_bytes() == archived
        assert restores == []
        assert [r["state"] for r in compacted] == ["compacted"]

    run(scenario)


async def _rows(root: Path, clock: Clock) -> list[dict[str, Any]]:
    async with store(root, clock) as cs:
        return await cs.list_sessions()


def test_concurrent_identical_calls_write_once(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with store(tmp_path, Clock()) as cs:
            results = await asyncio.gather(
                *(cs.record_exchange("mcp", "q", "a", exchange_id="e1") for _ in range(20))
            )
            await cs.record_exchange("mcp", "q2", "a2", exchange_id="e2")
            mixed = await asyncio.gather(
                *(cs.record_exchange("mcp", "q3", "a3", exchange_id="e3") for _ in range(5)),
                *(cs.record_exchange("mcp", "q3", "other", exchange_id="e3") for _ in range(5)),
                return_exceptions=True,
            )
        assert [r["duplicate"] for r in results].count(False) == 1
        assert {json.dumps(without_duplicate(r), sort_keys=True) for r in results} == {
            json.dumps(without_duplicate(results[0]), sort_keys=True)
        }
        assert [r["duplicate"] for r in mixed[:5]] == [False, True, True, True, True]
        assert all(isinstance(r, ExchangeConflict) for r in mixed[5:])
        assert users(results[0]["path"]) == ["q", "q2", "q3"]

    run(scenario)


def test_concurrent_retries_of_an_ended_session_reopen_nothing(tmp_path: Path) -> None:
    """Two identical calls race for a conversation whose session ended: one resumes it and
    writes; the other waits for that, finds the key and writes nothing."""

    async def scenario() -> None:
        clock = Clock()
        resumes: list[str] = []
        async with store(tmp_path, clock, on_resume=[lambda i: resumes.append(i["state"])]) as cs:
            first = await cs.record_exchange("mcp", "q1", "a1")
            await cs.close_active()
            clock.advance(10)
            results = await asyncio.gather(
                *(cs.record_exchange("mcp", "q2", "a2", exchange_id="e2") for _ in range(4))
            )
            rows = await cs.list_sessions()
        assert sorted(r["duplicate"] for r in results) == [False, True, True, True]
        assert {r["session_id"] for r in results} == {first["session_id"]}
        assert resumes == ["active"] and rows[0]["resumes"] == 1
        assert users(first["path"]) == ["q1", "q2"]

    run(scenario)


def test_failed_commit_forgets_the_key_so_the_retry_writes(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with store(tmp_path, Clock()) as cs:
            r = await cs.record_exchange("mcp", "q1", "a1", exchange_id="e1")
            path = Path(r["path"])
            saved = path.read_bytes()
            path.unlink()
            path.mkdir()  # the next append cannot open the transcript
            failed = await asyncio.gather(
                *(cs.record_exchange("mcp", "q2", "a2", exchange_id="e2") for _ in range(3)),
                return_exceptions=True,
            )
            assert all(isinstance(f, StorageError) for f in failed), failed
            path.rmdir()
            path.write_bytes(saved)
            retry = await cs.record_exchange("mcp", "q2", "a2", exchange_id="e2")
            again = await cs.record_exchange("mcp", "q2", "a2", exchange_id="e2")
        assert (retry["duplicate"], again["duplicate"]) == (False, True)
        assert users(path) == ["q1", "q2"]

    run(scenario)


def test_state_database_without_the_keys_table_keeps_working(tmp_path: Path) -> None:
    """A state db from before exchange_ids: the same schema without `exchange_keys`."""
    state = tmp_path / CLIENT / ".memd" / "state.sqlite3"

    async def scenario() -> None:
        clock = Clock()
        async with store(tmp_path, clock) as cs:
            old = await cs.record_exchange("mcp", "old question", "old answer")
        db = sqlite3.connect(state)
        db.execute("DROP TABLE exchange_keys")
        db.commit()
        db.close()
        async with store(tmp_path, clock) as cs:
            follow = await cs.record_exchange("mcp", "follow-up", "answer", exchange_id="e1")
        async with store(tmp_path, clock) as cs:
            retry = await cs.record_exchange("mcp", "follow-up", "answer", exchange_id="e1")
        assert (follow["session_id"], follow["conversation"]) == (
            old["session_id"],
            old["conversation"],
        )
        assert retry == {**follow, "duplicate": True}
        assert users(old["path"]) == ["old question", "follow-up"]

    run(scenario)
    db = sqlite3.connect(state)
    rows = db.execute("SELECT conv, exchange_id, number FROM exchange_keys").fetchall()
    db.close()
    assert rows == [(1, "e1", 1)]


@pytest.mark.parametrize(
    "value",
    [
        "",
        " ",
        "\t",
        5,
        1.5,
        True,
        [],
        {},
        "x" * (MAX_EXCHANGE_ID + 1),
        "a\nb",
        "a\x00b",
        "\x7f",
        "a\ud800",
    ],
)
def test_bad_exchange_ids_are_refused(tmp_path: Path, value: Any) -> None:
    with pytest.raises(InvalidRecord) as caught:
        check_exchange_id(value)
    assert caught.value.field == "exchange_id" and caught.value.code == -32602

    async def scenario() -> None:
        async with store(tmp_path, Clock()) as cs:
            with pytest.raises(InvalidRecord):
                await cs.record_exchange("mcp", "q", "a", exchange_id=value)
            assert await cs.list_sessions() == []

    run(scenario)


@pytest.mark.parametrize(
    "value", ["e", "x" * MAX_EXCHANGE_ID, "retry/1", "../..", "é-\u2028-😀", " padded "]
)
def test_exchange_ids_are_opaque_and_exact(value: str) -> None:
    assert check_exchange_id(value) == value


# --- the daemon ------------------------------------------------------------------------------

AGENT = "agent"
CLIENTS = {AGENT: {"memory_enabled": True, "mode": "mcp_via_llm"}}


def exchange(
    conv: str = "c1",
    user: str = "hello",
    assistant: str = "hi",
    exchange_id: Any = None,
    **extra: Any,
) -> dict[str, Any]:
    params = {
        "client_id": AGENT,
        "conversation_id": conv,
        "user": user,
        "assistant": assistant,
        **extra,
    }
    if exchange_id is not None:
        params["exchange_id"] = exchange_id
    return params


def _pipeline(sock: Path, requests: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Send every request at once on one connection; the replies, by id."""
    with MemdClient(sock, timeout=60) as client:  # ASCII JSON: lone surrogates as escapes
        client.send_line(b"\n".join(json.dumps(r).encode() for r in requests))
        replies = [json.loads(client.read_line()) for _ in requests]
    return sorted(replies, key=lambda r: r["id"])


def _request(i: int, params: dict[str, Any]) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": i, "method": "memory.record_exchange", "params": params}


def test_daemon_retry_conflict_and_bad_ids(config_file, daemon_factory) -> None:
    memd = daemon_factory(config_file(clients=CLIENTS))
    first = memd.call("memory.record_exchange", exchange(exchange_id="turn-1"))
    again = memd.call("memory.record_exchange", exchange(exchange_id="turn-1"))
    assert first["duplicate"] is False
    assert again == {**first, "duplicate": True}
    with pytest.raises(RemoteError) as err:
        memd.call("memory.record_exchange", exchange(assistant="changed", exchange_id="turn-1"))
    assert (err.value.code, err.value.kind) == (-32011, "exchange_conflict")
    assert err.value.data["exchange_id"] == "turn-1"
    bad_ids = [5, 1.5, True, [], {"a": 1}, "", "   ", "x" * 257, "a\nb", "\x00", "a\ud800"]
    replies = _pipeline(
        memd.socket,
        [_request(i, exchange(user="bad", exchange_id=bad)) for i, bad in enumerate(bad_ids)],
    )
    for bad, reply in zip(bad_ids, replies, strict=True):
        error = reply["error"]
        assert error["code"] == -32602 and "exchange_id" in error["message"], (bad, error)
    # null counts as absent, like every optional param: a plain record
    plain = memd.call("memory.record_exchange", {**exchange(user="plain"), "exchange_id": None})
    assert plain["duplicate"] is False
    assert memd.call("memory.record_exchange", exchange(exchange_id="turn-1")) == again
    assert users(first["path"]) == ["hello", "plain"]


def test_pipelined_and_parallel_identical_calls_write_once(config_file, daemon_factory) -> None:
    memd = daemon_factory(config_file(clients=CLIENTS))
    replies = _pipeline(memd.socket, [_request(i, exchange(exchange_id="p")) for i in range(30)])
    results = [r["result"] for r in replies]
    assert [r["duplicate"] for r in results].count(False) == 1
    assert len({r["session_id"] for r in results}) == 1

    gate = threading.Barrier(4)
    out: list[list[dict[str, Any]]] = []

    def connection() -> None:
        gate.wait()
        out.append(
            _pipeline(
                memd.socket,
                [_request(i, exchange(conv="c2", user="par", exchange_id="p")) for i in range(10)],
            )
        )

    threads = [threading.Thread(target=connection) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    flags = [r["result"]["duplicate"] for replies in out for r in replies]
    assert len(flags) == 40 and flags.count(False) == 1
    assert users(results[0]["path"]) == ["hello", "par"]


def _flood(sock: Path, conv: str, n: int, acked: dict[str, dict[str, Any]]) -> None:
    """Pipeline n keyed records on one connection; note each acknowledged result."""
    # the daemon is killed mid-way
    with contextlib.suppress(Exception), MemdClient(sock, timeout=60) as client:
        client.send_line(
            b"\n".join(
                json.dumps(
                    _request(
                        i, exchange(conv, f"{conv}-u{i}", f"{conv}-a{i}", exchange_id=f"{conv}-{i}")
                    )
                ).encode()
                for i in range(n)
            )
        )
        for _ in range(n):
            reply = json.loads(client.read_line())
            if "result" in reply:
                acked[f"{conv}-{reply['id']}"] = reply["result"]


def test_sigkill_then_retrying_every_call_writes_each_exchange_once(
    tmp_path, config_file, daemon_factory
) -> None:
    path = config_file(clients=CLIENTS)
    memd = daemon_factory(path)
    single = memd.call("memory.record_exchange", exchange("solo", exchange_id="s1"))
    memd.kill(signal.SIGKILL)
    memd.proc.wait(10)
    memd = daemon_factory(path)
    assert memd.call("memory.record_exchange", exchange("solo", exchange_id="s1")) == {
        **single,
        "duplicate": True,
    }

    acked: dict[str, dict[str, Any]] = {}
    convs, n = [f"t{k}" for k in range(4)], 250
    threads = [threading.Thread(target=_flood, args=(memd.socket, c, n, acked)) for c in convs]
    for t in threads:
        t.start()
    deadline = time.monotonic() + 60
    while len(acked) < 200 and time.monotonic() < deadline:
        time.sleep(0.002)
    memd.kill(signal.SIGKILL)
    for t in threads:
        t.join(60)
    memd.proc.wait(10)
    assert 200 <= len(acked) < len(convs) * n, len(acked)

    # The gateway retries everything, acknowledged or not, on the restarted daemon.
    memd = daemon_factory(path)
    retried: dict[str, dict[str, Any]] = {}
    for conv in convs:
        replies = _pipeline(
            memd.socket,
            [
                _request(
                    i, exchange(conv, f"{conv}-u{i}", f"{conv}-a{i}", exchange_id=f"{conv}-{i}")
                )
                for i in range(n)
            ],
        )
        retried.update({f"{conv}-{r['id']}": r["result"] for r in replies})
    for key, result in acked.items():
        assert retried[key] == {**result, "duplicate": True}, key
    counts = Counter(
        u for f in (tmp_path / "memory" / AGENT / "sessions").glob("*.md") for u in users(f)
    )
    assert counts["hello"] == 1
    assert all(counts[f"{c}-u{i}"] == 1 for c in convs for i in range(n)), [
        k for k, v in counts.items() if v != 1
    ]
    assert sum(counts.values()) == 1 + len(convs) * n


def test_memd_record_exchange_id(config_file, daemon_factory) -> None:
    path = config_file(clients=CLIENTS)
    daemon_factory(path)

    def record(*extra: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [
                sys.executable,
                "-m",
                "memd.cli",
                "record",
                AGENT,
                "--config",
                str(path),
                "--conversation",
                "cli",
                "--user",
                "from the shell",
                "--assistant",
                "ok",
                *extra,
            ],
            capture_output=True,
            text=True,
            timeout=60,
        )

    first, second = record("--exchange-id", "k1"), record("--exchange-id", "k1", "--json")
    assert first.returncode == 0 and first.stdout.startswith("recorded in session"), first
    assert json.loads(second.stdout)["duplicate"] is True
    assert record("--exchange-id", "k1").stdout.startswith("already recorded in session")
    clash = subprocess.run(
        [
            sys.executable,
            "-m",
            "memd.cli",
            "record",
            AGENT,
            "--config",
            str(path),
            "--conversation",
            "cli",
            "--user",
            "other",
            "--assistant",
            "ok",
            "--exchange-id",
            "k1",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert clash.returncode == 1 and "exchange_conflict" in clash.stderr
    chat = subprocess.run(
        [
            sys.executable,
            "-m",
            "memd.cli",
            "record",
            AGENT,
            "--config",
            str(path),
            "--chat",
            "-",
            "--exchange-id",
            "k2",
        ],
        input="{}",
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert chat.returncode == 2 and "--exchange-id" in chat.stderr


@pytest.fixture
def fake() -> Iterator[FakeLLM]:
    with FakeLLM() as server:
        server.retry_after_ms = 5
        yield server


def _wait_for(predicate: Callable[[], Any], what: str, memd: DaemonProcess) -> Any:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if last := predicate():
            return last
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}\n{memd.log()}")


@pytest.mark.slow
def test_retry_after_compaction_keeps_the_archive_and_summary(
    tmp_path, config_file, daemon_factory, fake
) -> None:
    memd = daemon_factory(
        config_file(
            clients=CLIENTS,
            compaction={
                "enabled": True,
                "llm_provider": "openai",
                "base_url": fake.base_url,
                "llm_model": "fake",
            },
        )
    )
    first = memd.call("memory.record_exchange", exchange(user="FACT-kayak", exchange_id="x1"))
    sid = first["session_id"]
    memd.call("sessions.close", {"client_id": AGENT})

    def compacted() -> bool:
        row = memd.call("sessions.list", {"client_id": AGENT})["sessions"][0]
        return (
            row["state"] == "compacted"
            and (row.get("compaction") or {}).get("state") == "compacted"
        )

    _wait_for(compacted, "compaction", memd)
    root = tmp_path / "memory" / AGENT
    files = {p: p.read_bytes() for p in root.glob("*/*.md")}
    assert set(files) == {root / "archive" / f"{sid}.md", root / "sessions" / f"{sid}-summary.md"}
    before = memd.call("sessions.list", {"client_id": AGENT})["sessions"]
    again = memd.call("memory.record_exchange", exchange(user="FACT-kayak", exchange_id="x1"))
    assert again == {**first, "duplicate": True}
    assert memd.call("sessions.list", {"client_id": AGENT})["sessions"] == before
    assert {p: p.read_bytes() for p in root.glob("*/*.md")} == files
