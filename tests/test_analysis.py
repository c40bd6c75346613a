"""English analysis for BM25 on both backends: stemmed forms match, stop words alone do not.

Local: a real index server on a Unix socket; the collection is created by memsearch's own
MilvusStore (as the watcher creates it), and the server gives its `content` field memd's
analyzer. Scale-out: a Milvus Lite gRPC server on TCP stands in for a Milvus server (with
memd's analyzers installed, as a real server understands the stemmer natively), and the
collection is created by memd with `analysis.create_collection`.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from memd.indexing import analysis, embedding
from memd.indexing.targets import Endpoint
from tests.support.children import Child, wait_for
from tests.support.embedder import EmbedderChild
from tests.support.embedding import embed_one
from tests.test_index_server import start_index_server

TEXTS = ["She was running marathons every weekend", "The cat sleeps on the sofa"]


def _rows() -> list[dict[str, Any]]:
    return [
        {
            "chunk_hash": f"h{i}",
            "embedding": embed_one(t),
            "content": t,
            "source": "/x/a.md",
            "heading": f"h{i}",
            "heading_level": 2,
            "start_line": i,
            "end_line": i,
        }
        for i, t in enumerate(TEXTS)
    ]


def _bm25(client: Any, collection: str, query: str) -> list[str]:
    res = client.search(
        collection_name=collection,
        data=[query],
        anns_field="sparse_vector",
        search_params={"metric_type": "BM25"},
        limit=5,
        output_fields=["content"],
    )
    return [hit["entity"]["content"] for hit in res[0]]


def _check_analysis(client: Any, collection: str) -> None:
    fields = client.describe_collection(collection)["fields"]
    content = next(f for f in fields if f["name"] == "content")
    params = content["params"]["analyzer_params"]
    assert (json.loads(params) if isinstance(params, str) else params) == analysis.ANALYZER_PARAMS
    assert _bm25(client, collection, "runs marathon") == [TEXTS[0]]  # run/running, marathon(s)
    assert _bm25(client, collection, "sleeping cats") == [TEXTS[1]]
    assert _bm25(client, collection, "the was she on every") == [TEXTS[0]]  # only "every"
    assert _bm25(client, collection, "the was on") == []  # stop words alone match nothing


def test_terms_stem_and_drop_stop_words() -> None:
    assert analysis.terms("What did she say about the running Marathons?") == [
        "say",
        "run",
        "marathon",
    ]


STEM_WORDS = [
    "running",
    "generously",
    "happiness",
    "agreed",
    "caresses",
    "ponies",
    "relational",
    "conditional",
    "skies",
    "dying",
    "news",
    "proceeding",
    "succeeded",
    "exceedingly",
    "gently",
    "knightly",
    "marathons",
]


@settings(max_examples=400, deadline=None)
@given(st.text(alphabet=st.characters(max_codepoint=0x7F)) | st.text())
def test_words_are_the_regexs_words_lower_cased(text: str) -> None:
    """Recall cuts an ASCII text into words without the regex (3x faster): the same words,
    for any ASCII text and any other."""
    assert analysis.words(text) == analysis.WORD_RE.findall(text.lower())


def test_words_of_a_mixed_text() -> None:
    assert analysis.words("Caf\u00e9 O'Brien's 2024-05-08, snake_case!") == [
        "caf\u00e9",
        "o",
        "brien",
        "s",
        "2024",
        "05",
        "08",
        "snake_case",
    ]
    assert analysis.words("Port 6543\tof STAGING-db.") == ["port", "6543", "of", "staging", "db"]


@pytest.mark.parametrize("language", ["english", "porter", "dutch_porter", "german"])
def test_the_c_stemmer_and_the_fallback_loaded_alone_give_snowballs_stems(language: str) -> None:
    """memd stems with PyStemmer (Snowball's C library); where it cannot be imported, with
    snowballstemmer's Python module for the language, loaded without the package's 30-odd
    languages (issue 29). Both are Snowball: the same stems."""
    import Stemmer

    ours, fallback = analysis.stemmer(language), analysis.stemmer_class(language)()
    assert isinstance(ours, Stemmer.Stemmer)
    assert [ours.stemWord(w) for w in STEM_WORDS] == [fallback.stemWord(w) for w in STEM_WORDS]


def _probe(*lines: str) -> list[str]:
    """What `lines` print in a fresh interpreter that imported memd's analysis."""
    code = "\n".join(["import sys", *lines])
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    return done.stdout.splitlines()


_RECALL_TERMS = (
    "from memd.indexing import analysis",
    "print(analysis.terms('the running Marathons'))",
    "print(sorted(m for m in sys.modules if 'snowball' in m), bool(sys.modules.get('Stemmer')))",
    "try:\n    analysis.stemmer('klingon')\nexcept KeyError:\n    print('KeyError')",
)


def test_stemming_english_loads_no_snowballstemmer_module() -> None:
    """In a fresh interpreter, recall's analysis stems with PyStemmer and imports nothing of
    snowballstemmer (its __init__ imports every language, 2.1 MB); an unknown language
    still fails with KeyError, as snowballstemmer's own stemmer() fails."""
    assert _probe(*_RECALL_TERMS) == ["['run', 'marathon']", "[] True", "KeyError"]


def test_without_pystemmer_the_fallback_loads_english_alone() -> None:
    """Where PyStemmer cannot be imported, recall's analysis gives the same terms with
    snowballstemmer's English module, imported alone; an unknown language still fails."""
    alone = "_memd_snowballstemmer"
    modules = sorted(
        [alone, *(f"{alone}.{m}" for m in ("among", "basestemmer", "english_stemmer"))]
    )
    blocked = "sys.modules['Stemmer'] = None  # import Stemmer raises ImportError"
    assert _probe(blocked, *_RECALL_TERMS) == [
        "['run', 'marathon']",
        f"{modules} False",
        "KeyError",
    ]


@pytest.mark.slow
def test_local_index_server_gives_the_watchers_collection_the_analyzer(
    tmp_path: Path, short_tmp: Path, children: list[Child]
) -> None:
    from memsearch.store import MilvusStore
    from pymilvus import MilvusClient

    sock = short_tmp / "index.sock"
    start_index_server(children, tmp_path / "milvus", sock, tmp_path / "server.log")
    store = MilvusStore(
        f"unix:{sock}", collection="c", dimension=embedding.DIMENSION, _create_if_missing=True
    )
    store.upsert(_rows())
    store.close()
    client = MilvusClient(uri=f"unix:{sock}", dedicated=True)
    try:
        _check_analysis(client, "c")
    finally:
        client.close()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def milvus_server_stand_in(children: list[Child], data_dir: Path, log: Path) -> str:
    """`milvus_lite server` on TCP with memd's analyzers: it then analyses like a Milvus
    server does natively. Returns its URI."""
    port = _free_port()
    code = (
        "import runpy, sys; from memd.indexing.engine import prepare_index_server; "
        "prepare_index_server(); sys.argv = ['milvus_lite'] + sys.argv[1:]; "
        "runpy.run_module('milvus_lite', run_name='__main__')"
    )
    child = Child(
        [
            sys.executable,
            "-c",
            code,
            "server",
            "--data-dir",
            str(data_dir),
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
        ],
        log,
    )
    children.append(child)

    def listening() -> bool:
        with socket.socket() as s:
            return s.connect_ex(("127.0.0.1", port)) == 0

    wait_for(listening, what="the stand-in Milvus server")
    return f"http://127.0.0.1:{port}"


@pytest.mark.slow
def test_milvus_server_collection_created_by_memd_has_the_analyzer(
    tmp_path: Path, children: list[Child]
) -> None:
    from pymilvus import MilvusClient

    uri = milvus_server_stand_in(children, tmp_path / "remote", tmp_path / "milvus.log")
    client = MilvusClient(uri=uri, dedicated=True)
    try:
        assert analysis.create_collection(client, "memd_alice", embedding.DIMENSION)
        assert not analysis.create_collection(
            client, "memd_alice", embedding.DIMENSION
        )  # already there
        client.upsert(collection_name="memd_alice", data=_rows())
        _check_analysis(client, "memd_alice")
    finally:
        client.close()


@pytest.fixture
def endpoint(embedder: EmbedderChild) -> Endpoint:
    return embedder.endpoint()


@pytest.mark.slow
def test_an_index_built_before_the_analyzer_is_rebuilt_and_then_answers(
    tmp_path: Path, children: list[Child], endpoint: Endpoint
) -> None:
    from memd import indexing
    from memd.indexing.daemon.settings import spec_path
    from tests.test_indexing import EXCHANGE, make_config, start_client

    config = make_config(tmp_path)
    client = start_client(children, config, "alice", endpoint)
    (client.layout.sessions / "s1.md").write_text(EXCHANGE, encoding="utf-8")
    wait_for(lambda: client.rows(), what="first indexing")
    assert client.server is not None
    client.watcher.stop()
    client.server.stop()
    # What memd wrote before the analyzer existed: the same spec without its name.
    path = spec_path(client.layout)
    old = json.loads(path.read_text(encoding="utf-8"))
    del old["analyzer"]
    path.write_text(json.dumps(old), encoding="utf-8")
    assert indexing.needs_rebuild(client.layout, indexing.index_spec(config, client.layout))

    again = start_client(children, config, "alice", endpoint)  # prepare_index rebuilds
    assert indexing.read_spec(client.layout) == indexing.index_spec(config, client.layout)
    searcher = again.searcher()
    try:
        # "databases" finds "database" only through the stemmer; the rows came back
        # from the markdown file, nothing was lost.
        hits = wait_for(
            lambda: searcher.search("staging databases listening"),
            timeout=90.0,  # a cold `memsearch watch` start, then its initial scan
            what="reindex",
        )
        assert "6543" in hits[0].content
    finally:
        searcher.close()
