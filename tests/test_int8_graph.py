"""MiniLM's graph rewritten to compute in int8 (memd.indexing.int8_graph): the same
vectors as the float32 graph onnxruntime folds, from a quarter of the weights' memory."""

from __future__ import annotations

import hashlib

import pytest

from memd.indexing import int8_graph, minilm

# sha256 of what the hand-written wire-format rewrite (commit 982485f, before
# google.protobuf) made of the pinned model.onnx: the same bytes give the same session,
# so bit-identical vectors.
REWRITTEN_SHA256 = "e19dd62fc6f518ab2a7d7c3b12b1de3d957187574d960ae2b34ca660b25560fc"

TEXTS = [
    "I'm allergic to peanuts and shellfish.",
    "what can't I eat?",
    "The staging database listens on port 6543 behind pgbouncer.",
]


def _session(source: bytes) -> object:
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.log_severity_level = 3
    return ort.InferenceSession(source, options, providers=["CPUExecutionProvider"])


def test_the_rewritten_graph_gives_the_float_graph_s_vectors() -> None:
    """Every int8 weight matrix is multiplied as int8 (36 MatMuls, 2 embedding tables),
    and each text's vector stays within cosine 0.98 of the float32 one (measured: 0.99+)."""
    import numpy as np

    original = minilm.model_path().read_bytes()
    rewritten = int8_graph.rewrite(original)
    assert rewritten.count(b"DynamicQuantizeMatMul") == 36
    model = minilm.load_model()  # the rewritten graph, as memd runs it
    floats = minilm.OnnxModel(_session(original), model._tokenizer)
    for mine, ref in zip(model.embed(TEXTS), floats.embed(TEXTS), strict=True):
        assert float(np.dot(mine, ref)) > 0.98
    assert model.embed(TEXTS) == minilm.OnnxModel(_session(rewritten), model._tokenizer).embed(
        TEXTS
    )


def test_the_rewrite_writes_the_bytes_the_hand_written_one_did() -> None:
    """google.protobuf keeps every field the rewrite does not know (the weights' raw
    data, value infos) and in place: the graph, and so every vector, is what it was. (A
    protobuf release that wrote fields in another order would fail this with a graph
    onnxruntime reads the same: then compare the two graphs' vectors instead.)"""
    rewritten = int8_graph.rewrite(minilm.model_path().read_bytes())
    assert hashlib.sha256(rewritten).hexdigest() == REWRITTEN_SHA256


@pytest.mark.parametrize("data", [b"", b"\x08\x07", b"\x3a\x00", b"\x3a\x05\x0a"])
def test_a_model_of_another_shape_is_refused(data: bytes) -> None:
    """No graph, a graph without int8 weights dequantised by Cast and Mul, or bytes that
    are not protobuf at all."""
    with pytest.raises(int8_graph.RewriteError):
        int8_graph.rewrite(data)
