"""The embedded models (MiniLM by default, WordLlama) and the OpenAI-compatible endpoint that
serves them to watchers. MiniLM's own checks are in test_minilm.py."""

from __future__ import annotations

import asyncio
import json
import logging
import math
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator

import pytest

from memd.indexing import embedding
from memd.indexing.daemon.embed_server import SPLIT_AT, EmbeddingServer, Endpoint
from tests.support.embedding import embed, embed_one


@pytest.fixture(scope="module")
def server() -> Iterator[Endpoint]:
    srv = EmbeddingServer()
    yield srv.start()
    srv.stop()


def _post(
    endpoint: Endpoint, body: object, key: str | None = None, path: str = "/embeddings"
) -> tuple[int, dict, dict]:
    data = json.dumps(body).encode()
    req = urllib.request.Request(endpoint.base_url + path, data=data, method="POST")
    req.add_header("Content-Type", "application/json")
    req.add_header("Authorization", f"Bearer {endpoint.api_key if key is None else key}")
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            return resp.status, json.loads(resp.read()), dict(resp.headers)
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read()), dict(exc.headers)


# -- the model --------------------------------------------------------------------------------


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


# -- the endpoint -----------------------------------------------------------------------------


def test_endpoint_listens_on_loopback_with_a_random_key(server: Endpoint) -> None:
    assert server.base_url.startswith("http://127.0.0.1:")
    assert server.base_url.endswith("/v1")
    assert len(server.api_key) >= 32
    assert server.model == embedding.MODEL_NAME
    with EmbeddingServer() as other:
        assert other.endpoint.api_key != server.api_key
        assert other.endpoint.base_url != server.base_url


def test_wrong_or_missing_key_is_401(server: Endpoint) -> None:
    body = {"model": server.model, "input": ["x"]}
    assert _post(server, body, key="wrong")[0] == 401
    assert _post(server, body, key="")[0] == 401
    status, data, _ = _post(server, body)
    assert status == 200 and len(data["data"][0]["embedding"]) == embedding.DIMENSION


def test_bad_requests_get_openai_shaped_errors(server: Endpoint) -> None:
    status, data, _ = _post(server, {"model": "text-embedding-3-small", "input": ["x"]})
    assert status == 404 and data["error"]["code"] == "model_not_found"
    assert _post(server, {"model": server.model, "input": [1, 2, 3]})[0] == 400
    assert _post(server, {"model": server.model, "input": []})[0] == 400
    chat = _post(server, {"model": server.model, "input": ["x"]}, path="/chat/completions")
    assert chat[0] == 404


def test_each_response_closes_its_connection(server: Endpoint) -> None:
    """Keep-alive makes memsearch's watcher lose its first file event (see embed_server)."""
    _, _, headers = _post(server, {"model": server.model, "input": "x"})
    assert headers.get("Connection", "").lower() == "close"


def test_openai_sdk_float_and_base64_match_the_model(server: Endpoint) -> None:
    import openai

    client = openai.OpenAI(base_url=server.base_url, api_key=server.api_key)
    texts = ["first text", "second, longer text about memory"]
    expected = embed(texts)
    as_float = client.embeddings.create(input=texts, model=server.model, encoding_format="float")
    assert [d.embedding for d in as_float.data] == expected
    as_b64 = client.embeddings.create(input=texts, model=server.model)  # SDK default: base64
    assert [d.embedding for d in as_b64.data] == expected


def test_memsearch_openai_provider_detects_dimension_and_batches(server: Endpoint) -> None:
    from memsearch.embeddings import get_provider

    provider = get_provider(
        "openai", model=server.model, base_url=server.base_url, api_key=server.api_key, batch_size=2
    )
    assert provider.dimension == embedding.DIMENSION
    texts = [f"chunk number {i}" for i in range(5)]
    assert asyncio.run(provider.embed(texts)) == embed(texts)


@pytest.mark.parametrize("model", list(embedding.MODELS))
def test_one_endpoint_serves_every_bundled_model_by_name(server: Endpoint, model: str) -> None:
    """Clients may switch between the bundled providers while memd runs: the endpoint
    answers each model by the name a watcher asks for, with that model's vectors."""
    status, data, _ = _post(server, {"model": model, "input": ["spare key"]})
    assert status == 200 and data["model"] == model
    assert data["data"][0]["embedding"] == embed_one("spare key", model)


def test_a_watcher_s_batch_is_split_in_two_and_keeps_its_order() -> None:
    """A batch of SPLIT_AT texts or more runs in two threads at once (a lone watcher's
    burst uses both cores): each text still gets its own vector, in its place."""
    threads: set[int] = set()

    def tagged(texts: list[str]) -> list[list[float]]:
        if texts != ["warm up"]:  # the server's first call, before it serves
            threads.add(threading.get_ident())
            time.sleep(0.05)  # both halves are in flight together
        return [[float(len(t))] if t == "warm up" else [float(t)] for t in texts]

    texts = [str(n) for n in range(40)]
    srv = EmbeddingServer(embedder=tagged, model="m")
    endpoint = srv.start()
    try:
        status, data, _ = _post(endpoint, {"model": "m", "input": texts})
        assert status == 200
        assert [d["embedding"] for d in data["data"]] == [[float(t)] for t in texts]
        assert len(threads) == 2
        threads.clear()
        _post(endpoint, {"model": "m", "input": texts[: SPLIT_AT - 1]})
        assert len(threads) == 1
    finally:
        srv.stop()


def test_stop_frees_the_port() -> None:
    srv = EmbeddingServer(embedder=lambda texts: [[1.0] for _ in texts], model="m")
    endpoint = srv.start()
    srv.stop()
    with pytest.raises(urllib.error.URLError):
        _post(endpoint, {"model": "m", "input": ["x"]})


def test_server_errors_are_logged_not_fatal() -> None:
    failed = threading.Event()

    def flaky(texts: list[str]) -> list[list[float]]:
        if texts == ["x"] and not failed.is_set():
            failed.set()
            raise RuntimeError("boom")
        return [[0.5, 0.5] for _ in texts]

    with EmbeddingServer(embedder=flaky, model="m") as srv:
        ep = srv.endpoint
        assert _post(ep, {"model": "m", "input": ["x"]})[0] == 500
        assert _post(ep, {"model": "m", "input": ["x"]})[0] == 200
