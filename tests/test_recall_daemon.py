"""Recall through a real `memd run`: memory.recall, memory.tools, memory.call_tool, `memd recall`.

One daemon serves the whole module (starting one costs seconds on 2 cores). Every exchange
is recorded through the socket; memd's own pipeline (index server + `memsearch watch` per
client) indexes it, and each test polls recall with a deadline until what it needs is
searchable. Tests that change the daemon (a config edit, a stopped index server) put it
back before they return, so the tests do not depend on their order.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from memd.cli.client import MemdClient, RemoteError
from memd.recall import NO_RESULTS
from tests.support.daemon import REPO, DaemonProcess, base_config, write_config
from tests.support.samples import ALICE, BOB

pytestmark = pytest.mark.slow

DEADLINE = 60.0  # seconds to wait for the watcher to index what was just recorded

CLIENTS: dict[str, dict[str, Any]] = {
    "alice": {"memory_enabled": True, "mode": "both"},
    "bob": {"memory_enabled": True, "mode": "mcp_via_llm"},
    "carol": {"memory_enabled": True, "mode": "both"},  # never records: an empty index
    "off": {"memory_enabled": False, "mode": "both"},
    "unset": {"mode": "both"},
    "llmonly": {"memory_enabled": True, "mode": "llm_only"},
}

# How ALICE's Unicode exchange reads in a transcript.
UNICODE_EXCHANGE = (
    "**User:** Über die Straßenbahn in Zürich 🚋?\n\n**Assistant:** Die "
    "Straßenbahn fährt alle 7 Minuten; в Москве тоже метро. 東京の電車も便利です。"
)


class Memd:
    """The module's daemon, with the calls the tests make."""

    def __init__(self, proc: DaemonProcess, config: dict[str, Any]) -> None:
        self.proc = proc
        self.config = config
        self.recorded: dict[str, list[dict[str, Any]]] = {}

    def call(self, method: str, timeout: float = 30.0, **params: Any) -> Any:
        with MemdClient(self.proc.socket, timeout=timeout) as client:
            return client.call(method, params)

    def error(self, method: str, **params: Any) -> RemoteError:
        with pytest.raises(RemoteError) as err:
            self.call(method, **params)
        return err.value

    def record(self, client_id: str, exchanges: list[tuple[str, str, str, str]]) -> None:
        for conv, user, assistant, stamp in exchanges:
            self.recorded.setdefault(client_id, []).append(
                self.call(
                    "memory.record_exchange",
                    client_id=client_id,
                    conversation_id=conv,
                    user=user,
                    assistant=assistant,
                    timestamp=stamp,
                )
            )

    def recall(self, client_id: str, query: str, **kw: Any) -> dict[str, Any]:
        return self.call("memory.recall", client_id=client_id, query=query, **kw)

    def wait_recall(
        self, client_id: str, query: str, done: Callable[[dict[str, Any]], bool], **kw: Any
    ) -> dict[str, Any]:
        """Poll memory.recall until `done(result)`; an index still starting is retried."""
        deadline = time.monotonic() + DEADLINE
        last: Any = None
        while time.monotonic() < deadline:
            try:
                last = self.recall(client_id, query, **kw)
                if done(last):
                    return last
            except RemoteError as exc:
                if exc.kind != "index_unavailable":
                    raise
                last = exc
            time.sleep(0.2)
        raise AssertionError(
            f"recall of {query!r} for {client_id} never got there: {last!r}\n{self.proc.log()}"
        )

    def wait_tools(self, client_id: str, done: Callable[[dict[str, Any]], bool]) -> dict[str, Any]:
        deadline = time.monotonic() + DEADLINE
        while time.monotonic() < deadline:
            answer = self.call("memory.tools", client_id=client_id)
            if done(answer):
                return answer
            time.sleep(0.1)
        raise AssertionError(f"memory.tools never changed: {answer!r}")

    def edit_config(self, **changes: Any) -> None:
        write_config(self.proc.config_path, {**self.config, **changes})


@pytest.fixture(scope="module")
def memd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Memd]:
    tmp = tmp_path_factory.mktemp("recall-daemon")
    # No relevance cut: these tests look at what the search finds (the cut and the
    # abstention are tested in test_recall.py and bench/locomo.py).
    config = base_config(tmp, clients=CLIENTS, recall={"min_score": 0.0, "drop_below": 0.0})
    proc = DaemonProcess(write_config(tmp / "config.toml", config))
    try:
        proc.start()
        daemon = Memd(proc, config)
        daemon.record("alice", ALICE)
        daemon.record("bob", BOB)
        # Fewer chunks than top_k: a search returns every indexed exchange.
        daemon.wait_recall("alice", "anything", lambda r: len(r["results"]) == len(ALICE), top_k=20)
        daemon.wait_recall("bob", "anything", lambda r: len(r["results"]) == len(BOB))
        yield daemon
    finally:
        proc.stop()


