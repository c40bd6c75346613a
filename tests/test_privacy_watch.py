"""Every edit is indexed, also one saved by renaming (issue #14, finding 3).

`sed -i`, an editor's atomic save and `mv` over a file all end in a rename inside the
watched `sessions/`, which memsearch's watcher ignores: the old text stayed searchable
until the next write to that file. memd's watch wrapper turns a move into what it
means: the destination is (re)indexed, the source dropped. Real `memsearch watch`,
real index server, real Milvus Lite (tests/support/index.py).
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.embedder import EmbedderChild
from tests.support.index import ClientIndex, client_config

pytestmark = pytest.mark.slow

DEADLINE = 30.0  # the watcher debounces 0.3 s; this only bounds a failing test


@pytest.fixture(scope="module")
def index(
    tmp_path_factory: pytest.TempPathFactory, embedder: EmbedderChild
) -> Iterator[ClientIndex]:
    config = client_config(tmp_path_factory.mktemp("watch") / "memory", "alice")
    idx = ClientIndex(config, "alice", embedder.endpoint()).start()
    try:
        idx.wait_watching()
        yield idx
    finally:
        idx.stop()


def note(marker: str) -> str:
    return f"# Notes\n\n## About {marker}\n\nThe word of the day is {marker}.\n"


def contents(index: ClientIndex, name: str) -> str:
    """All indexed text of sessions/<name> (headings and content)."""
    source = str(index.layout.sessions / name)
    return "\n".join(
        f"{r['heading']}\n{r['content']}" for r in index.rows() if r["source"] == source
    )


def wait_text(index: ClientIndex, name: str, present: str | None, absent: str | None) -> None:
    def probe(_searcher: object) -> bool:
        text = contents(index, name)
        return (present is None or present in text) and (absent is None or absent not in text)

    index.wait_for(probe, timeout=DEADLINE)


def sources(index: ClientIndex) -> set[str]:
    return {Path(r["source"]).name for r in index.rows()}


def indexed_file(index: ClientIndex, name: str, marker: str) -> Path:
    path = index.layout.sessions / name
    path.write_text(note(marker), encoding="utf-8")
    wait_text(index, name, marker, None)
    return path


def test_sed_i_is_reindexed(index: ClientIndex) -> None:
    path = indexed_file(index, "sed.md", "QUOKKA")
    subprocess.run(["sed", "-i", "s/QUOKKA/WOMBAT/g", str(path)], check=True)
    wait_text(index, "sed.md", "WOMBAT", "QUOKKA")


def test_write_temp_then_rename_is_reindexed(index: ClientIndex) -> None:
    path = indexed_file(index, "atomic.md", "PANGOLIN")
    tmp = path.with_name(".atomic.md.swp")  # not markdown: only the rename is seen
    tmp.write_text(note("ARMADILLO"), encoding="utf-8")
    os.replace(tmp, path)
    wait_text(index, "atomic.md", "ARMADILLO", "PANGOLIN")


def test_mv_over_a_file_reindexes_it_and_drops_the_source(index: ClientIndex) -> None:
    indexed_file(index, "target.md", "NARWHAL")
    other = indexed_file(index, "other.md", "AXOLOTL")
    shutil.move(str(other), str(index.layout.sessions / "target.md"))
    wait_text(index, "target.md", "AXOLOTL", "NARWHAL")
    index.wait_for(lambda _s: "other.md" not in sources(index), timeout=DEADLINE)


def test_rename_within_sessions_moves_the_chunks(index: ClientIndex) -> None:
    old = indexed_file(index, "before.md", "OKAPI")
    old.rename(index.layout.sessions / "after.md")
    wait_text(index, "after.md", "OKAPI", None)
    index.wait_for(lambda _s: "before.md" not in sources(index), timeout=DEADLINE)


def test_moved_in_and_moved_out(index: ClientIndex, tmp_path: Path) -> None:
    outside = tmp_path / "incoming.md"
    outside.write_text(note("CAPYBARA"), encoding="utf-8")
    shutil.move(str(outside), str(index.layout.sessions / "incoming.md"))
    wait_text(index, "incoming.md", "CAPYBARA", None)
    shutil.move(str(index.layout.sessions / "incoming.md"), str(tmp_path / "gone.md"))
    index.wait_for(lambda _s: "incoming.md" not in sources(index), timeout=DEADLINE)
