"""The index server's side of recall's JSON requests: run each on the engine, answer it.

memd's recall sends eight requests of a client's index (`has_collection`,
`get_collection_stats`, `get_load_state`, `load_collection`, `query`, `search`,
`searches`: several searches in one round trip, and `nearest`: the dense half after the
BM25 half) as JSON
lines on the index server's second socket; `memd.indexing.index_requests` is the wire
format and says why. `QueryServer` serves that socket beside gRPC, in both index server
kinds, each request run directly on the in-process Milvus Lite database, the same calls
the gRPC servicer makes for them.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import struct
import threading
from pathlib import Path
from typing import Any, Protocol

import structlog

from memd.indexing.engine.lite_search import cosines
from memd.indexing.engine.reads import primary_key_field
from memd.indexing.index_requests import MAX_LINE, RequestError, encode, loads, unpack_vector

log = structlog.get_logger()

_TOO_LONG = f"request too long (over {MAX_LINE} bytes)"
# Connections waiting to be accepted. 16 filled under bench/load.py (20 clients' recall
# lanes and watchers on one shared index server, 2 busy cores): connects then failed at
# once (EAGAIN) and the recall with them. The kernel caps it at net.core.somaxconn.
BACKLOG = 256
_LOAD_STATES = {"released": "NotLoad", "loading": "Loading", "loaded": "Loaded"}


# -- running a request on the engine ----------------------------------------------------------


def _text(request: dict[str, Any], key: str, default: str | None = None) -> str:
    value = request.get(key, default)
    if not isinstance(value, str):
        raise RequestError(f"{key!r} must be a string")
    return value


def _int(request: dict[str, Any], key: str, default: int | None = None) -> int | None:
    value = request.get(key, default)
    if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 0):
        raise RequestError(f"{key!r} must be a non-negative integer")
    return value


def _fields(request: dict[str, Any]) -> list[str] | None:
    fields = request.get("output_fields")
    if fields is None:
        return None
    if not isinstance(fields, list) or not all(isinstance(f, str) for f in fields):
        raise RequestError("'output_fields' must be a list of strings")
    return fields


class Requests:
    """Runs one decoded request on the database; the gRPC servicer's reads, minus gRPC."""

    def __init__(self, db: Any) -> None:
        self._db = db

    def run(self, request: Any) -> Any:
        if not isinstance(request, dict):
            raise RequestError("a request must be a JSON object")
        op = request.get("op")
        handler = getattr(self, f"_op_{op}", None) if isinstance(op, str) else None
        if handler is None:
            raise RequestError(f"unknown op {op!r}")
        return handler(request)

    def _collection(self, request: dict[str, Any]) -> Any:
        return self._db.get_collection(_text(request, "collection"))

    def _op_ping(self, request: dict[str, Any]) -> bool:
        return True

    def _op_has_collection(self, request: dict[str, Any]) -> bool:
        return bool(self._db.has_collection(_text(request, "collection")))

    def _op_get_collection_stats(self, request: dict[str, Any]) -> dict[str, Any]:
        return {"row_count": int(self._collection(request).num_entities)}

    def _op_get_load_state(self, request: dict[str, Any]) -> dict[str, str]:
        name = _text(request, "collection")
        if not self._db.has_collection(name):
            return {"state": "NotExist"}
        return {"state": _LOAD_STATES.get(self._db.get_collection(name).load_state, "NotLoad")}

    def _op_load_collection(self, request: dict[str, Any]) -> None:
        self._collection(request).load()

    def _op_query(self, request: dict[str, Any]) -> list[dict[str, Any]]:
        col = self._collection(request)
        expr = _text(request, "filter", "") or None
        fields = _fields(request)
        if fields and "count(*)" in fields:  # as the servicer counts
            count = len(col.query(expr)) if expr else col.num_entities
            return [{"count(*)": int(count)}]
        rows = col.query(expr, output_fields=fields, limit=_int(request, "limit"))
        return list(rows)

    def _op_search(self, request: dict[str, Any]) -> list[dict[str, Any]]:
        """One query (a dense vector, or a text for a BM25 field): its hits, best first,
        each `{"id", "distance", "entity"}` as pymilvus hands them over."""
        col = self._collection(request)
        field = _text(request, "anns_field")
        data = request.get("data")
        if isinstance(data, dict):
            data = unpack_vector(data)
        if not isinstance(data, (str, list)) or not data:
            raise RequestError("'data' must be a text or a packed vector")
        metric = col.resolve_search_metric(field, _text(request, "metric_type"))
        fields = _fields(request)
        results = col.search(
            query_vectors=[data],
            top_k=_int(request, "limit") or 10,
            metric_type=metric,
            expr=_text(request, "filter", "") or None,
            output_fields=fields,
            anns_field=field,
            search_params={},
        )
        hits = list(results[0]) if results else []
        pk = primary_key_field(col)  # the servicer reads it the same way
        if fields and pk in fields:  # the engine keeps the key in "id"; gRPC's reply has it
            for hit in hits:
                hit["entity"] = {**(hit.get("entity") or {}), pk: hit["id"]}
        return hits

    def _op_searches(self, request: dict[str, Any]) -> list[list[dict[str, Any]]]:
        """Several searches of one collection in one request: recall's two halves in one
        round trip instead of two. With `known` (a field every search outputs), a hit
        that an earlier search of the request returned comes back as that field alone:
        the caller has its row from the earlier answer. Recall's BM25 half asks for each
        hit's embedding (384 floats, for its cosine), which a chunk the dense half found
        needs no more."""
        specs = request.get("searches")
        if not isinstance(specs, list) or not specs or not all(isinstance(s, dict) for s in specs):
            raise RequestError("'searches' must be a non-empty list of search requests")
        known = request.get("known")
        if known is not None and not isinstance(known, str):
            raise RequestError("'known' must be a string")
        with_cosines = request.get("cosines", False)
        if not isinstance(with_cosines, bool) or (with_cosines and known is None):
            raise RequestError("'cosines' must be true or false, and true needs 'known'")
        collection = _text(request, "collection")
        seen: set[Any] = set()
        out = []
        for spec in specs:
            hits = self._op_search({**spec, "collection": collection})
            if known is not None:
                hits = [_slim(hit, known) if _key(hit, known) in seen else hit for hit in hits]
                seen.update(_key(hit, known) for hit in hits)
                seen.discard(None)  # a hit without the field is never taken as known
            out.append(hits)
        if with_cosines and known is not None:
            self._add_cosines(collection, specs, out, known)
        return out

    def _add_cosines(
        self, collection: str, specs: list[Any], out: list[list[dict[str, Any]]], known: str
    ) -> None:
        """Give each hit of a text search that came back whole its `cosine` to the first
        vector search's vector (recall's fusion needs it, `lite_search.cosines` says why).
        A row deleted since its search gets none; the caller takes that as 0."""
        dense = next((s for s in specs if isinstance(s.get("data"), list)), None)
        if dense is None:
            return
        whole = [
            hit
            for spec, hits in zip(specs, out, strict=True)
            if isinstance(spec.get("data"), str)
            for hit in hits
            if len(hit.get("entity") or {}) > 1 and _key(hit, known) is not None
        ]
        keys = list(dict.fromkeys(_key(hit, known) for hit in whole))
        if not keys:
            return
        found = self._cosines(collection, dense, keys, known)
        for hit in whole:
            if _key(hit, known) in found:
                hit["entity"]["cosine"] = found[_key(hit, known)]

    def _op_nearest(self, request: dict[str, Any]) -> dict[str, Any]:
        """Recall's dense half after its BM25 half (sent while the query was being
        embedded): `search`'s hits for one vector, a hit whose `known` field is in `have`
        (rows the caller holds from the BM25 half) as that field alone, and the `cosines`
        to the vector of the rows in `have` that are not among the hits; a row deleted
        since gets none (the caller takes that as 0)."""
        spec, known, have = request.get("search"), request.get("known"), request.get("have")
        if not isinstance(spec, dict) or not isinstance(spec.get("data"), list):
            raise RequestError("'search' must be a search request with a packed vector")
        if not isinstance(known, str):
            raise RequestError("'known' must be a string")
        if not isinstance(have, list) or not all(isinstance(k, (str, int)) for k in have):
            raise RequestError("'have' must be a list of keys")
        collection = _text(request, "collection")
        spec = {**spec, "collection": collection}  # `loads` unpacked the vector
        hits = self._op_search(spec)
        held = set(have)
        hits = [_slim(hit, known) if _key(hit, known) in held else hit for hit in hits]
        returned = {_key(hit, known) for hit in hits}
        rest = [key for key in dict.fromkeys(have) if key not in returned]
        found = self._cosines(collection, spec, rest, known) if rest else {}
        return {"hits": hits, "cosines": found}

    def _cosines(
        self, collection: str, dense: dict[str, Any], keys: list[Any], known: str
    ) -> dict[Any, float]:
        """The cosine of `dense`'s (decoded) vector to the rows keyed `keys`."""
        field, vector = _text(dense, "anns_field"), dense["data"]
        found = cosines(self._db.get_collection(collection), field, vector, keys)
        if found is None:  # rows in the memtable: a search over just these rows
            found = self._searched_cosines(collection, field, vector, keys, known)
        return found

    def _searched_cosines(
        self, collection: str, field: str, data: list[float], keys: list[Any], known: str
    ) -> dict[Any, float]:
        hits = self._op_search(
            {
                "collection": collection,
                "anns_field": field,
                "metric_type": "COSINE",
                "data": data,
                "limit": len(keys),
                "output_fields": [known],
                "filter": f"{known} in {json.dumps(keys)}",
            }
        )
        return {_key(hit, known): float(hit["distance"]) for hit in hits}


