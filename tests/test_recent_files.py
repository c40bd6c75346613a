"""Transcripts as recall reads them (memd.recall.files): only the lines it shows, from
the file; between recalls, each recent file's newline offsets, one budget for the daemon.

An hour of bench/load.py at 20 clients grew memd from 51 to 271 MB PSS when each
client's recall lane kept up to 16 MB of transcripts of its own, and to 131 MB with one
budget, from the transcripts recalls in flight read whole; the lines must still be
exactly `str.splitlines()` of the file, whose line numbers memsearch indexed.
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from memd.config import parse_config
from memd.daemon.runtime import Runtime
from memd.recall import files
from memd.recall.files import LineCache, RecentFiles
from tests.test_lines import PIECES, expected

CHUNKS = st.lists(st.one_of(st.sampled_from(PIECES), st.binary(max_size=8)), max_size=30)


def _transcript(path: Path, size: int) -> Path:
    line = b"- user: a line of a transcript\n"
    path.write_bytes(line * (size // len(line)))
    return path


def _read(recent: RecentFiles, path: Path) -> list[str]:
    """Every line of `path` as a recall would read it, then the descriptor closed."""
    fd = os.open(path, os.O_RDONLY)
    try:
        return list(recent.lines(path, fd))
    finally:
        os.close(fd)


def test_files_of_many_clients_stay_within_one_budget(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(files, "RECENT_BYTES", 200_000)
    recent = RecentFiles()
    paths = [_transcript(tmp_path / f"c{i}.md", 400_000) for i in range(6)]
    for path in paths:  # six clients' transcripts (12,903 lines each), read in turn
        _read(recent, path)
    assert 0 < recent.held() <= 200_000
    # The most recent one is kept, and served again without a scan: the same offsets.
    kept = recent.kept(paths[-1])
    assert kept is not None and recent.kept(paths[0]) is None
    assert _read(recent, paths[-1]) == expected(paths[-1].read_bytes())
    assert recent.kept(paths[-1]) is kept


def test_offsets_take_four_bytes_a_line_below_four_gib(tmp_path: Path) -> None:
    path = _transcript(tmp_path / "t.md", 100_000)
    recent = RecentFiles()
    _read(recent, path)
    kept = recent.kept(path)
    assert kept is not None and kept.ends.itemsize == 4
    assert recent.held() == 4 * path.read_bytes().count(b"\n")
    # A file past 4 GiB (never a transcript in practice) would need 8 bytes an offset.
    assert files.array(files._offsets(2**32)).itemsize == 8
    assert files.array(files._offsets(2**32 - 1)).itemsize == 4


@settings(
    max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(first=CHUNKS, more=CHUNKS)
def test_a_grown_file_reads_as_splitlines(
    tmp_path: Path, first: list[bytes], more: list[bytes]
) -> None:
    path = tmp_path / "grown.md"
    path.write_bytes(b"".join(first))
    recent = RecentFiles()
    assert _read(recent, path) == expected(path.read_bytes())
    before = recent.kept(path)
    with path.open("ab") as f:
        f.write(b"".join(more))
    assert _read(recent, path) == expected(path.read_bytes())
    after = recent.kept(path)
    assert before is None or after is None or after.key[2] >= before.key[2]


def test_a_rewritten_or_truncated_file_is_scanned_afresh(tmp_path: Path) -> None:
    path = tmp_path / "t.md"
    recent = RecentFiles()
    path.write_bytes(b"## one\n\n**User:** hi\n")
    _read(recent, path)
    # memd's rewrite replaces the file: another inode.
    new = tmp_path / "new.md"
    new.write_bytes(b"## One\n**User:** hello there\n## two\n")
    os.replace(new, path)
    assert _read(recent, path) == ["## One", "**User:** hello there", "## two"]
    # A failed append truncated in place, then other bytes written: same inode, longer,
    # but not what it ended with.
    with path.open("r+b") as f:
        f.truncate(5)
        f.seek(0, os.SEEK_END)
        f.write(b"X\nY\nsomething longer than before\nZ\n")
    assert _read(recent, path) == expected(path.read_bytes())


def test_a_line_is_read_from_the_file_not_kept(tmp_path: Path) -> None:
    """Only offsets are kept: the text a recall shows is what the file holds when read."""
    path = _transcript(tmp_path / "big.md", 3_000_000)
    recent = RecentFiles()
    _read(recent, path)
    kept = recent.kept(path)
    assert kept is not None and len(kept.ends) == 96_774
    assert recent.held() == 4 * 96_774  # 4 bytes a line, not 3 MB of text
    fd = os.open(path, os.O_RDONLY)
    try:
        lines = recent.lines(path, fd)
        assert lines[50_000] == lines[-1] == "- user: a line of a transcript"
    finally:
        os.close(fd)


def test_a_recalls_descriptors_are_closed_with_it(tmp_path: Path) -> None:
    sessions = tmp_path / "sessions"
    sessions.mkdir(mode=0o700)
    path = _transcript(sessions / "s.md", 1_000)
    path.chmod(0o600)
    cache = LineCache(RecentFiles())
    assert cache.lines(path)[0] == "- user: a line of a transcript"
    fds = set(os.listdir("/proc/self/fd"))
    cache.close()
    assert len(fds - set(os.listdir("/proc/self/fd"))) == 1


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
    assert a is b is runtime.recall_caches.recent
