"""One client's broken or busy index does not reach another's, with a server per client and
with the shared index server (issue 29: the condition for making it the default).

- a client's Milvus Lite database overwritten with garbage while memd is stopped: the other
  client records and recalls; the broken one is reported FATAL with its error (not RUNNING),
  its records still reach the markdown, and once its `.memsearch/` is removed and the client
  reset it is built again from the markdown;
- one client indexing a large batch of files: the other client's recall answers meanwhile
  (how fast is measured in bench/, not here).

Real daemons, real memsearch watchers, real Milvus Lite, the embedded model.
"""

from __future__ import annotations

import re
import shutil
import time
from pathlib import Path
from typing import Any

import pytest

from memd.cli.client import RemoteError
from tests.support.faults import (
    call,
    child_status,
    pipeline_running,
    recall_finds,
    wait_for,
)
from tests.support.index import daemon_index_contents

pytestmark = [pytest.mark.slow, pytest.mark.faults]

CLIENTS = {
    "ann": {"memory_enabled": True, "mode": "mcp_via_llm"},
    "bea": {"memory_enabled": True, "mode": "mcp_via_llm"},
}
KINDS = [pytest.param(False, id="per-client"), pytest.param(True, id="shared")]


def _start(config_file: Any, daemon_factory: Any, shared: bool) -> Any:
    memd = daemon_factory(config_file(clients=CLIENTS, supervision={"shared_index_server": shared}))
    for client in CLIENTS:
        wait_for(lambda c=client: pipeline_running(memd.socket, c), 180, 0.2, f"{client} RUNNING")
    return memd


def _record(sock: Path, client: str, user: str, assistant: str, conv: str = "iso") -> None:
    params = {"client_id": client, "conversation_id": conv, "user": user, "assistant": assistant}
    call(sock, "memory.record_exchange", params)


def _recallable(sock: Path, client: str, query: str, needle: str, what: str) -> None:
    wait_for(lambda: recall_finds(sock, client, query, needle), 120, 0.3, what)


def _garble(folder: Path) -> int:
    """Overwrite every file of the database's collections with garbage."""
    files = [p for p in folder.rglob("*") if p.is_file()]
    for path in files:
        path.write_bytes(b"\x00garbage\xff" * 64)
    return len(files)


@pytest.mark.parametrize("shared", KINDS)
def test_a_corrupt_database_is_reported_and_the_other_client_carries_on(
    config_file, daemon_factory, tmp_path, shared
) -> None:
    memd = _start(config_file, daemon_factory, shared)
    sock = memd.socket
    _record(sock, "ann", "Where is the atlas kept?", "The atlas is on shelf Marten-9.")
    _record(sock, "bea", "Where do the herons nest?", "The herons nest by Weir Kestrel-3.")
    _recallable(sock, "ann", "atlas shelf", "Marten-9", "ann indexed")
    _recallable(sock, "bea", "herons nest", "Kestrel-3", "bea indexed")
    memd.stop()
    milvus = tmp_path / "memory" / "ann" / ".memsearch" / "milvus"
    assert _garble(milvus / "collections") > 0

    again = daemon_factory(memd.config_path)
    sock = again.socket
    wait_for(lambda: pipeline_running(sock, "bea"), 180, 0.2, "bea RUNNING")
    wait_for(
        lambda: child_status(sock, "ann", "index_server").get("state") == "FATAL",
        180,
        0.2,
        "ann's index reported FATAL",
    )
    assert child_status(sock, "ann", "index_server")["last_error"]
    assert child_status(sock, "ann", "watcher")["state"] != "RUNNING"
    _record(sock, "bea", "Which bell rings at noon?", "The noon bell is Osprey-31.")
    _recallable(sock, "bea", "noon bell", "Osprey-31", "bea records and recalls")
    assert recall_finds(sock, "bea", "herons nest", "Kestrel-3")
    with pytest.raises(RemoteError) as refused:
        call(sock, "memory.recall", {"client_id": "ann", "query": "atlas", "top_k": 3})
    assert refused.value.kind == "index_unavailable"
    _record(sock, "ann", "What is the ferry called?", "The ferry is the Plover-12.")

    # the index is a copy of the markdown: remove it, reset the client, it is built again
    shutil.rmtree(milvus.parent)
    assert call(sock, "clients.reset", {"client_id": "ann"})["reset"]
    wait_for(lambda: pipeline_running(sock, "ann"), 180, 0.2, "ann RUNNING again")
    _recallable(sock, "ann", "ferry called", "Plover-12", "recorded while ann's index was broken")
    _recallable(sock, "ann", "atlas shelf", "Marten-9", "recorded before the damage")
    assert recall_finds(sock, "bea", "noon bell", "Osprey-31")


BATCH = 150  # hand-written session files for ann to index at once


def _write_batch(sessions: Path) -> None:
    for i in range(BATCH):
        text = "\n\n".join(
            f"## Note {i}.{j}\n\nCrate {i}-{j} of the harbour inventory holds "
            f"{'rope, tar, sailcloth and lamp oil ' * 6}tagged Lot-{i}-{j}."
            for j in range(4)
        )
        (sessions / f"batch-{i:03d}.md").write_text(f"# Inventory {i}\n\n{text}\n")


def _batch_indexed(memd: Any) -> int | None:
    """How many of the batch's notes ann's index holds (None: it did not answer)."""
    try:
        rows = daemon_index_contents(memd.config_path, memd.env["XDG_RUNTIME_DIR"], "ann")
    except Exception:
        return None
    return len(set(re.findall(r"Lot-\d+-\d+", "\n".join(rows))))


@pytest.mark.parametrize("shared", KINDS)
def test_one_client_indexing_a_large_batch_does_not_stop_the_others_recall(
    config_file, daemon_factory, tmp_path, shared
) -> None:
    memd = _start(config_file, daemon_factory, shared)
    sock = memd.socket
    _record(sock, "bea", "Where do the herons nest?", "The herons nest by Weir Kestrel-3.")
    _recallable(sock, "bea", "herons nest", "Kestrel-3", "bea indexed")
    _write_batch(tmp_path / "memory" / "ann" / "sessions")
    wait_for(lambda: _batch_indexed(memd), 120, 0.2, "ann indexing the batch")
    answered_during, give_up = 0, time.monotonic() + 600
    while (_batch_indexed(memd) or 0) < BATCH * 4 and time.monotonic() < give_up:
        assert recall_finds(sock, "bea", "herons nest", "Kestrel-3")  # answers, and right
        answered_during += 1
    assert answered_during > 0, "the batch was indexed before bea was asked"
    wait_for(lambda: _batch_indexed(memd) == BATCH * 4, 300, 0.5, "ann's batch indexed")
    _recallable(sock, "ann", "crate harbour inventory Lot-77-2", "Lot-77-2", "ann's batch")