def _key(hit: dict[str, Any], field: str) -> Any:
    value = (hit.get("entity") or {}).get(field)
    return value if isinstance(value, (str, int)) else None


def _slim(hit: dict[str, Any], field: str) -> dict[str, Any]:
    return {**hit, "entity": {field: hit["entity"][field]}}


# -- the socket -------------------------------------------------------------------------------


def _peer_uid(conn: socket.socket) -> int | None:
    if not hasattr(socket, "SO_PEERCRED"):
        return None  # not Linux: the 0700 folder and 0600 socket are the check
    creds = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    return int(struct.unpack("3i", creds)[1])


def _error(type_: str, message: str) -> dict[str, str]:
    return {"type": type_, "message": message}


class Runner(Protocol):
    """What a line server runs each decoded request on (`Requests`, or the embedder's)."""

    def run(self, request: Any) -> Any: ...


def answer(requests: Runner, line: bytes) -> dict[str, Any]:
    """The reply to one request line; never raises."""
    try:
        request = loads(line)
    except ValueError as exc:
        return {"ok": False, "error": _error("BadRequest", f"not JSON: {exc}")}
    except RequestError as exc:  # a packed vector that is not one
        return {"ok": False, "error": _error(exc.type, str(exc))}
    try:
        return {"ok": True, "result": encode(requests.run(request))}
    except RequestError as exc:
        return {"ok": False, "error": _error(exc.type, str(exc))}
    except Exception as exc:  # the engine's own errors (no such collection, bad filter)
        return {"ok": False, "error": _error(type(exc).__name__, str(exc))}


