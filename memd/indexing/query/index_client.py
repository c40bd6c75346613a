"""The raw index requests recall makes, behind one seam: `IndexClient`.

Two ways to reach a client's index:

- `LiteIndexClient`, for a local index (the default): JSON lines on the index server's
  second socket (memd.indexing.index_requests), run there on its in-process Milvus Lite
  engine. It needs nothing beyond the standard library, so memd never imports pymilvus
  (and its pandas, pyarrow and gRPC: ~90 MB) for recall.
- `PymilvusIndexClient` (`memd.indexing.query.pymilvus_client`), for a Milvus server
  (`[milvus] uri = http://...`): pymilvus, imported only then.

Both raise `IndexRequestError` when the index answers with an error (no such collection,
a bad filter: the caller may check the collection again) and `IndexTransportError` when
it cannot be reached or does not answer in time (the caller drops the client).
"""

from __future__ import annotations

import contextlib
import json
import socket
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from memd.indexing.index_requests import RequestError, loads, pack_vector, query_socket_path
from memd.indexing.targets import IndexTarget

BUSY_RETRY = 0.02  # seconds between connects to a socket whose backlog is full
MAX_IDLE = 4  # connections kept per client: recall's concurrent searches of one client


class IndexRequestError(Exception):
    """The index answered the request with an error."""


class IndexTransportError(ConnectionError):
    """The index could not be reached, or did not answer in time."""


@dataclass(frozen=True)
class SearchRequest:
    """One search of `IndexClient.searches`: the arguments of `IndexClient.search`."""

    data: list[float] | str
    anns_field: str
    metric_type: str
    limit: int
    output_fields: list[str]
    filter: str


class IndexClient(Protocol):
    """What recall asks of one client's index. `timeout` is in seconds."""

    def has_collection(self, name: str, *, timeout: float) -> bool: ...

    def get_collection_stats(self, name: str, *, timeout: float) -> dict[str, Any]: ...

    def get_load_state(self, name: str, *, timeout: float) -> dict[str, Any]: ...

    def load_collection(self, name: str, *, timeout: float) -> None: ...

    def query(
        self, name: str, *, filter: str, output_fields: list[str], limit: int | None, timeout: float
    ) -> list[dict[str, Any]]: ...

    def search(
        self,
        name: str,
        *,
        data: list[float] | str,
        anns_field: str,
        metric_type: str,
        limit: int,
        output_fields: list[str],
        filter: str,
        timeout: float,
    ) -> list[dict[str, Any]]:
        """Hits of one query, best first: `{"id", "distance", "entity"}`."""
        ...

    def searches(
        self, name: str, requests: Sequence[SearchRequest], *, known: str, timeout: float
    ) -> list[list[dict[str, Any]]]:
        """The hits of each request, as `search` answers them; a hit an earlier request
        returned may come back with the `known` field alone in its entity (the caller
        has the rest from that earlier answer). Every other hit of a text (BM25)
        request carries `cosine` in its entity: its cosine similarity to the vector of
        the call's first vector request, if it has one (recall's fusion needs it)."""
        ...

    def nearest(
        self, name: str, request: SearchRequest, *, known: str, have: Sequence[str], timeout: float
    ) -> tuple[list[dict[str, Any]], dict[str, float]]:
        """The hits of one vector `request`, as `search` answers them, a hit whose `known`
        field is in `have` possibly with that field alone (the caller holds its row); and
        the cosine similarity to the request's vector of each row in `have` that is not
        among the hits, by its `known` field (a row deleted since has none). Recall's
        dense half, asked after its BM25 half went while the query was being embedded."""
        ...

    def close(self) -> None: ...


def connect(target: IndexTarget, timeout: float) -> IndexClient:
    """The client for `target`: the JSON socket for a local index, else pymilvus."""
    if target.local and target.uri.startswith("unix:"):
        return LiteIndexClient(query_socket_path(Path(target.uri.removeprefix("unix:"))))
    from memd.indexing.query.pymilvus_client import PymilvusIndexClient

    return PymilvusIndexClient(target, timeout)


# -- local: JSON lines to the index server ----------------------------------------------------


class _Conn:
    """One connection to the JSON socket and its reader.

    A Unix socket whose listen backlog is full refuses a connect made with a timeout at
    once (EAGAIN, `BlockingIOError`): the server is busy accepting, not gone. Under
    bench/load.py (20 clients, 2 cores) that was most of the recalls that failed as
    `index_unavailable`; the connect is tried again every BUSY_RETRY seconds until
    `timeout`."""

    def __init__(self, path: Path, timeout: float) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        give_up = time.monotonic() + timeout
        try:
            while True:
                self.sock.settimeout(max(give_up - time.monotonic(), 0.001))
                try:
                    self.sock.connect(str(path))
                    break
                except BlockingIOError:
                    if time.monotonic() + BUSY_RETRY >= give_up:
                        raise
                    time.sleep(BUSY_RETRY)
        except OSError:
            self.sock.close()
            raise
        self.reader = self.sock.makefile("rb")

    def exchange(self, message: bytes, timeout: float) -> bytes:
        self.sock.settimeout(timeout)
        self.sock.sendall(message)
        return bytes(self.reader.readline())

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.reader.close()
            self.sock.close()


