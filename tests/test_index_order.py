"""A growing transcript as the watcher indexes it: a real watcher, index server and
embedder child, behind a relay that counts (and can hold back) the watcher's embeddings.

- A changed chunk's new version is stored before its old one is deleted
  (memd/indexing/engine/index_order.py). memsearch alone deletes first: recall then
  answered "No relevant memories found." for a fact it had just found, for as long as the
  embedding took (CI of stop 35).
- Appending an exchange leaves the earlier exchanges' chunk ids alone, so only the new
  one is embedded (memd/indexing/engine/chunking.py, `settled_end`).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from memd.indexing.query.search import IndexSearcher
from tests.support.children import Child, wait_for
from tests.support.embedder import EmbedderChild, RecordingRelay
from tests.test_indexing import EXCHANGE, make_config, start_client, wait_watching

pytestmark = pytest.mark.slow
ADDED = "It moved to the host zephyrhold last week.\n"  # the same chunk, other content
SECOND = (
    "## 2026-11-30 09:02:00 UTC · exchange 2\n\n"
    "**User:** And the production one?\n\n"
    "**Assistant:** Production listens on 5432.\n\n"
)


@pytest.fixture
def relay(embedder: EmbedderChild) -> Iterator[RecordingRelay]:
    relay = RecordingRelay(embedder.socket)
    yield relay
    relay.close()


def _found(searcher: IndexSearcher) -> list[str]:
    """The chunks a search for the fact finds, as their content."""
    return [hit.content for hit in searcher.search("staging database port", top_k=3)]


def test_a_fact_stays_findable_while_its_changed_chunk_is_embedded_again(
    tmp_path: Path, children: list[Child], relay: RecordingRelay
) -> None:
    client = start_client(children, make_config(tmp_path), "alice", relay.endpoint())
    wait_watching(client)
    session = client.layout.sessions / "s1.md"
    session.write_text(EXCHANGE, encoding="utf-8")
    searcher = client.searcher()
    try:
        wait_for(lambda: any("6543" in c for c in _found(searcher)), what="the fact indexed")
        (old,) = {row["chunk_hash"] for row in client.rows()}

        with relay.hold("zephyrhold"):
            with session.open("a", encoding="utf-8") as f:
                f.write(ADDED)
            wait_for(relay.held.is_set, what="the watcher embedding the changed chunk")
            during = _found(searcher)
            hashes = {row["chunk_hash"] for row in client.rows()}
        assert any("6543" in c for c in during), during  # the old version still answers
        assert hashes == {old}  # and nothing else is there yet

        def settled() -> bool:
            rows = client.rows()
            return len(rows) == 1 and "zephyrhold" in rows[0]["content"]

        wait_for(settled, what="the new version stored and the old one deleted")
        assert {row["chunk_hash"] for row in client.rows()} != {old}
        assert any("zephyrhold" in c for c in _found(searcher))
    finally:
        searcher.close()


def test_appending_an_exchange_embeds_it_alone_and_keeps_the_earlier_chunk(
    tmp_path: Path, children: list[Child], relay: RecordingRelay
) -> None:
    """memsearch's last chunk of a file ends at its last line; memd's transcripts end with
    a blank line that the next exchange's heading takes, so each record moved the previous
    exchange's end line, changed its id and embedded it again (engine/chunking.py)."""
    client = start_client(children, make_config(tmp_path), "alice", relay.endpoint())
    wait_watching(client)
    session = client.layout.sessions / "s1.md"
    session.write_text(EXCHANGE + "\n", encoding="utf-8")  # as memd writes: a blank line last
    wait_for(lambda: len(client.rows()) == 1, what="the first exchange indexed")
    (first,) = {row["chunk_hash"] for row in client.rows()}
    embedded = sum(relay.batches)

    with session.open("a", encoding="utf-8") as f:
        f.write(SECOND)
    wait_for(lambda: len(client.rows()) == 2, what="the second exchange indexed")
    assert first in {row["chunk_hash"] for row in client.rows()}
    assert sum(relay.batches) - embedded == 1  # the new exchange, and only it
