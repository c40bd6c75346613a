"""Recall's index requests as JSON lines on a second socket of the index server: the wire format.

memd's recall needs eight requests of a client's index (`has_collection`,
`get_collection_stats`, `get_load_state`, `load_collection`, `query`, `search`,
`searches`, several searches in one round trip, and `nearest`, the dense half after the
BM25 half with the cosines of the BM25 hits it did not return). Made with
pymilvus over gRPC they cost memd ~90 MB: pymilvus pulls in pandas, pyarrow, gRPC and
protobuf (docs/performance.md). The index server already holds the engine (Milvus
Lite's `MilvusLite` database, in-process), so it answers these requests itself, on
`<index socket>` with `.q` before the suffix: one JSON object per line each way, run
directly on the engine (no gRPC), the same calls the gRPC servicer makes for them.

Request: `{"op": "...", "collection": "...", ...}`; reply `{"ok": true, "result": ...}` or
`{"ok": false, "error": {"type": "...", "message": "..."}}`. A bad request (not JSON, an
unknown op, a missing argument, an engine error) gets an error reply and the connection
stays open; a line over MAX_LINE closes it. Float vectors travel as `{"f32": base64}` of
little-endian float32, as gRPC sends them: exact, and a fifth the size of decimal text.

The socket is made as the gRPC one (memd.indexing.children.index_server): in a private 0700
folder, mode 0600, a stale file replaced; a peer of another uid is refused
(SO_PEERCRED) on top. `memd.indexing.query.index_client` is memd's side; the index server's
side (running the requests on the engine) is `memd.indexing.children.query_server`.
"""

from __future__ import annotations

import base64
import itertools
import json
import sys
from array import array
from pathlib import Path
from typing import Any

MAX_LINE = 16 * 1024 * 1024  # a request is a query vector and a filter: far below this


class RequestError(Exception):
    """A request the index cannot run; its reply names `type` (the engine's error class)."""

    def __init__(self, message: str, type_: str = "BadRequest") -> None:
        super().__init__(message)
        self.type = type_


def query_socket_path(index_socket: Path) -> Path:
    """The JSON socket beside the gRPC one: `index.sock` -> `index.q.sock` (2 bytes more,
    within the margin `settings.SOCKET_PATH_MAX` leaves)."""
    return index_socket.with_name(f"{index_socket.stem}.q{index_socket.suffix}")


# -- the wire format --------------------------------------------------------------------------


def pack_vector(values: Any) -> dict[str, str]:
    """A float vector as `{"f32": base64}` (little-endian float32, gRPC's precision)."""
    arr = array("f", values)
    if sys.byteorder != "little":
        arr.byteswap()
    return {"f32": base64.b64encode(arr.tobytes()).decode("ascii")}


def unpack_vector(packed: dict[str, str]) -> list[float]:
    arr = array("f")
    try:
        arr.frombytes(base64.b64decode(packed["f32"], validate=True))
    except (TypeError, ValueError) as exc:
        raise RequestError(f"a packed vector must be base64 of float32s: {exc}") from None
    if sys.byteorder != "little":
        arr.byteswap()
    return arr.tolist()


def unpacked(obj: dict[str, Any]) -> Any:
    """`json.loads`' object hook: a packed vector as its list of floats, any other object
    as it is."""
    if len(obj) == 1 and "f32" in obj:
        return unpack_vector(obj)
    return obj


def loads(line: bytes | str) -> Any:
    """Undo `encode` of a JSON line: packed vectors back to lists of floats, anywhere in
    it, in the parser's one pass (walking the parsed reply again, as before, was a tenth
    of memd's CPU time in a recall at 10k chunks: docs/performance.md, "Recall latency,
    round 9"). Raises ValueError for text that is not JSON and RequestError for a packed
    vector that is not one."""
    return json.loads(line, object_hook=unpacked)


def _all_floats(values: list[Any] | tuple[Any, ...]) -> bool:
    """`all(isinstance(v, float) for v in values)`, looped in C: a BM25 search's reply
    holds 20 embeddings of 384 floats, and the generator was a third of the index
    server's time for recall's two searches (profiled at 10k chunks)."""
    return isinstance(values[0], float) and all(map(isinstance, values, itertools.repeat(float)))


# Values JSON writes as they are. A search's reply is ~900 of them (120 hits of 7 fields),
# and each went through every check below: encoding was 9 % of answering recall's two
# searches at 10k chunks (py-spy of the index server on fresh questions; docs/performance.md).
_PLAIN = frozenset({str, int, float, bool, type(None)})


def encode(value: Any) -> Any:
    """Engine values as JSON: numpy arrays and scalars to Python, float vectors packed."""
    if type(value) in _PLAIN:
        return value
    if isinstance(value, dict):
        return {str(k): encode(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        if value and _all_floats(value):
            return pack_vector(value)
        return [encode(v) for v in value]
    dtype = getattr(value, "dtype", None)
    if dtype is not None and getattr(value, "ndim", 0) == 1 and dtype.kind == "f":
        return pack_vector(value.tolist())
    if hasattr(value, "tolist"):  # numpy scalars and other arrays
        return encode(value.tolist())
    if isinstance(value, bytes):
        return base64.b64encode(value).decode("ascii")
    return value
