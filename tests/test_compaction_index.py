"""End to end: a real `memsearch watch` and index server see compaction and restore.

After compaction the client's index holds the summary's chunks and none of the
transcript's; after a restore it is the other way round.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from types import MappingProxyType
from typing import Any

import pytest

from memd import indexing, transcript
from memd.compaction import Compactor
from memd.config import ClientConfig, CompactionConfig, Config
from memd.embed_server import EmbeddingServer
from memd.index_server import index_ready
from memd.layout import ClientLayout, write_memsearch_toml
from memd.transcript import Part
from tests.support.fake_llm import FakeLLM

pytestmark = pytest.mark.slow

SID = "2026-11-30T02-41-07Z-0e2e"
T0 = datetime(2026, 11, 30, 2, 41, 7, tzinfo=UTC).timestamp()


def _spawn(cmd: indexing.Command, log: Path) -> subprocess.Popen[bytes]:
    out = log.open("ab")
    return subprocess.Popen(cmd.argv, env=dict(cmd.env), cwd=cmd.cwd, stdout=out,
                            stderr=subprocess.STDOUT, start_new_session=True)


def _stop(proc: subprocess.Popen[bytes], sig: int) -> None:
    """The polite signal to the group, a bounded wait, then SIGKILL."""
    if proc.poll() is None:
        os.killpg(proc.pid, sig)
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(5)


def _wait(predicate: Callable[[], bool], what: str, timeout: float = 90.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


@pytest.fixture
def indexed_client(tmp_path: Path) -> Iterator[tuple[ClientLayout, Any]]:
    """A client with its index server and `memsearch watch` running; yields a row reader."""
    from pymilvus import MilvusClient

    config = Config(memory_dir=tmp_path / "memory",
                    clients=MappingProxyType({"laptop": ClientConfig(memory_enabled=True)}))
    layout = ClientLayout(config.memory_dir, "laptop")
    indexing.ensure_dirs(layout)
    write_memsearch_toml(layout, indexing.memsearch_toml(config, layout))
    target = indexing.index_target(config, layout)
    server_cmd = indexing.index_server_command(config, layout)
    assert server_cmd is not None
    procs: list[tuple[subprocess.Popen[bytes], int]] = []
    with EmbeddingServer() as embedder:
        try:
            server = _spawn(server_cmd, layout.logs_dir / "index.log")
            procs.append((server, signal.SIGTERM))
            _wait(lambda: index_ready(indexing.index_socket_path(layout)), "the index server")
            watcher = _spawn(indexing.watcher_command(config, layout, embedder.endpoint),
                             layout.logs_dir / "watch.log")
            procs.insert(0, (watcher, signal.SIGINT))
            # Start with an empty sessions/: memsearch 0.4.23's initial index runs on a
            # throwaway event loop, and the embedding client's pooled connection from it
            # makes the next event fail ("Event loop is closed"); that is the indexing
            # layer's problem, not what this test is about.
            log = layout.logs_dir / "watch.log"
            _wait(lambda: "Watching" in log.read_text(errors="replace"), "the watcher")
            client = MilvusClient(uri=target.uri)

            def rows() -> list[dict[str, Any]]:
                assert watcher.poll() is None, (layout.logs_dir / "watch.log").read_text()
                if not client.has_collection(target.collection):
                    return []
                return client.query(target.collection, filter='chunk_hash != ""',
                                    output_fields=["source", "heading", "content"], limit=10_000)

            yield layout, rows
            client.close()
        finally:
            for proc, sig in procs:
                _stop(proc, sig)


def _sources(rows: list[dict[str, Any]]) -> set[str]:
    return {Path(r["source"]).name for r in rows}


def test_index_follows_compaction_and_restore(indexed_client):
    layout, rows = indexed_client
    text = transcript.front_matter("laptop", SID, T0) + transcript.conversation_header(
        1, datetime.fromtimestamp(T0, UTC))
    for n in range(1, 6):
        when = datetime.fromtimestamp(T0 + 60 * n, UTC)
        text += transcript.exchange_block(n, when, [
            Part("User", f"Tell me about topic {n}: the password hint is FACT-{n}."),
            Part("Assistant", f"Topic {n} noted.")])
    layout.session_file(SID).write_text(text)
    _wait(lambda: _sources(rows()) == {f"{SID}.md"}, "the transcript to be indexed")
    transcript_rows = len(rows())

    with FakeLLM() as fake:
        cfg = CompactionConfig(enabled=True, llm_model="m", base_url=fake.base_url,
                               api_key="k")

        async def compact() -> None:
            comp = Compactor(cfg)
            await comp.start(schedule=False)
            await comp.open_client(layout)
            try:
                await comp.submit("laptop", SID)
                await comp.drain()
            finally:
                await comp.close()

        asyncio.run(compact())

    _wait(lambda: _sources(rows()) == {f"{SID}-summary.md"}, "summary in, transcript out")
    summary_rows = rows()
    assert all(r["heading"] == "" or "2026-11-30 02:42:07 UTC – 2026-11-30 02:46:07 UTC"
               in r["heading"] for r in summary_rows)
    assert any("FACT-5" in r["content"] for r in summary_rows)
    assert not any("Topic 3 noted" in r["content"] for r in summary_rows)

    from memd.compaction import restore

    assert restore(layout, SID) == "restored"
    _wait(lambda: _sources(rows()) == {f"{SID}.md"}, "transcript back, summary out")
    assert len(rows()) == transcript_rows
    # Nothing left behind by either step anywhere under the client root.
    assert not (layout.root / "memory").exists()
    assert list(layout.tmp_dir.iterdir()) == []
