"""Recall's search core against a real index server: parity with memsearch, time filters,
expand, and what happens when the index is missing, empty, stopped or restarted."""

from __future__ import annotations

import itertools
import signal
import threading
import time
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import psutil
import pytest

from memd.config import EmbeddingConfig
from memd.indexing import embedding
from memd.indexing.query.expand import expand_hit
from memd.indexing.query.halves import halves, halves_while_embedding
from memd.indexing.query.index_client import connect
from memd.indexing.query.ranking import fused_rows
from memd.indexing.query.search import (
    QUERY_VECTORS,
    Hit,
    IndexSearcher,
    IndexUnavailableError,
    InFlight,
    in_range,
    time_filter_expr,
)
from memd.indexing.targets import IndexTarget
from tests.support.children import Child
from tests.support.embedding import embed, embed_one
from tests.test_index_server import start_index_server

COLLECTION = "memd_alice"


T0 = datetime(2026, 11, 30, 9, 0, 0, tzinfo=UTC)


def exchange(n: int, when: datetime, user: str, assistant: str) -> str:
    stamp = when.strftime("%Y-%m-%d %H:%M:%S UTC")
    return f"## {stamp} · exchange {n}\n\n**User:** {user}\n\n**Assistant:** {assistant}\n\n"


TOPICS = [
    ("Which port does staging Postgres use?", "Staging Postgres listens on 6543."),
    ("What is the capital of France?", "Paris is the capital of France."),
    ("How do I rotate the TLS certificate?", "Run certbot renew, then reload nginx."),
    ("Who owns the billing service?", "The payments team owns billing."),
]


def session_text(start: datetime = T0) -> str:
    body = "".join(
        exchange(i + 1, start + timedelta(minutes=10 * i), u, a) for i, (u, a) in enumerate(TOPICS)
    )
    return f"# Conversation 1 ({start:%Y-%m-%d %H:%M:%S} UTC)\n\n{body}"


def index_files(uri: str, files: list[Path], max_chunk_size: int = 1500) -> None:
    """Index markdown exactly as memsearch's watcher does (chunker, ids, cleaned text)."""
    from memsearch.chunker import chunk_markdown, clean_content_for_embedding, compute_chunk_id
    from memsearch.store import MilvusStore

    store = MilvusStore(
        uri, collection=COLLECTION, dimension=embedding.DIMENSION, _create_if_missing=True
    )
    try:
        for path in files:
            source = str(path.resolve())
            chunks = chunk_markdown(
                path.read_text(encoding="utf-8"), source=source, max_chunk_size=max_chunk_size
            )
            vectors = embed([clean_content_for_embedding(c.content) for c in chunks])
            store.upsert(
                [
                    {
                        "chunk_hash": compute_chunk_id(
                            c.source, c.start_line, c.end_line, c.content_hash, embedding.MODEL_NAME
                        ),
                        "embedding": vec,
                        "content": c.content,
                        "source": c.source,
                        "heading": c.heading,
                        "heading_level": c.heading_level,
                        "start_line": c.start_line,
                        "end_line": c.end_line,
                    }
                    for c, vec in zip(chunks, vectors, strict=True)
                ]
            )
    finally:
        store.close()


class Index:
    def __init__(self, tmp_path: Path, sock: Path, children: list[Child]) -> None:
        self.root = tmp_path / "memory" / "alice"
        self.sessions = self.root / "sessions"
        self.sessions.mkdir(parents=True)
        self.data = self.root / ".memsearch" / "milvus"
        self.sock = sock
        self.children = children
        self.logs = tmp_path
        self.starts = 0
        self.server = self.start()

    def start(self) -> Child:
        self.starts += 1
        log = self.logs / f"index-{self.starts}.log"
        return start_index_server(self.children, self.data, self.sock, log)

    @property
    def uri(self) -> str:
        return f"unix:{self.sock}"

    def searcher(self, timeout: float = 10.0) -> IndexSearcher:
        return IndexSearcher(
            IndexTarget(self.uri, COLLECTION), EmbeddingConfig(), root=self.root, timeout=timeout
        )

    def write(self, name: str, text: str, max_chunk_size: int = 1500) -> Path:
        path = self.sessions / name
        path.write_text(text, encoding="utf-8")
        index_files(self.uri, [path], max_chunk_size)
        return path