def _text(result: dict[str, Any]) -> str:
    [block] = result["content"]
    assert block["type"] == "text"
    return block["text"]


# -- memory.recall ------------------------------------------------------------------------


def test_recall_finds_the_exchange_with_its_label(memd: Memd) -> None:
    out = memd.recall("alice", "capital of Australia", top_k=2)
    assert len(out["results"]) == 2 and out["text"].startswith("Found 2 memories")
    best = out["results"][0]
    assert "Canberra is the capital of Australia." in best["content"]
    assert best["heading"] == (
        "2026-10-01 10:00:00 UTC · exchange 1 — What is the capital of Australia?"
    )
    assert best["kind"] == "transcript" and best["when"] == "2026-10-01 10:00:00 UTC"
    session = memd.recorded["alice"][0]["session_id"]
    assert best["source"] == f"sessions/{session}.md" and best["session_id"] == session
    assert 0 < best["score"] <= 1 and best["chunk_hash"]
    assert "Canberra" in out["text"].split("[2]")[0]
    assert str(memd.proc.config_path.parent) not in repr(out)  # no absolute paths
    assert all("client_id:" not in r["content"] for r in out["results"])  # no front matter


def test_time_filters_select_single_exchanges_of_one_file(memd: Memd) -> None:
    both = memd.recall("alice", "greenhouse tomatoes", top_k=2)
    assert {r["when"] for r in both["results"]} == {
        "2026-11-05 09:00:00 UTC",
        "2026-11-05 15:00:00 UTC",
    }
    assert len({r["source"] for r in both["results"]}) == 1
    later = memd.recall("alice", "greenhouse tomatoes", after="2026-11-05T12:00")
    assert [r["when"] for r in later["results"]][:1] == ["2026-11-05 15:00:00 UTC"]
    assert all(r["when"] >= "2026-11-05 12" for r in later["results"])
    earlier = memd.recall("alice", "greenhouse tomatoes", before="2026-11-05T12:00:00Z")
    assert "Water the greenhouse tomatoes" in earlier["results"][0]["content"]
    assert all(r["when"] < "2026-11-05 12" for r in earlier["results"])
    exact = memd.recall(
        "alice", "greenhouse tomatoes", after="2026-11-05T15:00:00Z", before="2026-11-05T15:00:01Z"
    )
    assert [r["when"] for r in exact["results"]] == ["2026-11-05 15:00:00 UTC"]
    offset = memd.recall(
        "alice", "tomatoes", after="2026-11-05T16:00+02:00", before="2026-11-05T17:00+02:00"
    )  # 14:00-15:00 UTC: 15:00 excluded
    assert offset == {"results": [], "text": NO_RESULTS}
    day = memd.recall("alice", "tomatoes", after="2026-11-05", before="2026-11-06")
    assert len(day["results"]) == 2


def test_relative_time_filters(memd: Memd) -> None:
    recent = memd.recall("alice", "sourdough starter", after="1d")
    assert recent["results"]
    assert all("doubled overnight" in r["content"] for r in recent["results"])
    old = memd.recall("alice", "sourdough starter", after="1w", before="1d")
    assert "acetone" in old["results"][0]["content"]
    assert all("doubled" not in r["content"] for r in old["results"])


def test_unicode_round_trips_through_record_and_recall(memd: Memd) -> None:
    for query in ("Straßenbahn Zürich", "Москве метро", "東京の電車"):
        best = memd.recall("alice", query, top_k=1)["results"][0]
        assert UNICODE_EXCHANGE in best["content"]


def test_client_never_sees_another_clients_memory(memd: Memd) -> None:
    own = memd.recall("bob", "Project Nightingale launch code", top_k=1)["results"][0]
    assert "tangerine-42" in own["content"]
    bob_path = memd.recorded["bob"][0]["path"]
    probes = [
        "Project Nightingale launch code tangerine-42",
        "tangerine",
        own["chunk_hash"],
        own["source"],
        Path(own["source"]).stem,
        bob_path,
        f"bob {bob_path}",
        "../bob/sessions",
        "launch code",
    ]
    alice_sources = {f"sessions/{r['session_id']}.md" for r in memd.recorded["alice"]}
    for query in probes:
        out = memd.recall("alice", query, top_k=20)
        assert "Nightingale" not in repr(out) and "tangerine" not in repr(out), query
        assert {r["source"] for r in out["results"]} <= alice_sources, query
        assert own["chunk_hash"] not in {r["chunk_hash"] for r in out["results"]}, query
        tool = memd.call(
            "memory.call_tool",
            client_id="alice",
            name="MemoryRecall",
            arguments={"query": query, "top_k": 20},
        )
        assert not tool["isError"] and "tangerine" not in _text(tool), query


