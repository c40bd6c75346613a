"""The embedded models (MiniLM by default, WordLlama). MiniLM's own checks are in
test_minilm.py; the embedder child that serves them to watchers and recall is tested in
test_embedder_client.py and test_embedder_provider.py."""

from __future__ import annotations

import logging
import math
import socket
import subprocess
import sys
import threading

import pytest

from memd.indexing import embedding
from tests.support.embedding import embed, embed_one


def test_wordllama_loads_from_its_wheel_offline(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*_args: object, **_kw: object) -> None:
        raise AssertionError("the model loader tried to open a network connection")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)
    model = embedding.load_model()
    assert model.dimension == embedding.WORDLLAMA_DIMENSION == 256
    assert len(model.embed(["offline"])[0]) == 256


@pytest.mark.parametrize("model", list(embedding.MODELS))
def test_vectors_are_unit_length_and_of_the_models_dimension(model: str) -> None:
    vectors = embed(["hello world", "the cat sat on the mat", "Grüße, 世界"], model)
    dim = embedding.MODELS[model].dimension
    assert [len(v) for v in vectors] == [dim, dim, dim]
    for vec in vectors:
        assert math.isclose(math.sqrt(sum(x * x for x in vec)), 1.0, abs_tol=1e-5)


@pytest.mark.parametrize("model", list(embedding.MODELS))
def test_a_text_gets_the_same_vector_alone_or_in_any_batch(model: str) -> None:
    text = "what did we decide about the database migration?"
    alone = embed_one(text, model)
    batched = embed(["a much longer neighbour " * 40, text, "x"], model)[1]
    assert alone == batched


def test_same_maths_as_wordllama_itself() -> None:
    from safetensors import safe_open
    from tokenizers import Tokenizer

    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    try:  # `import wordllama` runs logging.basicConfig(); undo it for the other tests
        from wordllama.inference import WordLlamaInference
    finally:
        root.handlers[:] = handlers
        root.setLevel(level)

    tok = Tokenizer.from_file(str(embedding.tokenizer_path()))
    with safe_open(str(embedding.weights_path()), framework="np") as fh:
        weights = fh.get_tensor("embedding.weight")
    texts = ["memory recall for an LLM", "Paris is the capital of France."]
    reference = WordLlamaInference(weights, tok).embed(texts, norm=True)
    for ours, ref in zip(embed(texts, embedding.WORDLLAMA_MODEL), reference, strict=True):
        assert max(abs(a - float(b)) for a, b in zip(ours, ref, strict=True)) < 1e-6


@pytest.mark.parametrize("model", list(embedding.MODELS))
def test_similar_texts_are_closer_than_unrelated_ones(model: str) -> None:
    a, b, c = embed(
        [
            "the weather is sunny and warm",
            "sunny warm weather today",
            "compile the rust crate with cargo",
        ],
        model,
    )

    def cos(x: list[float], y: list[float]) -> float:
        return sum(p * q for p, q in zip(x, y, strict=True))

    assert cos(a, b) > cos(a, c)


@pytest.mark.parametrize("model", list(embedding.MODELS))
def test_empty_text_gets_a_finite_unit_vector(model: str) -> None:
    vec = embed_one("", model)
    assert all(math.isfinite(x) for x in vec)
    assert math.isclose(sum(x * x for x in vec), 1.0, abs_tol=1e-5)


def test_importing_memd_embedding_leaves_root_logging_alone() -> None:
    code = (
        "import logging, memd.indexing.embedding as e; m = e.Embedder();"
        "[m.embed(['x'], name) for name in e.MODELS];"
        "print(len(logging.getLogger().handlers))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip().splitlines()[-1] == "0"


def test_concurrent_callers_share_one_model_and_agree() -> None:
    texts = [f"thread {i} text about topic {i % 3}" for i in range(8)]
    expected = embed(texts)
    results: dict[int, list[float]] = {}

    def work(i: int) -> None:
        results[i] = embed_one(texts[i])

    threads = [threading.Thread(target=work, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert [results[i] for i in range(8)] == expected