@pytest.fixture
def index(tmp_path: Path, short_tmp: Path, children: list[Child]) -> Index:
    return Index(tmp_path, short_tmp / "index.sock", children)


@pytest.fixture
def searcher(index: Index) -> Iterator[IndexSearcher]:
    s = index.searcher()
    yield s
    s.close()


def test_finds_the_right_exchange_with_its_metadata(index: Index, searcher: IndexSearcher) -> None:
    path = index.write("s1.md", session_text())
    hits = searcher.search("TLS certificate renewal", top_k=2)
    assert len(hits) == 2
    best = hits[0]
    assert "certbot" in best.content
    assert best.source == str(path.resolve())
    assert best.heading == "2026-11-30 09:20:00 UTC · exchange 3"
    assert best.when == T0 + timedelta(minutes=20)
    assert best.heading_level == 2 and best.start_line > 0 and best.end_line >= best.start_line
    assert 0 < best.score <= 1.0 and best.score >= hits[1].score
    assert len(best.chunk_hash) == 16


def _tie_groups(ours: list[float], theirs: list[float]) -> list[slice]:
    """Rank positions cut where neither side ties: s1 and s2 below share exchanges word for
    word, and the index returns such twins in either order (memsearch's RRF ties too)."""
    cuts = [0]
    for i in range(1, len(ours)):
        if ours[i] != ours[i - 1] and theirs[i] != theirs[i - 1]:
            cuts.append(i)
    cuts.append(len(ours))
    return [slice(a, b) for a, b in itertools.pairwise(cuts)]


def test_same_hits_as_memsearch_with_memds_own_scores(
    index: Index, searcher: IndexSearcher
) -> None:
    """memd fuses BM25 and cosine itself (memd.indexing.query.ranking), so its scores are not
    memsearch's RRF scores; on these queries both rank the same chunks."""
    from memsearch.store import MilvusStore

    index.write("s1.md", session_text())
    index.write("s2.md", session_text(T0 + timedelta(days=1)).replace("France", "Spain"))
    store = MilvusStore(index.uri, collection=COLLECTION, dimension=None)
    try:
        for query in ("capital city", "who owns billing", "postgres port 6543"):
            ours = searcher.search(query, top_k=5)
            theirs = store.search(embed_one(query), query_text=query, top_k=5)
            assert len(ours) == len(theirs)
            for at in _tie_groups([h.score for h in ours], [r["score"] for r in theirs]):
                assert {h.chunk_hash for h in ours[at]} == {r["chunk_hash"] for r in theirs[at]}
            scores = [h.score for h in ours]
            assert scores == sorted(scores, reverse=True)
            assert all(0.0 <= s <= 1.0 for s in scores), scores
    finally:
        store.close()


def test_time_filter_has_exchange_precision(index: Index, searcher: IndexSearcher) -> None:
    index.write("s1.md", session_text())  # exchanges at 09:00, 09:10, 09:20, 09:30
    index.write(
        "s1-summary.md", "## Summary\n\nThe user asked about Postgres, France, TLS and billing.\n"
    )
    query = "Postgres France TLS billing"

    def headings(**kw: Any) -> list[str]:
        return sorted(h.heading[11:19] for h in searcher.search(query, top_k=10, **kw))

    assert headings(after=T0 + timedelta(minutes=10)) == ["09:10:00", "09:20:00", "09:30:00"]
    assert headings(before=T0 + timedelta(minutes=10)) == ["09:00:00"]
    assert headings(after=T0 + timedelta(minutes=5), before=T0 + timedelta(minutes=25)) == [
        "09:10:00",
        "09:20:00",
    ]
    assert headings(after=T0 + timedelta(hours=1)) == []
    unfiltered = searcher.search(query, top_k=10)
    assert any(h.heading == "Summary" for h in unfiltered)  # summaries have no time


