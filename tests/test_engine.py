"""memd's contract with its engine (memd.indexing.engine): the installed versions are the
pinned ones or nothing is patched, each role's patches go in in one order through one
registry, a patch whose target moved fails at start, and a reset puts Lite and memsearch
back as they were.

The version check reads the real installed metadata: a fake `*.dist-info` placed first on
the path is what an upgrade (or a stray install) looks like to it.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from memd.indexing import engine
from memd.indexing.children.startup import EXIT_ENGINE

ROOT = Path(__file__).resolve().parent.parent


def fake_dist(folder: Path, package: str, version: str) -> Path:
    """A dist-info claiming `package` is installed at `version`; returns `folder`."""
    info = folder / f"{package.replace('-', '_')}-{version}.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {package}\nVersion: {version}\n")
    return folder


@pytest.fixture
def registry() -> Iterator[engine.Registry]:
    """A registry of this test's own, reset afterwards whatever happened."""
    reg = engine.Registry()
    try:
        yield reg
    finally:
        reg.reset()


def test_the_pins_are_pyprojects() -> None:
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    pinned = dict(d.split("==", 1) for d in deps if "==" in d)
    assert {p: pinned[p] for p in engine.PINS} == engine.PINS
    for package in engine.PINS:  # and this environment has them
        assert engine.installed_version(package) == engine.PINS[package]


def test_another_installed_version_is_refused_before_anything_is_patched(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, registry: engine.Registry
) -> None:
    monkeypatch.syspath_prepend(str(fake_dist(tmp_path, "milvus-lite", "3.3.0")))
    with pytest.raises(engine.EngineMismatch) as err:
        engine.prepare_index_server(registry)
    assert (err.value.package, err.value.found, err.value.expected) == (
        "milvus-lite",
        "3.3.0",
        "3.2.2",
    )
    assert "milvus-lite 3.3.0 is installed, memd needs milvus-lite==3.2.2" in str(err.value)
    assert registry.applied() == () and registry.patches() == ()


def _child_env(fake: Path) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(fake), str(ROOT)])}


@pytest.mark.parametrize(
    ("module", "args"),
    [
        ("memd.indexing.children.index_server", ["--data-dir", "{tmp}/db", "--socket", "{tmp}/s"]),
        ("memd.indexing.children.memsearch_watch", ["watch", "{tmp}/sessions"]),
        (
            "memd.indexing.children.catch_up_child",
            [
                "--sessions",
                "{tmp}/sessions",
                "--since",
                "0",
                "--run",
                "r",
                "--provider",
                "onnx",
                "--model",
                "m",
                "--milvus-uri",
                "unix:{tmp}/s",
                "--collection",
                "c",
                "--batch-size",
                "1",
                "--max-chunk-size",
                "100",
                "--overlap-lines",
                "0",
            ],
        ),
    ],
)
def test_each_child_program_exits_with_one_line_naming_the_mismatch(
    tmp_path: Path, module: str, args: list[str]
) -> None:
    fake = fake_dist(tmp_path / "fake", "memsearch", "0.5.0")
    (tmp_path / "sessions").mkdir()
    (tmp_path / "sessions" / "a.md").write_text("# a\n\nsome text\n")
    argv = [a.format(tmp=tmp_path) for a in args]
    done = subprocess.run(
        [sys.executable, "-m", module, *argv],
        env=_child_env(fake),
        capture_output=True,
        text=True,
        timeout=120,
    )
    out = done.stdout + done.stderr
    assert done.returncode == EXIT_ENGINE, out
    said = [line for line in out.splitlines() if "engine.version_mismatch" in line]
    assert len(said) == 1, out
    assert "memsearch 0.5.0 is installed, memd needs memsearch==0.4.23" in said[0]
    assert not (tmp_path / "db").exists()  # nothing was opened


