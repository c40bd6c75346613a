"""No residue after removal, through a real `memd run` (issue #26, item 1).

A person edits an exchange out of a transcript with `sed -i`, memd forgets a
conversation, and a session is compacted. Then no file under the client's folder (the
transcripts, `archive/`, `.memd/state.sqlite3` and `compaction.sqlite3` with their
`-wal` files, the index's files under `.memsearch/`) nor memd's log holds the removed
text. Before this issue the edited-out text stayed in `state.sqlite3-wal` (the old title)
and in `.memsearch/` (Milvus Lite keeps deleted rows until its segments are rebuilt).
"""

from __future__ import annotations

import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from memd.cli.client import RemoteError
from tests.support.daemon import DaemonProcess
from tests.support.fake_llm import FakeLLM

pytestmark = pytest.mark.slow

CLIENT = "desk"
EDITED = "FACT-editedoutbyhand"
FORGOTTEN = "FACT-forgottenbyrequest"
KEPT = "FACT-keptforever"


@pytest.fixture
def fake() -> Iterator[FakeLLM]:
    with FakeLLM() as server:
        yield server


def traces(root: Path, needles: tuple[str, ...]) -> list[str]:
    hits = []
    for path in root.rglob("*"):
        if path.is_file() and not path.is_symlink():
            data = path.read_bytes()
            hits += [f"{path.relative_to(root)}: {n}" for n in needles if n.encode() in data]
    return hits


def wait_for(predicate: Any, what: str, memd: DaemonProcess, timeout: float = 150.0) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if result := predicate():
            return result
        time.sleep(0.3)
    raise AssertionError(f"timed out waiting for {what}\n{memd.log()[-4000:]}")


def found(memd: DaemonProcess, fact: str) -> bool:
    try:
        out = memd.call("memory.recall", {"client_id": CLIENT, "query": fact, "top_k": 20})
    except RemoteError as exc:
        if exc.kind != "index_unavailable":
            raise
        return False
    return any(fact in r["content"] for r in out["results"])


def record(memd: DaemonProcess, conv: str, user: str) -> dict[str, Any]:
    return memd.call(
        "memory.record_exchange",
        {"client_id": CLIENT, "conversation_id": conv, "user": user, "assistant": "Noted."},
    )


def test_edit_forget_and_compaction_leave_nothing_behind(
    tmp_path: Path, config_file, daemon_factory, fake: FakeLLM
) -> None:
    memd = daemon_factory(
        config_file(
            monitor_interval_seconds=0.5,
            compaction={
                "enabled": True,
                "llm_provider": "openai",
                "llm_model": "fake",
                "base_url": fake.base_url,
            },
            clients={CLIENT: {"memory_enabled": True, "mode": "mcp_via_llm"}},
        )
    )
    root = tmp_path / "memory" / CLIENT
    sid = record(memd, "edit", f"Remember {EDITED} for the allotment shed.")["session_id"]
    record(memd, "gone", f"Remember {FORGOTTEN} for the allotment gate.")
    record(memd, "keep", f"Remember {KEPT} for the allotment.")
    for fact in (EDITED, FORGOTTEN, KEPT):
        wait_for(lambda fact=fact: found(memd, fact), f"{fact} indexed", memd)

    transcript = root / "sessions" / f"{sid}.md"
    subprocess.run(["sed", "-i", f"s/{EDITED}/the-shed-key/g", str(transcript)], check=True)
    record(memd, "edit", "And the shed is green.")  # the title is re-derived from the file
    wait_for(lambda: "index.rebuild_after_edit" in memd.log(), "the edit to be noticed", memd)
    wait_for(
        lambda: not memd.call("daemon.status")["clients"][CLIENT]["index_rebuilding"],
        "the rebuild",
        memd,
    )
    assert traces(root, (EDITED,)) == []

    with memd.client(timeout=300) as client:
        out = client.call("memory.forget", {"client_id": CLIENT, "conversation_id": "gone"})
    assert out["removed"]["exchanges"] == 1
    memd.call("sessions.close", {"client_id": CLIENT})
    wait_for(lambda: (root / "archive" / f"{sid}.md").exists(), "the compaction", memd)
    wait_for(lambda: found(memd, KEPT), "the summary indexed", memd)

    assert list(root.rglob("*.sqlite3")), "both databases exist"
    assert traces(root, (EDITED, FORGOTTEN)) == []
    assert EDITED not in memd.log() and FORGOTTEN not in memd.log()
    assert KEPT in (root / "archive" / f"{sid}.md").read_text()
