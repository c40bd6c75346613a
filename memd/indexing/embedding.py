"""The embedded models, loaded offline from what memd's wheels ship, and the one `Embedder`
that holds them.

Two are bundled: all-MiniLM-L6-v2 (provider "minilm", the default, memd.indexing.minilm)
and WordLlama (provider "wordllama", below).
`MODELS` maps each served model name to its provider, dimension and loader; `PROVIDERS`
maps a config provider to its model name.

WordLlama is a static embedding: a token-embedding table and mean pooling. memd reads the
weights and the tokenizer that ship inside the wordllama wheel and pools them itself, per
text, instead of calling `WordLlama.load()`:

- the loader looks for the bundled tokenizer in `wordllama/tokenizer/` while the wheel ships
  it in `wordllama/tokenizers/`, so it falls back to a Hugging Face download;
- `import wordllama` runs `logging.basicConfig(level=INFO)`, reconfiguring the importing
  process's root logger;
- its batched pooling sums padded rows, so a text's vector depends (in the last bits) on the
  other texts in its batch. Pooling each text on its own makes the vector memd computes for
  a query bit-identical to the one the watcher stored for the same text.

The maths is the same as `WordLlamaInference.embed(norm=True)` (tests compare them).
"""

from __future__ import annotations

import importlib.util
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import structlog

from memd.indexing import minilm
from memd.markdown import bare_text

log = structlog.get_logger()

# Model names watchers and recall agree on. memsearch puts the name into every chunk id.
WORDLLAMA_MODEL = "wordllama-l2-256"
WORDLLAMA_DIMENSION = 256
_CONFIG = "l2_supercat"


def _package_dir() -> Path:
    """Find the installed wordllama package without importing it (see the module docstring)."""
    spec = importlib.util.find_spec("wordllama")
    if spec is None or spec.origin is None:
        raise RuntimeError("the wordllama package is not installed")
    return Path(spec.origin).parent


def weights_path() -> Path:
    return _package_dir() / "weights" / f"{_CONFIG}_{WORDLLAMA_DIMENSION}.safetensors"


def tokenizer_path() -> Path:
    return _package_dir() / "tokenizers" / f"{_CONFIG}_tokenizer_config.json"


class StaticModel:
    """A token-embedding table plus its tokenizer; thread-safe after construction."""

    def __init__(self, weights: Any, tokenizer: Any) -> None:
        import numpy as np

        self._table = np.ascontiguousarray(weights, dtype=np.float32)
        self._tokenizer = tokenizer
        self._tokenizer.no_padding()
        self._tokenizer.no_truncation()

    @property
    def dimension(self) -> int:
        return int(self._table.shape[1])

    def embed(self, texts: list[str]) -> list[list[float]]:
        """Mean-pooled, unit-length vectors.

        A text without tokens (the empty string) has no direction; it gets a fixed unit
        vector so that a COSINE search never sees a zero or NaN vector.
        """
        import numpy as np

        encodings = self._tokenizer.encode_batch(list(texts), add_special_tokens=False)
        out = np.empty((len(texts), self.dimension), dtype=np.float32)
        for row, enc in enumerate(encodings):
            ids = np.clip(np.asarray(enc.ids, dtype=np.int64), 0, self._table.shape[0] - 1)
            pooled = self._table[ids].mean(axis=0, dtype=np.float32) if len(ids) else None
            norm = float(np.linalg.norm(pooled)) if pooled is not None else 0.0
            if pooled is None or norm == 0.0 or not np.isfinite(norm):
                out[row] = np.float32(1.0 / np.sqrt(self.dimension))
            else:
                out[row] = pooled / np.float32(norm)
        return out.tolist()


def load_model() -> StaticModel:
    """Read the bundled files; nothing here touches the network or `~/.cache`."""
    from safetensors import safe_open
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(tokenizer_path()))
    with safe_open(str(weights_path()), framework="np", device="cpu") as fh:
        weights = fh.get_tensor("embedding.weight")
    model = StaticModel(weights, tokenizer)
    if model.dimension != WORDLLAMA_DIMENSION:
        raise RuntimeError(
            f"bundled WordLlama weights have dim {model.dimension}, not {WORDLLAMA_DIMENSION}"
        )
    return model


class Model(Protocol):
    """What an embedded model offers; thread-safe."""

    @property
    def dimension(self) -> int: ...

    def embed(self, texts: list[str]) -> list[list[float]]: ...


@dataclass(frozen=True)
class ModelInfo:
    """A bundled model: the provider that names it in the config, its vectors' size, how
    to load it, and whether it embeds a chunk's bare text (`memd.markdown.bare_text`:
    without memd's headings and labels) rather than the chunk as written."""

    provider: str
    dimension: int
    load: Callable[[], Model]
    bare: bool = False


MODELS: dict[str, ModelInfo] = {
    minilm.MODEL_NAME: ModelInfo("minilm", minilm.DIMENSION, minilm.load_model, bare=True),
    WORDLLAMA_MODEL: ModelInfo("wordllama", WORDLLAMA_DIMENSION, load_model),
}
PROVIDERS = {info.provider: name for name, info in MODELS.items()}
# The default: what `[embedding] provider` means when it is not set. MiniLM finds facts
# asked in other words that WordLlama and BM25 miss (issue 25), at a few ms of CPU per
# text and ~25 MB more memory (docs/indexing.md, docs/quality.md round 5).
MODEL_NAME = minilm.MODEL_NAME
DIMENSION = minilm.DIMENSION


class Embedder:
    """The embedded models, each loaded on first use and kept (WordLlama: well under a
    second and ~32 MB; MiniLM: ~1 s and ~25-70 MB).

    Whoever embeds owns one: memd's embedder child (`memd.indexing.children.embedder`)
    makes the one that serves both the watchers and every client's recall queries, so
    each model is in memory once, and only the models some client's config names are
    loaded.
    Thread-safe.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._models: dict[str, Model] = {}

    def model(self, name: str = MODEL_NAME) -> Model:
        found = self._models.get(name)
        if found is None:
            if name not in MODELS:
                raise ValueError(f"no bundled embedding model {name!r}")
            with self._lock:
                found = self._models.get(name)
                if found is None:
                    found = self._models[name] = MODELS[name].load()
                    log.info("embedding.model_loaded", model=name, dimension=found.dimension)
        return found

    def embed(self, texts: list[str], model: str = MODEL_NAME) -> list[list[float]]:
        """One unit-length vector per text, from the bundled model `model`.

        The one place both sides pass through (the watchers' endpoint and recall's
        queries), so what a model is given is decided here, the same for chunks and
        queries: a `bare` model gets the text without memd's own lines (ModelInfo).
        """
        if not texts:
            return []
        found = self.model(model)
        if MODELS[model].bare:
            texts = [bare_text(t) for t in texts]
        return found.embed(texts)

    def embed_one(self, text: str, model: str = MODEL_NAME) -> list[float]:
        return self.embed([text], model)[0]