def test_a_moved_target_fails_at_start_naming_it(tmp_path: Path) -> None:
    """An upgrade that renamed a function memd patches: the index server refuses to start."""
    code = (
        "import sys; from milvus_lite.engine import collection as c; "
        "c.Collection._snapshot_v2 = c.Collection._read_snapshot; "
        "del c.Collection._read_snapshot; "
        "from memd.indexing.children import index_server; "
        "sys.exit(index_server.main(sys.argv[1:]))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code, "--data-dir", str(tmp_path / "db"), "--socket", "s"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    out = done.stdout + done.stderr
    assert done.returncode == EXIT_ENGINE, out
    assert "engine.patch_failed" in out
    assert "milvus_lite.engine.collection.Collection._read_snapshot is gone" in out
    assert not (tmp_path / "db").exists()


def test_a_moved_target_leaves_nothing_of_its_group(
    monkeypatch: pytest.MonkeyPatch, registry: engine.Registry
) -> None:
    from milvus_lite.engine.collection import Collection

    search = Collection.search
    monkeypatch.delattr(Collection, "_refresh_segment_cache")
    with pytest.raises(engine.PatchError, match=r"Collection\._refresh_segment_cache is gone"):
        engine.prepare_index_server(registry)
    assert Collection.search is search  # patched before the failure, then put back
    assert registry.applied() == () and registry.patches() == ()


def test_the_self_check_finds_a_patch_that_did_not_take(
    monkeypatch: pytest.MonkeyPatch, registry: engine.Registry
) -> None:
    from milvus_lite.analyzer import factory

    engine.prepare_index_server(registry)
    registry.self_check()
    # Something else (another library, a reload) binds the name after memd's patch.
    monkeypatch.setattr(factory, "create_analyzer", lambda params=None: None)
    with pytest.raises(engine.PatchError, match=r"lite\.analyzers: .*create_analyzer"):
        registry.self_check()


def _targets() -> dict[str, tuple[Any, str]]:
    import memsearch.core
    from memsearch import watcher
    from milvus_lite.analyzer import factory
    from milvus_lite.engine import collection
    from milvus_lite.index.sparse_inverted import SparseInvertedIndex
    from pymilvus.client.grpc_handler import GrpcHandler

    named = [
        (collection.Collection, "search"),
        (collection.Collection, "_search_sparse"),
        (collection.Collection, "_read_snapshot"),
        (collection.Collection, "_refresh_segment_cache"),
        (collection.Collection, "_ensure_loaded_segments_indexed"),
        (collection, "execute_search_with_index"),
        (SparseInvertedIndex, "search"),
        (factory, "create_analyzer"),
        (watcher._MarkdownHandler, "_fire"),
        (watcher._MarkdownHandler, "on_moved"),
        (memsearch.core, "chunk_markdown"),
        (memsearch.core, "get_provider"),
        (memsearch.core.MemSearch, "_index_file"),
        (GrpcHandler, "wait_for_creating_index"),
    ]
    return {f"{id(owner)}.{name}": (owner, name) for owner, name in named}


def test_roles_apply_in_one_order_once_and_reset_puts_everything_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, registry: engine.Registry
) -> None:
    targets = _targets()
    before = {key: getattr(owner, name) for key, (owner, name) in targets.items()}
    monkeypatch.setenv("MEMD_INDEX_LOCK", str(tmp_path / "a.lock"))
    engine.prepare_index_server(registry)
    engine.prepare_watcher(registry)
    engine.prepare_catch_up(registry)  # shares chunking and the lock: applied once
    engine.prepare_index_server(registry)
    assert registry.applied() == (
        "lite.cached_visibility",
        "lite.global_bm25",
        "lite.analyzers",
        "memsearch.watch_events",
        "memsearch.chunking",
        "memsearch.memd_provider",
        "pymilvus.index_wait",
        "memsearch.index_order",
        "memsearch.index_lock",
    )
    assert registry.roles == {engine.INDEX_SERVER, engine.WATCHER, engine.CATCH_UP}
    changed = {k for k, (owner, name) in targets.items() if getattr(owner, name) is not before[k]}
    assert changed == set(targets)
    count = len(registry.patches())
    # Another lock file: the lock is wrapped again around memd's reordered indexing,
    # which wraps memsearch's own function.
    monkeypatch.setenv("MEMD_INDEX_LOCK", str(tmp_path / "b.lock"))
    engine.prepare_catch_up(registry)
    assert len(registry.patches()) == count
    order = [p for p in registry.patches() if p.group == "memsearch.index_order"]
    lock = [p for p in registry.patches() if p.group == "memsearch.index_lock"]
    index_file = next(k for k in targets if k.endswith("._index_file"))
    assert [p.original for p in order] == [before[index_file]]
    assert [p.original for p in lock] == [p.installed for p in order]
    registry.reset()
    after = {key: getattr(owner, name) for key, (owner, name) in targets.items()}
    assert after == before
    assert registry.applied() == () and registry.roles == set()
