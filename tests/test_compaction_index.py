"""End to end: a real `memsearch watch` and index server see compaction and restore.

After compaction the client's index holds the summary's chunks and none of the
transcript's; after a restore it is the other way round.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from memd.compaction.job import restore
from memd.compaction.service import Compactor
from memd.config import CompactionConfig
from memd.markdown import transcript
from memd.markdown.transcript import Part
from tests.support.embedder import EmbedderChild
from tests.support.fake_llm import FakeLLM
from tests.support.index import ClientIndex, client_config

pytestmark = pytest.mark.slow

SID = "2026-11-30T02-41-07Z-0e2e"
T0 = datetime(2026, 11, 30, 2, 41, 7, tzinfo=UTC).timestamp()


def _wait(predicate: Callable[[], bool], what: str, timeout: float = 90.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


@pytest.fixture
def index(tmp_path: Path, embedder: EmbedderChild) -> Iterator[ClientIndex]:
    """A client with its index server and `memsearch watch` running on an empty sessions/."""
    config = client_config(tmp_path / "memory", "laptop")
    client = ClientIndex(config, "laptop", embedder.endpoint())
    try:
        client.start()
        client.wait_watching()
        yield client
    finally:
        client.stop()


def _sources(rows: list[dict[str, Any]]) -> set[str]:
    return {Path(r["source"]).name for r in rows}


def test_index_follows_compaction_and_restore(index: ClientIndex) -> None:
    layout = index.layout
    text = transcript.front_matter("laptop", SID, T0) + transcript.conversation_header(
        1, datetime.fromtimestamp(T0, UTC)
    )
    for n in range(1, 6):
        when = datetime.fromtimestamp(T0 + 60 * n, UTC)
        text += transcript.exchange_block(
            n,
            when,
            [
                Part("User", f"Tell me about topic {n}: the password hint is FACT-{n}."),
                Part("Assistant", f"Topic {n} noted."),
            ],
        )
    layout.session_file(SID).write_text(text)
    _wait(lambda: _sources(index.rows()) == {f"{SID}.md"}, "the transcript to be indexed")
    transcript_rows = len(index.rows())

    with FakeLLM() as fake:
        cfg = CompactionConfig(enabled=True, llm_model="m", base_url=fake.base_url, api_key="k")

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

    _wait(lambda: _sources(index.rows()) == {f"{SID}-summary.md"}, "summary in, transcript out")
    summary_rows = index.rows()
    assert all(
        r["heading"] == "" or "2026-11-30 02:42:07 UTC – 2026-11-30 02:46:07 UTC" in r["heading"]
        for r in summary_rows
    )
    assert any("FACT-5" in r["content"] for r in summary_rows)
    assert not any("Topic 3 noted" in r["content"] for r in summary_rows)

    assert restore(layout, SID) == "restored"
    _wait(lambda: _sources(index.rows()) == {f"{SID}.md"}, "transcript back, summary out")
    assert len(index.rows()) == transcript_rows
    # Nothing left behind by either step anywhere under the client root.
    assert not (layout.root / "memory").exists()
    assert [p.name for p in layout.tmp_dir.iterdir()] == []
