"""Per-client folders and the generated .memsearch.toml."""

from __future__ import annotations

import stat
import tomllib
from pathlib import Path

import pytest

from memd.layout import GENERATED_MARK, ClientLayout, LayoutError, write_memsearch_toml


def test_ensure_creates_private_folders(tmp_path: Path) -> None:
    layout = ClientLayout(tmp_path / "mem", "gw")
    layout.ensure()
    for path in (
        layout.sessions,
        layout.archive,
        layout.memsearch_dir,
        layout.state_dir,
        layout.logs_dir,
        layout.tmp_dir,
    ):
        assert path.is_dir()
        assert stat.S_IMODE(path.stat().st_mode) == 0o700
    assert layout.sessions == tmp_path / "mem" / "gw" / "sessions"
    assert not layout.state_dir.is_relative_to(layout.sessions)


def test_ensure_leaves_foreign_files_alone(tmp_path: Path) -> None:
    layout = ClientLayout(tmp_path, "gw")
    layout.ensure()
    mine = layout.sessions / "notes.md"
    mine.write_text("user's own file")
    layout.ensure()
    assert mine.read_text() == "user's own file"


@pytest.mark.parametrize("bad", ["..", ".", "a/b", "../x", "", "x" * 65, "a\0b", "-a"])
def test_client_ids_cannot_escape(tmp_path: Path, bad: str) -> None:
    with pytest.raises(LayoutError):
        ClientLayout(tmp_path, bad)


@pytest.mark.parametrize("bad", ["../x", "a/b", "..", "", "x\0"])
def test_session_ids_cannot_escape(tmp_path: Path, bad: str) -> None:
    layout = ClientLayout(tmp_path, "gw")
    with pytest.raises(LayoutError):
        layout.session_file(bad)
    with pytest.raises(LayoutError):
        layout.archive_file(bad)


def test_memsearch_toml_written_and_rewritten_only_on_change(tmp_path: Path) -> None:
    layout = ClientLayout(tmp_path, "gw")
    settings = {"milvus": {"collection": "memd_gw"}, "watch": {"debounce_ms": 500}}
    assert write_memsearch_toml(layout, settings) is True
    text = layout.memsearch_toml.read_text()
    assert text.startswith(GENERATED_MARK)
    assert tomllib.loads(text) == settings
    mtime = layout.memsearch_toml.stat().st_mtime_ns
    assert write_memsearch_toml(layout, settings) is False
    assert layout.memsearch_toml.stat().st_mtime_ns == mtime
    settings["watch"]["debounce_ms"] = 900
    assert write_memsearch_toml(layout, settings) is True
    assert tomllib.loads(layout.memsearch_toml.read_text())["watch"]["debounce_ms"] == 900
    assert list(layout.root.glob("*.tmp")) == []