def test_time_filter_bounds() -> None:
    t = datetime(2026, 11, 30, 9, 10, 0, tzinfo=UTC)
    assert in_range(t, t, None)  # after is inclusive
    assert not in_range(t, None, t)  # before is exclusive
    assert in_range(t, None, t + timedelta(milliseconds=1))
    assert not in_range(None, t, None)
    assert in_range(None, None, None)
    naive = datetime(2026, 11, 30, 9, 10, 0)  # naive means UTC, like the headings
    assert in_range(t, naive, None) and not in_range(t, None, naive)
    assert time_filter_expr(t, t + timedelta(seconds=30)) == (
        'heading >= "2026-11-30 09:10:00 UTC" and heading < "2026-11-30 09:10:31 UTC"'
    )


def test_expand_returns_the_whole_exchange_of_a_split_chunk(
    index: Index, searcher: IndexSearcher
) -> None:
    long_answer = "\n\n".join(
        f"Step {i}: " + "drain the node, then cordon it. " * 5 for i in range(6)
    )
    text = exchange(1, T0, "How do we upgrade Kubernetes nodes?", long_answer) + exchange(
        2, T0 + timedelta(minutes=1), "Thanks", "You're welcome."
    )
    path = index.write("k8s.md", text, max_chunk_size=300)
    hit = searcher.search("upgrade kubernetes nodes drain cordon", top_k=1)[0]
    assert len(hit.content) <= 300
    section = expand_hit(hit, searcher.root)
    lines = path.read_text(encoding="utf-8").splitlines()
    assert section.content.startswith("## 2026-11-30 09:00:00 UTC · exchange 1")
    assert "Step 0:" in section.content and "Step 5:" in section.content
    assert "exchange 2" not in section.content
    assert section.end_line < len(lines) and lines[section.end_line].startswith("## ")


def test_expand_falls_back_to_the_chunk_when_the_file_is_gone_or_outside(tmp_path: Path) -> None:
    outside = tmp_path / "elsewhere.md"
    outside.write_text("## h\n\nsecret text\n", encoding="utf-8")
    hit = Hit("abc", str(outside), "h", 2, "indexed text", 1.0, 1, 3)
    assert expand_hit(hit, root=tmp_path / "memory" / "alice").content == "indexed text"
    assert expand_hit(hit, root=tmp_path).content == "## h\n\nsecret text"
    gone = Hit("abc", str(tmp_path / "gone.md"), "h", 2, "indexed text", 1.0, 1, 3)
    assert expand_hit(gone, root=tmp_path).content == "indexed text"


def test_nothing_indexed_yet_is_an_empty_result(index: Index, searcher: IndexSearcher) -> None:
    assert searcher.search("anything") == []  # no collection yet
    from memsearch.store import MilvusStore

    MilvusStore(
        index.uri, collection=COLLECTION, dimension=embedding.DIMENSION, _create_if_missing=True
    )._ensure_collection_for_write()
    assert searcher.search("anything") == []  # collection, no rows
    assert searcher.count() == 0


def test_missing_index_server_raises_index_unavailable(short_tmp: Path) -> None:
    s = IndexSearcher(
        IndexTarget(f"unix:{short_tmp / 'none.sock'}", COLLECTION), EmbeddingConfig(), timeout=2.0
    )
    with pytest.raises(IndexUnavailableError):
        s.search("hello")
    s.close()


def _until_stopped(pid: int) -> None:
    """SIGSTOP takes effect after kill() returns: a search sent at once (its query vector
    kept from the first search, nothing to embed) could still be answered."""
    deadline = time.monotonic() + 10
    while psutil.Process(pid).status() != psutil.STATUS_STOPPED:
        assert time.monotonic() < deadline, "the index server did not stop"
        time.sleep(0.01)