class QueryServer:
    """The JSON socket of one index server (or of the embedder: its own `requests`);
    `start` after the database is open and the socket's folder checked, `stop` before the
    database closes.

    One thread blocks in accept() and one per connection in recv(): no wake-ups while
    idle (the shared index server runs one per client; see its docstring). stop() shuts
    the listening socket and the connections down, which wakes those threads."""

    def __init__(self, socket_path: Path, db: Any, requests: Runner | None = None) -> None:
        self.socket_path = socket_path
        self._requests: Runner = requests or Requests(db)
        self._listener: socket.socket | None = None
        self._thread: threading.Thread | None = None
        self._open: set[socket.socket] = set()
        self._lock = threading.Lock()

    def start(self) -> None:
        self.socket_path.unlink(missing_ok=True)  # a stale one from a killed server
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            listener.bind(str(self.socket_path))
            os.chmod(self.socket_path, 0o600)
            listener.listen(BACKLOG)
        except OSError:
            listener.close()
            raise
        self._listener = listener
        self._thread = threading.Thread(
            target=self._accept, args=(listener,), name="index-query", daemon=True
        )
        self._thread.start()

    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:
                return  # stop() shut the listener down
            uid = _peer_uid(conn)
            if uid is not None and uid != os.getuid():
                log.warning("index.query_peer_refused", uid=uid)
                conn.close()
                continue
            with self._lock:
                if self._listener is None:
                    conn.close()
                    return
                self._open.add(conn)
            threading.Thread(
                target=self._serve, args=(conn,), name="index-query-conn", daemon=True
            ).start()

    def _serve(self, conn: socket.socket) -> None:
        try:
            with conn, conn.makefile("rb") as reader:
                while line := reader.readline(MAX_LINE + 1):
                    if len(line) > MAX_LINE:
                        _send(conn, {"ok": False, "error": _error("BadRequest", _TOO_LONG)})
                        return
                    _send(conn, answer(self._requests, line))
        except OSError:
            return  # the peer went away, or stop() shut the connection down
        finally:
            with self._lock:
                self._open.discard(conn)

    def stop(self) -> None:
        with self._lock:
            listener, self._listener = self._listener, None
            conns = list(self._open)
        if listener is None:
            return
        for sock in (listener, *conns):
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
        listener.close()
        if self._thread is not None:
            self._thread.join(2.0)
        self.socket_path.unlink(missing_ok=True)


def _send(conn: socket.socket, reply: dict[str, Any]) -> None:
    conn.sendall(json.dumps(reply, separators=(",", ":")).encode() + b"\n")
