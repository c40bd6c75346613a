"""Recall's index requests over the index server's JSON socket: the same answers as
pymilvus over gRPC, clear errors for bad requests, an owner-only socket, no pymilvus."""

from __future__ import annotations

import contextlib
import json
import os
import socket
import stat
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from memd.config import EmbeddingConfig
from memd.indexing import embedding
from memd.indexing.index_requests import MAX_LINE, query_socket_path
from memd.indexing.query.index_client import (
    IndexRequestError,
    IndexTransportError,
    LiteIndexClient,
    SearchRequest,
)
from memd.indexing.query.pymilvus_client import PymilvusIndexClient
from memd.indexing.query.search import OUTPUT_FIELDS
from memd.indexing.query.time_filter import time_filter_expr
from memd.indexing.targets import IndexTarget
from tests.support.children import Child, short_dir, stopping_children
from tests.support.embedding import embed, embed_one
from tests.support.fake_openai import FakeUpstream
from tests.test_search import COLLECTION, T0, Index, session_text

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def index(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Index]:
    """One index server with one indexed session for the whole module."""
    children: list[Child] = []
    gen = stopping_children()
    children = next(gen)
    short = short_dir()
    sock_dir = next(short)
    idx = Index(tmp_path_factory.mktemp("index-client"), sock_dir / "index.sock", children)
    idx.write("s1.md", session_text())
    yield idx
    for g in (gen, short):
        with pytest.raises(StopIteration):
            next(g)


@pytest.fixture
def lite(index: Index) -> Iterator[LiteIndexClient]:
    client = LiteIndexClient(query_socket_path(index.sock))
    yield client
    client.close()


@pytest.fixture
def grpc(index: Index) -> Iterator[PymilvusIndexClient]:
    client = PymilvusIndexClient(IndexTarget(index.uri, COLLECTION), 10.0)
    yield client
    client.close()


def _search(client: Any, data: Any, field: str, metric: str, flt: str = "") -> list[Any]:
    fields = [*OUTPUT_FIELDS, "embedding"] if metric == "BM25" else OUTPUT_FIELDS
    return client.search(
        COLLECTION,
        data=data,
        anns_field=field,
        metric_type=metric,
        limit=20,
        output_fields=fields,
        filter=flt,
        timeout=10.0,
    )


def _plain(hits: list[Any]) -> list[tuple[Any, ...]]:
    out = []
    for hit in hits:
        entity = dict(hit["entity"])
        vec = entity.pop("embedding", None)
        rounded = [round(float(x), 5) for x in vec] if vec is not None else None
        out.append((round(float(hit["distance"]), 5), sorted(entity.items()), rounded))
    return out


def test_both_halves_answer_as_pymilvus_over_grpc(lite: LiteIndexClient, grpc: Any) -> None:
    vector = embed_one("Which port does staging Postgres use?")
    late = time_filter_expr(T0 + timedelta(minutes=15), None)
    for data, field, metric, flt in [
        (vector, "embedding", "COSINE", ""),
        ("staging Postgres port", "sparse_vector", "BM25", ""),
        ("rotate the TLS certificate", "sparse_vector", "BM25", late),
        (vector, "embedding", "COSINE", late),
    ]:
        ours, theirs = (
            _search(lite, data, field, metric, flt),
            _search(grpc, data, field, metric, flt),
        )
        assert ours and _plain(ours) == _plain(theirs)
    assert "6543" in lite_best(lite, vector)


def lite_best(lite: LiteIndexClient, vector: list[float]) -> str:
    return str(_search(lite, vector, "embedding", "COSINE")[0]["entity"]["content"])


def test_both_halves_in_one_request_leave_out_only_rows_the_first_returned(
    lite: LiteIndexClient, grpc: Any
) -> None:
    """Recall's two halves go in one round trip; a BM25 hit the dense half returned comes
    back as its chunk_hash alone, everything else as a search of its own answers it, with
    its cosine to the dense half's vector (computed by the index server, not memd). Over
    gRPC the same call is two searches, nothing left out, the cosines computed here."""
    vector = embed_one("Which port does staging Postgres use?")
    text = "staging Postgres port rotate certificate"
    dense = SearchRequest(vector, "embedding", "COSINE", 2, OUTPUT_FIELDS, "")
    keyword = SearchRequest(text, "sparse_vector", "BM25", 20, OUTPUT_FIELDS, "")
    first, second = lite.searches(COLLECTION, [dense, keyword], known="chunk_hash", timeout=10)
    alone = _search(lite, text, "sparse_vector", "BM25")
    every = _search(lite, vector, "embedding", "COSINE")  # the fixture's index holds < 20
    cosines = {h["entity"]["chunk_hash"]: h["distance"] for h in every}
    assert _plain(first) == _plain(every[:2])
    seen = {hit["entity"]["chunk_hash"] for hit in first}
    assert [h["id"] for h in second] == [h["id"] for h in alone]
    for hit, full in zip(second, alone, strict=True):
        assert hit["distance"] == full["distance"]
        key = full["entity"]["chunk_hash"]
        if key in seen:
            assert hit["entity"] == {"chunk_hash": key}
        else:
            entity = dict(hit["entity"])
            assert entity.pop("cosine") == pytest.approx(cosines[key], abs=1e-5)
            assert "embedding" not in entity
            full_entity = {k: v for k, v in full["entity"].items() if k != "embedding"}
            assert _plain([{**hit, "entity": entity}]) == _plain([{**full, "entity": full_entity}])
    assert {h["entity"]["chunk_hash"] for h in alone} - seen  # both kinds were checked
    assert seen & {h["entity"]["chunk_hash"] for h in alone}
    over_grpc = grpc.searches(COLLECTION, [dense, keyword], known="chunk_hash", timeout=10)
    assert _plain(over_grpc[0]) == _plain(first)
    for hit in over_grpc[1]:
        key = hit["entity"]["chunk_hash"]
        assert "embedding" not in hit["entity"]
        assert hit["entity"]["cosine"] == pytest.approx(cosines[key], abs=1e-5)


