"""memd's side of the embedder child, against a real `python -m
memd.indexing.children.embedder` on a real socket: the same vectors as the model in-process,
a client that waits for a restarting child and then says it is down, and recall by keywords
alone meanwhile (memsearch's `memd` provider over the same socket: test_embedder_provider)."""

from __future__ import annotations

import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from memd.indexing import embedding
from memd.indexing.children import EMBEDDER, index_ready
from memd.indexing.query.embedder_client import EmbedderClient, EmbedderUnavailable
from memd.indexing.query.search import IndexSearcher
from memd.indexing.targets import Endpoint
from tests.support.embedding import embed
from tests.support.hostile import needs_hostile, nobody_python
from tests.support.index import ClientIndex, client_config


@pytest.fixture(scope="module")
def child() -> Iterator[Path]:
    """A real embedder child on a socket in a private folder."""
    folder = Path(tempfile.mkdtemp(prefix="memd-emb-", dir="/tmp"))
    sock = folder / "embedder.sock"
    proc = subprocess.Popen(
        [sys.executable, "-m", EMBEDDER, "--socket", str(sock)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    deadline = time.monotonic() + 120
    while not index_ready(sock):
        assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
        assert time.monotonic() < deadline, "embedder not ready"
        time.sleep(0.05)
    yield sock
    proc.terminate()
    proc.wait(10)
    assert not sock.exists()  # removed on a polite stop


@pytest.mark.parametrize("model", sorted(embedding.MODELS))
def test_the_child_gives_the_vectors_of_the_model_in_process(child: Path, model: str) -> None:
    texts = ["**User:** I'm allergic to peanuts.\n\n**Assistant:** Noted.", "", "x" * 3000]
    client = EmbedderClient(child)
    try:
        assert client.embed(texts, model) == embed(texts, model)  # float32 both ways: exact
        with pytest.raises(ValueError, match="UnknownModel"):
            client.embed(["a"], "no-such-model")
        assert client.embed_one("hello", model) == embed(["hello"], model)[0]
    finally:
        client.close()


def test_a_client_waits_for_a_restarting_child_then_says_it_is_down(tmp_path: Path) -> None:
    client = EmbedderClient(tmp_path / "nobody.sock", wait=0.5)
    started = time.monotonic()
    with pytest.raises(EmbedderUnavailable):
        client.embed(["a"])
    assert time.monotonic() - started >= 0.4  # it waited for a restart first


@pytest.mark.slow
def test_recall_searches_by_keywords_while_the_embedder_is_down(
    tmp_path: Path, child: Path
) -> None:
    config = client_config(tmp_path / "memory", "ann")
    endpoint = Endpoint(embedding.MODEL_NAME, str(child))
    index = ClientIndex(config, "ann", endpoint).start()
    try:
        index.layout.sessions.mkdir(parents=True, exist_ok=True)
        (index.layout.sessions / "s.md").write_text(
            "# s\n\n## Exchange 1\n\n**User:** I'm allergic to peanuts and shellfish.\n\n"
            "**Assistant:** Noted.\n"
        )
        index.wait_for(lambda s: s.search("peanuts shellfish", top_k=3))
        assert index.searcher is not None
        down = IndexSearcher(
            index.searcher.target,
            config.embedding,
            root=index.layout.root,
            embedder=EmbedderClient(tmp_path / "nobody.sock"),
        )
        try:
            hits = down.search("peanuts", top_k=3)
            assert hits and "shellfish" in hits[0].content  # BM25 alone found it
            assert hits[0].features[0] == 0.0  # no cosine: no dense half
            assert hits[0].score > 0.055  # over the default min_score: recall shows it
        finally:
            down.close()
    finally:
        index.stop()


PEER = """
import socket, sys
conn = socket.socket(socket.AF_UNIX)
try:
    conn.connect(sys.argv[1])
except OSError as exc:
    print("denied", exc.errno)
    raise SystemExit
conn.settimeout(20)
try:
    conn.sendall(b'{"op": "embed", "texts": ["a secret"]}\\n')
    print("answered" if conn.recv(65536) else "closed")
except OSError:  # dropped before or while it wrote
    print("closed")
"""


@needs_hostile
def test_another_uid_gets_no_vector(child: Path) -> None:
    """The socket (0600 in a 0700 folder) keeps other local users out; one that reaches it
    anyway (the modes loosened here on purpose) is dropped unanswered (SO_PEERCRED)."""
    assert nobody_python(PEER, str(child)).stdout.startswith("denied")
    folder_mode, sock_mode = child.parent.stat().st_mode, child.stat().st_mode
    child.parent.chmod(0o755)
    child.chmod(0o777)
    try:
        assert nobody_python(PEER, str(child)).stdout.strip() == "closed"
    finally:
        child.chmod(sock_mode & 0o777)
        child.parent.chmod(folder_mode & 0o777)
    assert EmbedderClient(child).embed(["still serving"], embedding.MODEL_NAME)
