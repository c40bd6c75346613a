"""`memory.forget` through a real `memd run`: the text is gone from recall and from disk.

Three conversations across two sessions, each exchange carrying a unique `FACT-…`
marker. The first session is compacted against the fake LLM (whose summary names every
marker it was shown). Forgetting one conversation of the compacted session and a time
range of the live one must leave no trace: recall finds none of their markers, and no
file under the client's folder (`.memd/` and `.memsearch/` included) nor memd's log
holds one, while every other exchange is still recallable. Recording goes on meanwhile.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from memd.cli.client import RemoteError
from tests.support.daemon import DaemonProcess
from tests.support.fake_llm import FakeLLM

pytestmark = pytest.mark.slow

CLIENT = "desk"
DEADLINE = 90.0

ALPHA_KEEP = "FACT-alphakeep"
BETA_GONE = ("FACT-betagoneone", "FACT-betagonetwo")
GAMMA_KEEP = ("FACT-gammakeepearly", "FACT-gammakeeplate")
GAMMA_GONE = "FACT-gammagonemiddle"
GONE = (*BETA_GONE, GAMMA_GONE)


@pytest.fixture
def fake() -> Iterator[FakeLLM]:
    with FakeLLM() as server:
        yield server


def settings(fake: FakeLLM) -> dict[str, Any]:
    return {
        "compaction": {
            "enabled": True,
            "llm_provider": "openai",
            "llm_model": "fake",
            "base_url": fake.base_url,
        },
        "clients": {CLIENT: {"memory_enabled": True, "mode": "mcp_via_llm"}},
    }


def wait_for(predicate: Callable[[], Any], what: str, memd: DaemonProcess) -> Any:
    deadline = time.monotonic() + DEADLINE
    last: Any = None
    while time.monotonic() < deadline:
        last = predicate()
        if last:
            return last
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what} (last: {last!r})\n{memd.log()}")


def record(memd: DaemonProcess, conv: str, fact: str, when: str) -> dict[str, Any]:
    return memd.call(
        "memory.record_exchange",
        {
            "client_id": CLIENT,
            "conversation_id": conv,
            "timestamp": when,
            "user": f"Please remember {fact} for the allotment.",
            "assistant": f"Noted: {fact}.",
        },
    )


def forget(memd: DaemonProcess, **selector: Any) -> dict[str, Any]:
    """A forget waits for the index to be rebuilt: slow on a busy machine, so no 30 s bound."""
    with memd.client(timeout=300) as client:
        return client.call("memory.forget", {"client_id": CLIENT, **selector})


def recall_text(memd: DaemonProcess, query: str) -> str | None:
    try:
        out = memd.call("memory.recall", {"client_id": CLIENT, "query": query, "top_k": 20})
    except RemoteError as exc:
        if exc.kind != "index_unavailable":
            raise
        return None
    return "\n".join(r["content"] for r in out["results"])


def found(memd: DaemonProcess, fact: str) -> bool:
    return fact in (recall_text(memd, f"allotment {fact}") or "")


def traces(root: Path, needles: tuple[str, ...]) -> list[str]:
    """Every file under `root` holding one of `needles` (what `grep -r` would list)."""
    hits = []
    for path in root.rglob("*"):
        if path.is_file() and not path.is_symlink():
            data = path.read_bytes()
            hits += [f"{path.relative_to(root)}: {n}" for n in needles if n.encode() in data]
    return hits


def test_forget_a_conversation_and_a_time_range_leaves_no_trace(
    tmp_path: Path, config_file, daemon_factory, fake: FakeLLM
) -> None:
    memd = daemon_factory(config_file(**settings(fake)))
    root = tmp_path / "memory" / CLIENT
    first = record(memd, "alpha", ALPHA_KEEP, "2026-10-01T10:00:00Z")["session_id"]
    record(memd, "beta", BETA_GONE[0], "2026-10-01T11:00:00Z")
    record(memd, "beta", BETA_GONE[1], "2026-10-01T11:05:00Z")
    memd.call("sessions.close", {"client_id": CLIENT})
    wait_for(
        lambda: (
            (root / "sessions" / f"{first}-summary.md").exists()
            and not (root / "sessions" / f"{first}.md").exists()
        ),
        "the compaction",
        memd,
    )
    assert BETA_GONE[0] in (root / "sessions" / f"{first}-summary.md").read_text()

    second = record(memd, "gamma", GAMMA_KEEP[0], "2026-11-01T10:00:00Z")["session_id"]
    record(memd, "gamma", GAMMA_GONE, "2026-11-15T10:00:00Z")
    record(memd, "gamma", GAMMA_KEEP[1], "2026-12-01T10:00:00Z")
    assert second != first
    for fact in (ALPHA_KEEP, *BETA_GONE, *GAMMA_KEEP, GAMMA_GONE):
        wait_for(lambda fact=fact: found(memd, fact), f"{fact} to be recallable", memd)

    # Recording goes on while forgetting runs: none of it may be lost. While the files are
    # rewritten a record is refused with `busy` and nothing is written; it is sent again.
    stop = threading.Event()
    recorded: list[str] = []
    refused: list[str] = []

    def keep_recording() -> None:
        n = 0
        while not stop.is_set() and n < 200:
            n += 1
            try:
                record(memd, "delta", f"FACT-delta{n}x", "2026-12-02T10:00:00Z")
            except RemoteError as exc:
                assert exc.kind == "busy", exc
                refused.append(f"FACT-delta{n}x")
                time.sleep(exc.data["retry_after"])
                continue
            recorded.append(f"FACT-delta{n}x")

    writer = threading.Thread(target=keep_recording)
    writer.start()
    try:
        by_conv = forget(memd, conversation_id="beta")
        by_time = forget(memd, after="2026-11-10", before="2026-11-20")
    finally:
        stop.set()
        writer.join(60)
    assert by_conv["removed"]["exchanges"] == 2
    assert by_conv["removed"]["files"] >= 2  # archive rewritten, summary regenerated
    assert by_conv["removed"]["index_rows"] >= 1
    assert by_time["removed"]["exchanges"] == 1
    assert by_time["removed"]["index_rows"] >= 1

    summary = (root / "sessions" / f"{first}-summary.md").read_text()
    assert ALPHA_KEEP in summary and not any(f in summary for f in BETA_GONE)
    for fact in (ALPHA_KEEP, *GAMMA_KEEP, recorded[0], recorded[-1]):
        wait_for(lambda fact=fact: found(memd, fact), f"{fact} to stay recallable", memd)
    for fact in GONE:
        text = recall_text(memd, f"allotment {fact}")
        assert text is not None and fact not in text
    assert traces(root, GONE) == []
    assert not any(f in memd.log() for f in GONE), "memd's log holds message text"
    live = (root / "sessions" / f"{second}.md").read_text()
    assert all(f in live for f in recorded)  # nothing recorded meanwhile was lost
    assert not any(f in live for f in refused)  # nor was anything refused written
    assert (
        "exchange 3" in live
        and "exchange 2" not in live.split("delta")[0].split("# Conversation 1")[-1]
    )  # numbering left as it was


def test_bad_selectors_and_empty_matches(
    tmp_path: Path, config_file, daemon_factory, fake: FakeLLM
) -> None:
    memd = daemon_factory(config_file(**settings(fake)))
    sid = record(memd, "alpha", ALPHA_KEEP, "2026-10-01T10:00:00Z")["session_id"]

    def kind(params: dict[str, Any]) -> str:
        with pytest.raises(RemoteError) as err:
            memd.call("memory.forget", {"client_id": CLIENT, **params})
        return err.value.kind

    assert kind({"conversation_id": "nope"}) == "not_found"
    assert kind({"session_id": "2020-01-01T00-00-00Z-0000"}) == "not_found"
    assert kind({"session_id": sid, "conversation_id": 9}) == "not_found"
    assert kind({"session_id": "../../etc"}) == "invalid_params"
    assert kind({"session_id": sid, "all": True}) == "invalid_params"
    assert kind({}) == "invalid_params"
    assert kind({"after": "soon"}) == "invalid_params"
    empty = forget(memd, after="2030-01-01")
    assert empty["removed"]["exchanges"] == 0
    with pytest.raises(RemoteError) as err:
        memd.call("memory.forget", {"client_id": "../x", "all": True})
    assert err.value.kind in ("invalid_id", "invalid_params")
    assert (tmp_path / "memory" / CLIENT / "sessions" / f"{sid}.md").exists()

    # the command: no --yes and no terminal to ask on is refused; --yes forgets
    config = memd.config_path
    cmd = [sys.executable, "-m", "memd.cli", "forget", CLIENT, "--config", str(config)]
    env = {**os.environ, "HOME": str(tmp_path / "home")}
    refused = subprocess.run(
        [*cmd, "--all"],
        capture_output=True,
        text=True,
        timeout=60,
        stdin=subprocess.DEVNULL,
        env=env,
    )
    assert refused.returncode == 2 and "--yes" in refused.stderr
    done = subprocess.run(
        [*cmd, "--conversation", "alpha", "--yes", "--json"],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["removed"]["exchanges"] == 1
    missing = subprocess.run(
        [*cmd, "--conversation", "alpha", "--yes"],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )
    assert missing.returncode == 1 and "no conversation" in missing.stderr