def test_the_dense_half_after_the_bm25_half_returns_its_hits_and_the_others_cosines(
    lite: LiteIndexClient, grpc: Any
) -> None:
    """`nearest`: recall's dense half sent once the BM25 half has come back. Its hits are
    a plain search's, a row the caller holds as its key alone; the rows it holds that the
    search did not return get their cosine to the vector, as a dense search scores them.
    Over gRPC, the same hits whole and the same cosines, computed here."""
    vector = embed_one("Which port does staging Postgres use?")
    every = _search(lite, vector, "embedding", "COSINE")  # the fixture's index holds < 20
    cosines = {h["entity"]["chunk_hash"]: h["distance"] for h in every}
    keys = list(cosines)
    have = [keys[0], keys[-1], keys[-2], "no-such-chunk"]  # one among the hits, two not
    dense = SearchRequest(vector, "embedding", "COSINE", 2, OUTPUT_FIELDS, "")
    hits, found = lite.nearest(COLLECTION, dense, known="chunk_hash", have=have, timeout=10)
    assert [h["id"] for h in hits] == [h["id"] for h in every[:2]]
    assert hits[0]["entity"] == {"chunk_hash": keys[0]}  # held: its key alone
    assert _plain(hits[1:]) == _plain(every[1:2])
    assert set(found) == {keys[-1], keys[-2]}  # not the hits', not an unknown key's
    for key, cos in found.items():
        assert cos == pytest.approx(cosines[key], abs=1e-5)
    over_grpc, found_grpc = grpc.nearest(
        COLLECTION, dense, known="chunk_hash", have=have, timeout=10
    )
    assert _plain(over_grpc) == _plain(every[:2])
    assert found_grpc.keys() == found.keys()
    for key, cos in found_grpc.items():
        assert cos == pytest.approx(cosines[key], abs=1e-5)


def test_the_checks_recall_makes_answer_as_pymilvus(lite: LiteIndexClient, grpc: Any) -> None:
    for client in (lite, grpc):
        assert client.has_collection(COLLECTION, timeout=5)
        assert not client.has_collection("memd_nobody", timeout=5)
        assert client.get_load_state(COLLECTION, timeout=5) == {"state": "Loaded"}
        client.load_collection(COLLECTION, timeout=5)  # loading a loaded one is a no-op
    assert lite.get_collection_stats(COLLECTION, timeout=5) == grpc.get_collection_stats(
        COLLECTION, timeout=5
    )
    for fields, flt in [(["count(*)"], ""), (["source", "heading"], time_filter_expr(T0, T0))]:
        ours = lite.query(COLLECTION, filter=flt, output_fields=fields, limit=None, timeout=5)
        theirs = grpc.query(COLLECTION, filter=flt, output_fields=fields, limit=None, timeout=5)
        assert [{k: r[k] for k in fields} for r in ours] == [
            {k: r[k] for k in fields} for r in theirs
        ]
    assert lite.get_load_state("memd_nobody", timeout=5) == {"state": "NotExist"}