def test_empty_index_says_no_memories(memd: Memd) -> None:
    out = memd.wait_recall("carol", "anything at all", lambda r: True)
    assert out == {"results": [], "text": NO_RESULTS}
    tool = memd.call(
        "memory.call_tool",
        client_id="carol",
        name="MemoryRecall",
        arguments={"query": "capital of Australia"},
    )
    assert tool == {"content": [{"type": "text", "text": NO_RESULTS}], "isError": False}


@pytest.mark.parametrize(
    ("params", "code", "kind", "fragment"),
    [
        ({"after": "yesterday"}, -32602, "invalid_params", "30m"),
        ({"before": "2026-02-30"}, -32602, "invalid_params", "2026-11-01T14:00"),
        ({"after": "1d", "before": "2d"}, -32602, "invalid_params", "earlier than"),
        ({"top_k": 0}, -32602, "invalid_params", "1 to 20"),
        ({"top_k": "3"}, -32602, "invalid_params", "top_k"),
        ({"query": ""}, -32602, "invalid_params", "non-empty"),
        ({"query": 7}, -32602, "invalid_params", "query"),
        ({"chunk_hash": "x"}, -32602, "invalid_params", "chunk_hash"),
        ({"client_id": "nobody"}, -32001, "unknown_client", "nobody"),
        ({"client_id": "off"}, -32002, "memory_disabled", "not enabled"),
        ({"client_id": "unset"}, -32002, "memory_disabled", "not enabled"),
        ({"client_id": "llmonly"}, -32003, "unsupported_mode", "llm_only"),
        ({"client_id": "../bob"}, -32004, "invalid_id", "client_id"),
    ],
)
def test_memory_recall_errors(
    memd: Memd, params: dict[str, Any], code: int, kind: str, fragment: str
) -> None:
    error = memd.error("memory.recall", **{"client_id": "alice", "query": "q", **params})
    assert (error.code, error.kind) == (code, kind)
    assert fragment in error.message


# -- memory.tools and memory.call_tool ----------------------------------------------------


def test_memory_tools_per_client(memd: Memd) -> None:
    for cid in ("alice", "bob", "carol"):
        answer = memd.call("memory.tools", client_id=cid)
        assert answer["server"] == "_memory" and answer["memory_on"] is True
        assert answer["reason"] is None
        [tool] = answer["tools"]
        assert tool["name"] == "MemoryRecall" and tool["inputSchema"]["required"] == ["query"]
        assert "MemoryRecall" in answer["instructions"]
    for cid, kind in (
        ("off", "memory_disabled"),
        ("unset", "memory_disabled"),
        ("llmonly", "unsupported_mode"),
        ("nobody", "unknown_client"),
    ):
        off = memd.call("memory.tools", client_id=cid)
        assert off["tools"] == [] and off["instructions"] == "" and off["memory_on"] is False
        assert off["reason"]["kind"] == kind
    assert memd.error("memory.tools", client_id="../x").kind == "invalid_id"


def test_memory_call_tool(memd: Memd) -> None:
    ok = memd.call(
        "memory.call_tool",
        client_id="alice",
        name="MemoryRecall",
        arguments={"query": "capital of Australia", "top_k": 1},
    )
    assert ok["isError"] is False and "Canberra" in _text(ok)
    assert _text(ok).startswith("Found 1 memory")
    none = memd.call(
        "memory.call_tool",
        client_id="alice",
        name="MemoryRecall",
        arguments={"query": "tomatoes", "before": "2001-01-01"},
    )
    assert none == {"content": [{"type": "text", "text": NO_RESULTS}], "isError": False}
    cases = [
        ("alice", "MemoryRecall", {"query": "q", "after": "last tuesday"}, "30m"),
        ("alice", "MemoryRecall", {}, "query"),
        ("alice", "MemoryRecall", {"query": "q", "top_k": 99}, "top_k"),
        ("alice", "Other", {"query": "q"}, "Unknown tool 'Other'"),
        ("off", "MemoryRecall", {"query": "q"}, "not enabled"),
        ("llmonly", "MemoryRecall", {"query": "q"}, "llm_only"),
        ("nobody", "MemoryRecall", {"query": "q"}, "unknown client"),
    ]
    for cid, name, arguments, fragment in cases:
        result = memd.call("memory.call_tool", client_id=cid, name=name, arguments=arguments)
        assert result["isError"] is True, (cid, name, arguments)
        assert fragment in _text(result), (cid, name, _text(result))
    bad = memd.error("memory.call_tool", client_id="alice", name="MemoryRecall", arguments=[1])
    assert bad.code == -32602
    assert (
        memd.error(
            "memory.call_tool", client_id="../x", name="MemoryRecall", arguments={"query": "q"}
        ).kind
        == "invalid_id"
    )


