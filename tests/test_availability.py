"""One client's big input must not stall the others: bounded work, connections and buffers.

What is measured (how long other calls wait while a big record is written) lives in
bench/fairness.py; these tests pin the behaviour that keeps it bounded: work per request
follows what is kept rather than what was sent, caps on connections and on buffered
partial lines refuse new work with a clear `busy` error, an overloaded recall lane says
`busy` (not `index_unavailable`), and a giant exchange is indexed only up to the policy's
limit while the transcript keeps it whole.
"""

from __future__ import annotations

import contextlib
import json
import socket
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from memd.cli.client import ClientError, MemdClient, RemoteError
from memd.markdown import read_transcript
from memd.markdown.transcript import conversation_title as title
from tests.support.daemon import DaemonProcess, base_config, write_config
from tests.support.faults import call, pipeline_running, recall_finds, wait_for

MCP = {"memory_enabled": True, "mode": "mcp_via_llm"}


def _start(tmp: Path, limits: dict, clients: dict | None = None) -> DaemonProcess:
    path = write_config(
        tmp / "config.toml", base_config(tmp, clients=clients or {"agent": MCP}, limits=limits)
    )
    return DaemonProcess(path).start()


@pytest.fixture
def capped(tmp_path: Path) -> Iterator[DaemonProcess]:
    memd = _start(tmp_path, {"max_connections": 4, "max_buffered_mib": 1})
    yield memd
    memd.end()


# --- 6. work bounded by what is kept ---------------------------------------------------------


def test_title_of_a_huge_message_is_taken_from_its_start_only() -> None:
    """A conversation title looks at a bounded start of the first message (it keeps 70
    characters), so an 8 MiB message costs what a short one does."""
    head = " \u200b\t" * 3000  # whitespace and format characters: nothing a title shows
    big = head + "rotate the production API keys " * 300_000
    assert len(big) > 8_000_000
    assert title(big) == title(big[: len(head)])
    assert title("rotate the keys " + "x" * 8_000_000).startswith("rotate the keys")


# --- 8. connections and buffered partial lines -----------------------------------------------


def _busy_reply(sock: socket.socket) -> dict:
    sock.settimeout(30)
    data = b""
    while not data.endswith(b"\n"):
        chunk = sock.recv(65536)
        if not chunk:
            break
        data += chunk
    assert data, "closed without a word"
    return json.loads(data.splitlines()[0])


def test_connections_past_the_cap_are_refused_with_busy(capped: DaemonProcess) -> None:
    held = [
        wait_for(lambda: _served_client(capped), 10, 0.1, "a connection served") for _ in range(4)
    ]  # a connection closed just before may still hold a slot
    try:
        extra = socket.socket(socket.AF_UNIX)
        extra.connect(str(capped.socket))
        reply = _busy_reply(extra)
        extra.close()
        assert reply["error"]["data"]["kind"] == "busy", reply
        assert "4" in reply["error"]["message"] and "max_connections" in reply["error"]["message"]
    finally:
        held.pop().close()
    wait_for(lambda: _connects(capped.socket), 10, 0.1, "a slot freed by a closed connection")
    for client in held:
        assert client.call("clients.list")["clients"]
        client.close()


def _served_client(memd: DaemonProcess) -> MemdClient | None:
    client = MemdClient(memd.socket, timeout=30)
    try:
        client.connect()
        client.call("clients.list")
    except ClientError:
        client.close()
        return None
    return client


def _connects(path: Path) -> bool:
    try:
        return bool(call(path, "clients.list"))
    except Exception:
        return False


def test_buffered_partial_lines_past_the_cap_are_refused_with_busy(capped: DaemonProcess) -> None:
    """Two connections each holding 700 KB of an unfinished line exceed 1 MiB in total:
    one of them is refused with busy, the other goes on, and new calls are served."""
    a, b = (socket.socket(socket.AF_UNIX) for _ in range(2))
    a.connect(str(capped.socket))
    b.connect(str(capped.socket))
    blob = b'{"jsonrpc":"2.0","id":1,"method":"clients.list","params":{"pad":"' + b"x" * 700_000
    a.sendall(blob)
    assert call(capped.socket, "clients.list")
    with contextlib.suppress(OSError):
        b.sendall(blob)
    reply = _busy_reply(b)
    assert reply["error"]["data"]["kind"] == "busy", reply
    assert "max_buffered_mib" in reply["error"]["message"], reply
    a.sendall(b'"}}\n')
    answer = _busy_reply(a)
    assert answer["id"] == 1 and answer["error"]["code"] == -32602, answer  # unknown param
    a.close()
    b.close()
    assert call(capped.socket, "clients.list")