def test_a_hung_index_times_out_and_recovers(index: Index) -> None:
    """A stopped index server fails the search it hangs, and the same searcher works again.

    Only the hung call gets a short timeout: the stop lasts until SIGCONT, so any bound
    fails it, while the calls before and after get a loaded CI machine's worth of time
    (a 1.5 s bound on every call once failed the first search at load 4.7 on 2 cores).
    The message says the index gave out, not the in-process embedding of the query."""
    index.write("s1.md", session_text())
    s = index.searcher(timeout=60.0)
    try:
        assert s.search("capital of France")
        index.server.signal(signal.SIGSTOP)
        _until_stopped(index.server.proc.pid)
        try:
            with pytest.raises(IndexUnavailableError, match=r"^index "):
                s.search("capital of France", timeout=5.0)
        finally:
            index.server.signal(signal.SIGCONT)
        assert "Paris" in s.search("capital of France")[0].content
    finally:
        s.close()


class _CountingEmbedder(embedding.Embedder):
    """The daemon's real model, counting the texts it is asked to embed."""

    def __init__(self) -> None:
        super().__init__()
        self.texts: list[str] = []

    def embed(self, texts: list[str], model: str = embedding.MODEL_NAME) -> list[list[float]]:
        self.texts += texts
        return super().embed(texts, model)


def test_a_query_asked_again_is_not_embedded_again(index: Index) -> None:
    """A searcher keeps the vectors of its last QUERY_VECTORS queries: asked again (an
    LLM's retry), a query costs no model run, and finds the same."""
    index.write("s1.md", session_text())
    model = _CountingEmbedder()
    s = IndexSearcher(IndexTarget(index.uri, COLLECTION), EmbeddingConfig(), embedder=model)
    try:
        first = s.search("capital of France")
        assert s.search("capital of France") == first
        assert len(model.texts) == 1
        for i in range(QUERY_VECTORS):
            s.search(f"question {i}")
        s.search("capital of France")  # forgotten by now: embedded again
        assert len(model.texts) == QUERY_VECTORS + 2
    finally:
        s.close()


def test_search_survives_an_index_server_restart(index: Index, searcher: IndexSearcher) -> None:
    index.write("s1.md", session_text())
    assert searcher.search("capital of France")
    index.server.stop()
    with pytest.raises(IndexUnavailableError):
        searcher.search("capital of France")
    index.server = index.start()
    assert "Paris" in searcher.search("capital of France")[0].content
    from pymilvus import MilvusClient

    other = MilvusClient(uri=index.uri, dedicated=True)
    other.release_collection(COLLECTION)  # as a restarted Milvus Lite opens it
    other.close()
    assert "Paris" in searcher.search("capital of France")[0].content


def test_time_filter_at_the_end_of_time_does_not_overflow() -> None:
    """Found by fuzzing memory.recall: before=9999-12-31T23:59:59Z raised OverflowError."""
    from datetime import UTC, datetime

    from memd.indexing.query.search import time_filter_expr

    end = datetime(9999, 12, 31, 23, 59, 59)
    assert time_filter_expr(None, end) == ""
    assert time_filter_expr(None, end.replace(tzinfo=UTC)) == ""
    assert time_filter_expr(datetime(2026, 1, 1), end) == 'heading >= "2026-01-01 00:00:00 UTC"'


def test_heading_rule_is_memsearchs() -> None:
    """Recall's copy of the chunker's heading rule (importing `memsearch.chunker` runs
    memsearch's __init__: issue 29) is memsearch's own, pattern and flags."""
    from memsearch.chunker import _HEADING_RE

    from memd.indexing.query.expand import HEADING_RE

    assert (HEADING_RE.pattern, HEADING_RE.flags) == (_HEADING_RE.pattern, _HEADING_RE.flags)