def test_bad_requests_get_clear_errors_and_the_server_keeps_serving(
    index: Index, lite: LiteIndexClient
) -> None:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(10)
        sock.connect(str(query_socket_path(index.sock)))
        reader = sock.makefile("rb")

        def ask(raw: bytes) -> dict[str, Any]:
            sock.sendall(raw + b"\n")
            return dict(json.loads(reader.readline()))

        for raw, words in [
            (b"not json", "not JSON"),
            (b"[1, 2]", "JSON object"),
            (b'{"op": "drop_collection", "collection": "memd_alice"}', "unknown op"),
            (b'{"op": "search", "collection": "memd_alice"}', "anns_field"),
            (b'{"op": "query", "collection": 7}', "collection"),
            (
                b'{"op": "search", "collection": "memd_alice", "anns_field": "embedding", '
                b'"metric_type": "COSINE", "data": {"f32": "!!"}}',
                "base64",
            ),
            (
                b'{"op": "searches", "collection": "memd_alice", "searches": [{}], '
                b'"cosines": "yes"}',
                "'cosines' must be true or false",
            ),
            (
                b'{"op": "nearest", "collection": "memd_alice", "known": "chunk_hash", '
                b'"have": [], "search": {"data": "a text"}}',
                "packed vector",
            ),
            (
                b'{"op": "nearest", "collection": "memd_alice", "known": "chunk_hash", '
                b'"have": {"a": 1}, "search": {"data": {"f32": "AACAPw=="}}}',
                "'have' must be a list of keys",
            ),
        ]:
            reply = ask(raw)
            assert reply["ok"] is False and words in reply["error"]["message"], reply
        missing = ask(b'{"op": "get_collection_stats", "collection": "memd_nobody"}')
        assert missing["ok"] is False and "memd_nobody" in missing["error"]["message"]
        assert ask(b'{"op": "ping"}') == {"ok": True, "result": True}  # same connection
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:  # a runaway line
        sock.settimeout(10)
        sock.connect(str(query_socket_path(index.sock)))
        with contextlib.suppress(OSError):  # the server may hang up before all is sent
            sock.sendall(b"x" * (MAX_LINE + 2) + b"\n")
        reply = json.loads(sock.makefile("rb").readline())
        assert reply["ok"] is False and "too long" in reply["error"]["message"]
    with pytest.raises(IndexRequestError, match="memd_nobody"):
        lite.get_collection_stats("memd_nobody", timeout=5)
    assert lite.has_collection(COLLECTION, timeout=5)


def test_the_socket_is_owner_only_and_goes_with_the_server(tmp_path: Path) -> None:
    children = next(gen := stopping_children())
    sock_dir = next(short := short_dir())
    idx = Index(tmp_path, sock_dir / "index.sock", children)
    path = query_socket_path(idx.sock)
    st = path.stat()
    assert stat.S_ISSOCK(st.st_mode) and stat.S_IMODE(st.st_mode) == 0o600
    assert st.st_uid == os.getuid() and stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    client = LiteIndexClient(path)
    assert not client.has_collection(COLLECTION, timeout=5)
    idx.server.stop()
    assert not path.exists()
    with pytest.raises(IndexTransportError):
        client.has_collection(COLLECTION, timeout=5)
    idx.server = idx.start()  # a kept connection to the old server is replaced at once
    assert not client.has_collection(COLLECTION, timeout=5)
    client.close()
    for g in (gen, short):
        with pytest.raises(StopIteration):
            next(g)


@pytest.mark.parametrize("provider", ["bundled", "openai"])
def test_a_local_search_never_imports_pymilvus(index: Index, provider: str) -> None:
    """Recall of a local index in a fresh interpreter, the query embedded in-process
    (the default bundled model) or by memsearch's openai provider over HTTP (to a stand-in
    OpenAI-compatible API serving memd's model: the same vectors, so the index matches):
    pymilvus, and so pandas, pyarrow and gRPC, is never imported; nor memsearch (but for
    its provider) or snowballstemmer's other languages."""
    server = FakeUpstream(embedder=embed).start()
    cfg = (
        EmbeddingConfig()
        if provider == "bundled"
        else EmbeddingConfig("openai", embedding.MODEL_NAME, server.base_url, "sk-test")
    )
    script = textwrap.dedent(
        f"""
        import sys
        from memd.config import EmbeddingConfig
        from memd.indexing.query.expand import expand_hit
        from memd.indexing.query.search import IndexSearcher
        from memd.indexing.targets import IndexTarget
        cfg = EmbeddingConfig(*{(cfg.provider, cfg.model, cfg.base_url, cfg.api_key)!r})
        s = IndexSearcher(IndexTarget({index.uri!r}, {COLLECTION!r}), cfg)
        hits = s.search("staging Postgres port", top_k=2)
        assert "6543" in hits[0].content, hits
        assert "6543" in expand_hit(hits[0]).content
        assert s.count() > 0 and s.headings([hits[0].source])
        s.close()
        heavy = sorted(m for m in ("pymilvus", "grpc", "pandas", "pyarrow") if m in sys.modules)
        print("HEAVY", heavy, "openai" in sys.modules)
        print("LIGHT", sorted(m for m in ("memsearch", "snowballstemmer") if m in sys.modules))
        """
    )
    try:
        out = subprocess.run(
            [sys.executable, "-c", script], capture_output=True, text=True, timeout=120, check=False
        )
    finally:
        server.stop()
    assert out.returncode == 0, out.stdout + out.stderr
    assert f"HEAVY [] {provider == 'openai'}" in out.stdout, out.stdout + out.stderr
    # Nor memsearch (its __init__ imports its core) but for its openai provider, nor every
    # language of snowballstemmer: recall stems English only (issue 29, ~3.6 MB of memd).
    light = "['memsearch']" if provider == "openai" else "[]"
    assert f"LIGHT {light}" in out.stdout, out.stdout + out.stderr