def test_config_edit_renames_the_tool_and_sets_top_k(memd: Memd) -> None:
    try:
        memd.edit_config(recall_tool_name="Remember", search_top_k=8)
        answer = memd.wait_tools("alice", lambda a: a["tools"][0]["name"] == "Remember")
        [tool] = answer["tools"]
        assert tool["inputSchema"]["properties"]["top_k"]["default"] == 8
        assert "Remember" in answer["instructions"] and "MemoryRecall" not in answer["instructions"]
        old = memd.call(
            "memory.call_tool",
            client_id="alice",
            name="MemoryRecall",
            arguments={"query": "tomatoes"},
        )
        assert old["isError"] is True and "'Remember'" in _text(old)
        new = memd.call(
            "memory.call_tool",
            client_id="alice",
            name="Remember",
            arguments={"query": "greenhouse tomatoes"},
        )
        assert new["isError"] is False and "greenhouse tomatoes" in _text(new)
        # The new default top_k: alice has 6 exchanges, all of them within 8.
        assert len(memd.recall("alice", "tomatoes")["results"]) == len(ALICE)
        assert memd.call("memory.tools", client_id="off")["tools"] == []
    finally:
        memd.edit_config()
        memd.wait_tools("alice", lambda a: a["tools"][0]["name"] == "MemoryRecall")
    assert len(memd.recall("alice", "tomatoes")["results"]) == 5


def test_stopped_index_server_is_unavailable_not_a_hang(memd: Memd) -> None:
    """SIGSTOP carol's index server: its socket accepts but never answers. With the shared
    index server (the default) that stops every client's index: each recall answers
    "unavailable" instead of hanging; with a server per client the others keep working."""
    memd.wait_recall("carol", "q", lambda r: True)  # carol's index is up
    server = memd.call("daemon.status")["clients"]["carol"]["index_server"]
    pid, shared = server["pid"], server["name"] == "_shared/index"
    assert isinstance(pid, int)
    os.kill(pid, signal.SIGSTOP)
    try:
        with ThreadPoolExecutor(3) as pool:
            recall = pool.submit(memd.error, "memory.recall", client_id="carol", query="q")
            tool = pool.submit(
                memd.call,
                "memory.call_tool",
                client_id="carol",
                name="MemoryRecall",
                arguments={"query": "q"},
            )
            query = {"client_id": "alice", "query": "capital of Australia", "top_k": 1}
            other = pool.submit(memd.error if shared else memd.call, "memory.recall", **query)
            # The client timeout (30 s) is the hang guard; recall gives up after 10 s.
            error = recall.result()
            assert (error.code, error.kind) == (-32006, "index_unavailable")
            assert "carol" in error.message and "unix:" not in error.message
            result = tool.result()
            assert result["isError"] is True
            assert "not available right now" in _text(result)
            if shared:
                assert other.result().kind == "index_unavailable"  # stopped too, no hang
            else:
                assert "Canberra" in other.result()["text"]  # other clients keep working
    finally:
        os.kill(pid, signal.SIGCONT)
    assert memd.wait_recall("carol", "q", lambda r: True) == {"results": [], "text": NO_RESULTS}


# -- the command line ---------------------------------------------------------------------


def test_memd_recall_command(memd: Memd) -> None:
    config = memd.proc.config_path
    env = {**os.environ, "HOME": str(config.parent / "home")}

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "memd.cli", *args, "--config", str(config)],
            capture_output=True,
            text=True,
            env=env,
            cwd=REPO,
            timeout=60,
        )

    done = run("recall", "alice", "capital of Australia", "--top-k", "1")
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("Found 1 memory")
    assert "Canberra is the capital of Australia." in done.stdout
    js = run(
        "recall",
        "alice",
        "capital",
        "--json",
        "--after",
        "2026-10-01T10:00:01Z",
        "--before",
        "2026-10-02",
    )
    assert js.returncode == 0 and '"results": []' in js.stdout
    bad = run("recall", "alice", "zoo", "--after", "soon")
    assert bad.returncode == 1 and "30m" in bad.stderr
    off = run("recall", "off", "zoo")
    assert off.returncode == 1 and "not enabled" in off.stderr
