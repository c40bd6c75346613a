"""The embedder child embeds recall's queries ahead of the watchers' chunks
(memd.indexing.children.embedder.UrgentFirst), with the real bundled model in-process.

Under bench/load.py (20 clients on 2 cores) the embedder was the busiest process, and a
recall's query vector waited its share behind 20 watchers' batches. A chunk's embedding
can wait a moment; a user's query cannot.
"""

from __future__ import annotations

import threading

from memd.indexing import embedding
from memd.indexing.children.embedder import EmbedRequests, UrgentFirst
from memd.indexing.query.embedder_client import EmbedderClient
from tests.support.embedder import EmbedderChild, RecordingRelay


def _embed_in_thread(requests: EmbedRequests, request: dict[str, object]) -> threading.Event:
    done = threading.Event()

    def run() -> None:
        requests.run(request)
        done.set()

    threading.Thread(target=run, daemon=True).start()
    return done


def test_a_chunk_waits_while_a_query_is_embedded_and_runs_after() -> None:
    order = UrgentFirst()
    requests = EmbedRequests(embedding.Embedder(), order)
    requests.run({"op": "embed", "texts": ["warm up"]})  # the model loaded
    with order.urgent():  # a query is being embedded
        chunk = _embed_in_thread(requests, {"op": "embed", "texts": ["a watcher's chunk"]})
        assert not chunk.wait(0.3)  # the chunk waits its turn
        query = _embed_in_thread(requests, {"op": "embed", "texts": ["q"], "urgent": True})
        assert query.wait(10)  # another query does not
    assert chunk.wait(10)  # and once no query runs, the chunk is embedded


def test_a_turn_waits_a_bounded_time() -> None:
    """A steady stream of queries slows indexing down, never stops it."""
    order = UrgentFirst()
    with order.urgent():
        assert order.wait_turn(at_most=0.05) is False
    assert order.wait_turn(at_most=0.05) is True


def test_recalls_client_asks_urgently_and_the_watchers_do_not(embedder: EmbedderChild) -> None:
    """Over the real child's socket: the daemon's query client is made `urgent`
    (memd.indexing.daemon.embedder); the watchers' provider's client is not."""
    relay = RecordingRelay(embedder.socket)
    try:
        query = EmbedderClient(relay.socket, urgent=True)
        chunks = EmbedderClient(relay.socket)
        assert len(query.embed_one("what is my shed code?")) == embedding.DIMENSION
        assert len(chunks.embed(["a chunk", "another"])) == 2
        assert relay.urgent == [True, False]
        query.close()
        chunks.close()
    finally:
        relay.close()