# --- 12. an overloaded recall lane is busy, not unavailable ----------------------------------


@pytest.mark.slow
def test_recalls_past_the_lane_bound_fail_as_busy(tmp_path: Path) -> None:
    memd = _start(tmp_path, {"recall_queue": 0})
    try:
        sock = memd.socket
        wait_for(lambda: pipeline_running(sock, "agent"), 180, 0.3, "pipeline RUNNING")
        call(
            sock,
            "memory.record_exchange",
            {
                "client_id": "agent",
                "conversation_id": "c",
                "user": "Which tea is best?",
                "assistant": "Oolong",
            },
        )
        wait_for(lambda: recall_finds(sock, "agent", "tea best", "Oolong"), 120, 0.3, "indexed")
        kinds: list[str] = []
        lock = threading.Lock()
        start = threading.Barrier(24)

        def recall() -> None:
            start.wait()
            try:
                call(sock, "memory.recall", {"client_id": "agent", "query": "tea"})
                kind = "ok"
            except RemoteError as exc:
                kind = exc.kind or str(exc.code)
            with lock:
                kinds.append(kind)

        threads = [threading.Thread(target=recall) for _ in range(24)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        assert set(kinds) <= {"ok", "busy"}, kinds
        assert "busy" in kinds and "ok" in kinds, kinds
    finally:
        memd.stop()


# --- 7. the indexing size policy -------------------------------------------------------------


@pytest.mark.slow
def test_a_giant_exchange_is_kept_whole_and_indexed_only_up_to_the_limit(tmp_path: Path) -> None:
    """With index_exchange_kib = 16, a 2 MB exchange is on disk in full, its start is
    found by recall, and its tail is not in the index (so indexing stays prompt)."""
    memd = _start(tmp_path, {"index_exchange_kib": 16})
    try:
        sock = memd.socket
        wait_for(lambda: pipeline_running(sock, "agent"), 180, 0.3, "pipeline RUNNING")
        filler = "lorem ipsum dolor sit amet " * 80_000
        user = (
            "The harbour ferry timetable changes in April. "
            + filler
            + " The lighthouse keeper is called Morwenna."
        )
        result = call(
            sock,
            "memory.record_exchange",
            {"client_id": "agent", "conversation_id": "giant", "user": user, "assistant": "Noted."},
        )
        call(
            sock,
            "memory.record_exchange",
            {
                "client_id": "agent",
                "conversation_id": "small",
                "user": "What colour is the front door?",
                "assistant": "Teal.",
            },
        )
        wait_for(
            lambda: recall_finds(sock, "agent", "front door colour", "Teal"),
            180,
            0.3,
            "a later small exchange indexed",
        )
        wait_for(
            lambda: recall_finds(sock, "agent", "harbour ferry timetable", "ferry"),
            60,
            0.3,
            "the giant exchange's start indexed",
        )
        found = call(
            sock,
            "memory.recall",
            {"client_id": "agent", "query": "lighthouse keeper Morwenna", "top_k": 10},
        )
        assert "Morwenna" not in json.dumps(found), "the tail past the limit was indexed"
        parsed = read_transcript(Path(result["path"]))
        kept = [p.text for c in parsed.conversations for e in c.exchanges for p in e.parts]
        assert kept[:2] == [user, "Noted."], "the transcript does not read back exactly"
    finally:
        memd.stop()


def test_limits_are_validated(tmp_path: Path) -> None:
    from memd.config import ConfigError, parse_config

    for bad in (
        {"max_connections": 0},
        {"max_buffered_mib": -1},
        {"recall_queue": -1},
        {"index_exchange_kib": -1},
        {"index_exchange_kib": 1.5},
        {"nope": 1},
    ):
        with pytest.raises(ConfigError, match="limits"):
            parse_config({"limits": bad})
    ok = parse_config({"limits": {"max_connections": 8}})
    assert ok.limits.max_connections == 8
    assert ok.limits.index_exchange_chars == 64 * 1024  # the default
    assert parse_config({"limits": {"index_exchange_kib": 0}}).limits.index_exchange_chars is None


def test_a_client_closing_mid_reply_does_not_affect_others(capped: DaemonProcess) -> None:
    with MemdClient(capped.socket) as client:
        client.send_line(b'{"jsonrpc":"2.0","id":1,"method":"clients.list"}')
    assert call(capped.socket, "clients.list")