def test_extract_section_is_memsearchs() -> None:
    """memd's copy of memsearch's section rule (memsearch.cli imports pymilvus) gives the
    same answer for every line and heading level of documents with nested sections."""
    from memsearch.cli import _extract_section

    from memd.indexing.query.expand import extract_section

    docs = [
        session_text(),
        "# A\n\ntext\n\n## B\n\nb1\n### C\nc1\n\n## D\nd1\n# E\ne1\n",
        "no heading\nat all\n",
        "#### deep\nx\n## up\ny\n",
        "",
    ]
    for doc in docs:
        lines = doc.splitlines()
        for start in range(1, len(lines) + 2):
            for level in range(5):
                ours = extract_section(lines, start, level)
                assert ours == _extract_section(lines, start, level), (doc, start, level)


def test_the_bm25_half_sent_while_embedding_gives_the_rows_one_round_trip_gives(
    index: Index,
) -> None:
    """A query not embedded yet sends its BM25 half first and its dense half once the
    vector is there (`halves_while_embedding`); the fusion sees exactly the rows, scores
    and cosines that both halves in one round trip give (`halves`)."""
    index.write("s1.md", session_text())
    index.write("s2.md", session_text(T0 + timedelta(days=1)))
    client = connect(IndexTarget(index.uri, COLLECTION), 10.0)
    needed_cosines = 0
    try:
        for query in ["capital of France", "Postgres port, France, billing owner, certbot"]:
            vector = embed_one(query)
            deadline = time.monotonic() + 10
            at_once = halves(client, COLLECTION, vector, query, 3, "", deadline)
            pending: Future[list[float]] = Future()
            threading.Timer(0.05, pending.set_result, [vector]).start()
            dense, keyword, got = halves_while_embedding(
                client, COLLECTION, pending, query, 3, "", deadline
            )
            assert got == vector
            alone = {h["entity"]["chunk_hash"] for h in keyword}
            alone -= {h["entity"]["chunk_hash"] for h in dense}
            needed_cosines += len(alone)  # BM25 hits the dense half did not return
            for weight in (0.7, 0.3):
                assert fused_rows(dense, keyword, query, 5, weight) == fused_rows(
                    *at_once, query, 5, weight
                )
    finally:
        client.close()
    assert needed_cosines


class _GatedEmbedder(embedding.Embedder):
    """The daemon's real model, answering only once the gate is open."""

    def __init__(self) -> None:
        super().__init__()
        self.gate = threading.Event()

    def embed(self, texts: list[str], model: str = embedding.MODEL_NAME) -> list[list[float]]:
        self.gate.wait(30)
        return super().embed(texts, model)


def test_a_query_embedded_too_slowly_is_index_unavailable_and_the_next_one_answers(
    index: Index,
) -> None:
    index.write("s1.md", session_text())
    model = _GatedEmbedder()
    s = IndexSearcher(IndexTarget(index.uri, COLLECTION), EmbeddingConfig(), embedder=model)
    try:
        with pytest.raises(IndexUnavailableError, match="embedding the query timed out"):
            s.search("capital of France", timeout=1.0)
        model.gate.set()
        assert "Paris" in s.search("capital of France")[0].content
    finally:
        s.close()


def test_only_a_search_that_runs_alone_overlaps_its_embedding() -> None:
    flights = InFlight()
    with flights.entered() as first, flights.entered() as second:
        assert (first, second) == (True, False)
    with pytest.raises(ValueError), flights.entered():
        raise ValueError
    with flights.entered() as again:
        assert again  # the failed one was counted out


def test_searches_in_flight_together_each_find_their_answer(index: Index) -> None:
    """The first search overlaps its embedding with its BM25 half; the second, begun
    while the first waits for its vector, embeds first (`InFlight`). Both answer."""
    index.write("s1.md", session_text())
    model = _GatedEmbedder()
    s = IndexSearcher(IndexTarget(index.uri, COLLECTION), EmbeddingConfig(), embedder=model)
    try:
        with ThreadPoolExecutor(2) as pool:
            first = pool.submit(s.search, "capital of France")
            time.sleep(0.3)  # the first is waiting for its vector
            second = pool.submit(s.search, "staging Postgres port")
            time.sleep(0.3)
            model.gate.set()
            assert "Paris" in first.result(30)[0].content
            assert "6543" in second.result(30)[0].content
    finally:
        s.close()
