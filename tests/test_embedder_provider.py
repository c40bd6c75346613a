"""memsearch's `memd` provider (`memd.indexing.engine.embedder_provider`) against a real
embedder child: memsearch's own factory returns it, it gives the model's vectors (a big
batch split in two included), and it raises while the child is down, so memsearch's
watcher fails that file as it did on the HTTP relay's 503."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest

from memd.indexing import embedding, engine
from memd.indexing.engine import embedder_provider
from memd.indexing.query.embedder_client import EmbedderUnavailable
from tests.support.embedding import embed
from tests.test_embedder_client import child  # noqa: F401 - the real embedder child


@pytest.fixture
def registry() -> Iterator[engine.Registry]:
    registry = engine.Registry()
    yield registry
    registry.reset()


def test_memsearch_builds_the_memd_provider_and_it_gives_the_models_vectors(
    child: Path,  # noqa: F811
    registry: engine.Registry,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import memsearch.core

    engine.prepare_catch_up(registry)
    monkeypatch.setenv("MEMD_EMBEDDER_SOCKET", str(child))
    provider = memsearch.core.get_provider("memd", model=embedding.MODEL_NAME, batch_size=40)
    assert provider.model_name == embedding.MODEL_NAME and provider.batch_size == 40
    assert provider.dimension == embedding.MODELS[embedding.MODEL_NAME].dimension
    texts = [f"text number {n}" for n in range(embedder_provider.SPLIT_AT * 3 + 1)]
    assert asyncio.run(provider.embed(texts)) == embed(texts, embedding.MODEL_NAME)
    with pytest.raises(ValueError, match="Unknown embedding provider"):
        memsearch.core.get_provider("no-such-provider")  # other names are memsearch's


def test_the_provider_raises_while_the_embedder_is_down(tmp_path: Path) -> None:
    provider = embedder_provider.provider(embedding.MODEL_NAME, socket=str(tmp_path / "x.sock"))
    with pytest.raises(EmbedderUnavailable):
        asyncio.run(provider.embed(["a"]))


def test_the_provider_needs_the_socket_memd_names(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("MEMD_EMBEDDER_SOCKET", raising=False)
    with pytest.raises(ValueError, match="MEMD_EMBEDDER_SOCKET"):
        embedder_provider.provider(embedding.MODEL_NAME)
