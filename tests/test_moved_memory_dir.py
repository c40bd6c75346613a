"""A memory folder moved (or restored from a backup to another path) keeps working.

The index's rows name their transcript by absolute path. After `mv ~/.localrouter/memory
/elsewhere` and `memory_dir = "/elsewhere"`, every row memd indexed before points at a
file outside the client's folder: recall refuses to read it (`recall.source_refused`), so
those rows only take the places of real results, and forget counts rows by the new paths.
The watcher indexes the moved files again under their new paths, beside the stale rows.
memd records where an index was built (`IndexSpec.sessions`) and rebuilds it from the
markdown when that changed, as it does for a model change.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
import time
from pathlib import Path
from typing import Any

import pytest

from memd import indexing
from memd.cli.client import RemoteError
from memd.config import Config
from memd.indexing.daemon.settings import IndexSpec
from memd.layout import ClientLayout
from tests.support.daemon import DaemonProcess, base_config, write_config
from tests.support.samples import ALICE

DEADLINE = 90.0
EXCHANGES = ALICE[:3]


def _record(proc: DaemonProcess) -> None:
    for conv, user, assistant, stamp in EXCHANGES:
        params = {"client_id": "alice", "conversation_id": conv, "user": user}
        proc.call("memory.record_exchange", {**params, "assistant": assistant, "timestamp": stamp})


def _recall_all(proc: DaemonProcess) -> dict[str, Any]:
    """Poll until recall (asked for as many results as there are exchanges) finds them all."""
    deadline = time.monotonic() + DEADLINE
    last: Any = None
    while time.monotonic() < deadline:
        try:
            params = {"client_id": "alice", "query": "greenhouse tomatoes capital", "top_k": 3}
            last = proc.call("memory.recall", params)
            if len(last["results"]) == len(EXCHANGES):
                return dict(last)
        except RemoteError as exc:
            if exc.kind != "index_unavailable":
                raise
            last = exc
        time.sleep(0.2)
    raise AssertionError(f"recall never found every exchange: {last!r}\n{proc.log()}")


@pytest.mark.slow
def test_recall_after_the_memory_folder_moved_reads_only_the_moved_files(
    tmp_path: Path,
) -> None:
    clients = {"alice": {"memory_enabled": True, "mode": "both"}}
    config = base_config(tmp_path, clients=clients, recall={"min_score": 0.0, "drop_below": 0.0})
    path = write_config(tmp_path / "config.toml", config)
    proc = DaemonProcess(path).start()
    try:
        _record(proc)
        _recall_all(proc)
    finally:
        proc.end()

    moved = tmp_path / "elsewhere"
    shutil.move(tmp_path / "memory", moved)
    write_config(path, {**config, "memory_dir": str(moved)})
    offset = proc.log_path.stat().st_size
    again = DaemonProcess(path).start()
    try:
        found = _recall_all(again)
        assert {r["content"].split("\n")[0] for r in found["results"]} == {
            f"**User:** {user}" for _, user, _, _ in EXCHANGES
        }
        after = proc.log_path.read_text(encoding="utf-8")[offset:]
        assert '"recall.source_refused"' not in after  # no row names the old place
        assert '"index.rebuild"' in after  # rebuilt from the markdown in its new place
    finally:
        again.end()


# -- the fingerprint -------------------------------------------------------------------------


def _indexed(memory_dir: Path) -> tuple[ClientLayout, IndexSpec]:
    """A client whose index spec was recorded in `memory_dir`."""
    layout = ClientLayout(memory_dir, "alice")
    layout.ensure()
    spec = indexing.index_spec(Config(memory_dir=memory_dir), layout)
    indexing.write_spec(layout, spec)
    return layout, spec


def test_the_spec_names_the_resolved_sessions_folder(tmp_path: Path) -> None:
    (tmp_path / "real").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "real")
    layout, spec = _indexed(tmp_path / "link")
    assert spec.sessions == str(tmp_path / "real" / "alice" / "sessions")
    assert not indexing.needs_rebuild(layout, spec)


def test_an_index_recorded_in_another_folder_is_rebuilt(tmp_path: Path) -> None:
    _indexed(tmp_path / "before")
    shutil.move(tmp_path / "before", tmp_path / "after")
    layout = ClientLayout(tmp_path / "after", "alice")
    assert indexing.needs_rebuild(
        layout, indexing.index_spec(Config(memory_dir=tmp_path / "after"), layout)
    )


def _legacy(layout: ClientLayout, spec: IndexSpec, watched: Path | None) -> None:
    """The spec as memd wrote it before it kept the folder, and memsearch's state file."""
    indexing.write_spec(layout, dataclasses.replace(spec, sessions=""))
    if watched is not None:
        state = {"paths": [str(watched)], "collection": spec.collection}
        (layout.memsearch_dir / ".index-state.json").write_text(json.dumps(state), "utf-8")


@pytest.mark.parametrize(
    ("watched", "rebuilt"),
    [("here", False), ("elsewhere", True), (None, False)],
)
def test_a_spec_from_before_the_folder_was_kept_asks_memsearchs_state(
    tmp_path: Path, watched: str | None, rebuilt: bool
) -> None:
    """An upgrade does not re-embed every unmoved index; a moved one is still caught by
    the folder memsearch's watcher last wrote down (none written: assumed unmoved)."""
    layout, spec = _indexed(tmp_path / "here")
    folder = None if watched is None else tmp_path / watched / "alice" / "sessions"
    _legacy(layout, spec, folder)
    assert indexing.needs_rebuild(layout, spec) is rebuilt