class LiteIndexClient:
    """Connections to the index server's JSON socket, kept for reuse; one request at a
    time on each, so concurrent recalls of one client each get their own (as gRPC
    multiplexed them on one channel; the server runs each connection in a thread)."""

    def __init__(self, socket_path: Path, keep: int = MAX_IDLE) -> None:
        self.socket_path = socket_path
        self._keep = keep
        self._idle: list[_Conn] = []
        self._lock = threading.Lock()

    def request(self, op: str, timeout: float, **args: Any) -> Any:
        """Send one request and return its decoded result.

        Every request is a read (or an idempotent load), so one failing on a kept
        connection (the index server restarted since) is sent again on a new one."""
        message = json.dumps({"op": op, **args}, separators=(",", ":")).encode() + b"\n"
        line = b""
        for attempt in (1, 2):
            conn, reused = self._take(timeout)
            try:
                line = conn.exchange(message, timeout)
            except TimeoutError as exc:
                conn.close()
                raise IndexTransportError(f"{self.socket_path}: no answer in time") from exc
            except OSError as exc:
                conn.close()
                if reused and attempt == 1:
                    self.close()  # the others went stale with it
                    continue
                raise IndexTransportError(f"{self.socket_path}: {exc}") from exc
            if line:
                self._give_back(conn)
                break
            conn.close()
            self.close()
            if not (reused and attempt == 1):
                raise IndexTransportError(f"{self.socket_path}: the index server hung up")
        try:
            reply = loads(line)
        except (ValueError, RequestError) as exc:  # RequestError: a packed vector that is not
            raise IndexTransportError(f"{self.socket_path}: bad reply: {exc}") from exc
        if not reply.get("ok"):
            error = reply.get("error") or {}
            raise IndexRequestError(f"{error.get('type')}: {error.get('message')}")
        return reply.get("result")

    def _take(self, timeout: float) -> tuple[_Conn, bool]:
        """An idle connection (True: reused) or a new one; OSError if none can be made."""
        with self._lock:
            if self._idle:
                return self._idle.pop(), True
        try:
            return _Conn(self.socket_path, timeout), False
        except OSError as exc:
            raise IndexTransportError(f"{self.socket_path}: {exc}") from exc

    def _give_back(self, conn: _Conn) -> None:
        with self._lock:
            if len(self._idle) < self._keep:
                self._idle.append(conn)
                return
        conn.close()

    def has_collection(self, name: str, *, timeout: float) -> bool:
        return bool(self.request("has_collection", timeout, collection=name))

    def get_collection_stats(self, name: str, *, timeout: float) -> dict[str, Any]:
        return dict(self.request("get_collection_stats", timeout, collection=name))

    def get_load_state(self, name: str, *, timeout: float) -> dict[str, Any]:
        return dict(self.request("get_load_state", timeout, collection=name))

    def load_collection(self, name: str, *, timeout: float) -> None:
        self.request("load_collection", timeout, collection=name)

    def query(
        self, name: str, *, filter: str, output_fields: list[str], limit: int | None, timeout: float
    ) -> list[dict[str, Any]]:
        args = {"filter": filter, "output_fields": output_fields, "limit": limit}
        return list(self.request("query", timeout, collection=name, **args))

    def search(
        self,
        name: str,
        *,
        data: list[float] | str,
        anns_field: str,
        metric_type: str,
        limit: int,
        output_fields: list[str],
        filter: str,
        timeout: float,
    ) -> list[dict[str, Any]]:
        return list(
            self.request(
                "search",
                timeout,
                collection=name,
                data=data if isinstance(data, str) else pack_vector(data),
                anns_field=anns_field,
                metric_type=metric_type,
                limit=limit,
                output_fields=output_fields,
                filter=filter,
            )
        )

    def searches(
        self, name: str, requests: Sequence[SearchRequest], *, known: str, timeout: float
    ) -> list[list[dict[str, Any]]]:
        """All in one round trip; the index server leaves out what an earlier request of
        the same call returned already (memd.indexing.children.query_server)."""
        wire = [_wire(r) for r in requests]
        answer = self.request(
            "searches", timeout, collection=name, searches=wire, known=known, cosines=True
        )
        return [list(hits) for hits in answer]

    def nearest(
        self, name: str, request: SearchRequest, *, known: str, have: Sequence[str], timeout: float
    ) -> tuple[list[dict[str, Any]], dict[str, float]]:
        """One round trip; the index server computes the cosines from the unit vectors
        it keeps for its dense searches (memd.indexing.children.query_server)."""
        args = {"search": _wire(request), "known": known, "have": list(have)}
        answer = self.request("nearest", timeout, collection=name, **args)
        return list(answer["hits"]), {str(k): float(v) for k, v in answer["cosines"].items()}

    def close(self) -> None:
        with self._lock:
            idle, self._idle = self._idle, []
        for conn in idle:
            conn.close()


def _wire(r: SearchRequest) -> dict[str, Any]:
    """One search as the index server reads it: a vector packed, a text as it is."""
    return {
        "data": r.data if isinstance(r.data, str) else pack_vector(r.data),
        "anns_field": r.anns_field,
        "metric_type": r.metric_type,
        "limit": r.limit,
        "output_fields": r.output_fields,
        "filter": r.filter,
    }
