"""Transcripts recall keeps between recalls: one byte budget for the whole daemon.

An hour of bench/load.py at 20 clients grew memd from 51 to 271 MB PSS when each
client's recall lane kept up to 16 MB of its own; the daemon now hands every lane the
same `RecentFiles`.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from memd.config import parse_config
from memd.daemon.runtime import Runtime
from memd.recall import files
from memd.recall.files import RecentFiles


def _transcript(path: Path, size: int) -> Path:
    line = b"- user: a line of a transcript\n"
    path.write_bytes(line * (size // len(line)))
    return path


def _kept_bytes(recent: RecentFiles, paths: list[Path]) -> int:
    """What is still served without a read: a kept file's lines are the same object."""
    kept = 0
    for path in paths:
        with path.open("rb") as fh:
            first = recent.lines(path, fh)
        with path.open("rb") as fh:
            if recent.lines(path, fh) is first:
                kept += path.stat().st_size
    return kept


def test_files_of_many_clients_stay_within_one_budget(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(files, "RECENT_BYTES", 1_000_000)
    recent = RecentFiles()
    paths = [_transcript(tmp_path / f"c{i}.md", 400_000) for i in range(6)]
    for path in paths:  # six clients' transcripts, read in turn
        with path.open("rb") as fh:
            recent.lines(path, fh)
    held = sum(size for _, size, _ in recent._files.values())
    assert 0 < held <= 1_000_000
    # The most recent ones are the ones kept, and are served again without a read.
    assert _kept_bytes(recent, paths[-2:]) == sum(p.stat().st_size for p in paths[-2:])


def test_a_file_over_the_budget_is_not_kept(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(files, "RECENT_BYTES", 100_000)
    recent = RecentFiles()
    big = _transcript(tmp_path / "big.md", 200_000)
    assert _kept_bytes(recent, [big]) == 0


def test_every_clients_lane_shares_the_daemons_recent_files(tmp_path: Path) -> None:
    config = parse_config(
        {
            "memory_dir": str(tmp_path / "memory"),
            "socket": str(tmp_path / "memd.sock"),
            "clients": {
                "a": {"memory_enabled": True, "mode": "both"},
                "b": {"memory_enabled": True, "mode": "both"},
            },
        }
    )
    runtime = Runtime(config)

    async def lanes() -> list[RecentFiles]:
        opened = [await runtime._open(config, cid) for cid in ("a", "b")]
        try:
            return [c.recall_lane.recent for c in opened]
        finally:
            for c in opened:
                await c.close()

    a, b = asyncio.run(lanes())
    assert a is b is runtime.recent_files
