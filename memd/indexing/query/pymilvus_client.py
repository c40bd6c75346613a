"""Recall's index requests to a Milvus server, over pymilvus (`memd.indexing.query.index_client`
has the contract and the local client, which never imports pymilvus)."""

from __future__ import annotations

import contextlib
import json
import math
import operator
from collections.abc import Iterator, Sequence
from typing import Any

from memd.indexing.query.index_client import (
    IndexRequestError,
    IndexTransportError,
    SearchRequest,
)
from memd.indexing.targets import IndexTarget


@contextlib.contextmanager
def _translated(uri: str) -> Iterator[None]:
    """pymilvus' and gRPC's errors as this module's two."""
    import grpc
    from pymilvus.exceptions import MilvusException

    try:
        yield
    except MilvusException as exc:
        raise IndexRequestError(exc.message) from exc
    except (grpc.RpcError, grpc.FutureTimeoutError, ConnectionError, TimeoutError) as exc:
        raise IndexTransportError(f"{uri}: {exc}") from exc


class PymilvusIndexClient:
    """A Milvus server over pymilvus: the requests recall made before this seam."""

    def __init__(self, target: IndexTarget, timeout: float) -> None:
        from pymilvus import MilvusClient

        self.uri = target.uri
        with _translated(self.uri):
            self._client = MilvusClient(
                uri=target.uri, token=target.token, timeout=timeout, dedicated=True
            )

    def has_collection(self, name: str, *, timeout: float) -> bool:
        with _translated(self.uri):
            return bool(self._client.has_collection(name, timeout=timeout))

    def get_collection_stats(self, name: str, *, timeout: float) -> dict[str, Any]:
        with _translated(self.uri):
            return dict(self._client.get_collection_stats(name, timeout=timeout))

    def get_load_state(self, name: str, *, timeout: float) -> dict[str, Any]:
        with _translated(self.uri):
            state = self._client.get_load_state(name, timeout=timeout)
        return {"state": str(state.get("state", "")).rpartition(".")[2]}

    def load_collection(self, name: str, *, timeout: float) -> None:
        with _translated(self.uri):
            self._client.load_collection(name, timeout=timeout)

    def query(
        self, name: str, *, filter: str, output_fields: list[str], limit: int | None, timeout: float
    ) -> list[dict[str, Any]]:
        extra: dict[str, Any] = {"limit": limit} if limit is not None else {}
        if "count(*)" in output_fields:
            extra["consistency_level"] = "Strong"
        with _translated(self.uri):
            rows = self._client.query(
                collection_name=name,
                filter=filter,
                output_fields=output_fields,
                timeout=timeout,
                **extra,
            )
        return [dict(r) for r in rows]

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
        extra = {"filter": filter} if filter else {}
        with _translated(self.uri):
            res = self._client.search(
                collection_name=name,
                data=[data],
                anns_field=anns_field,
                search_params={"metric_type": metric_type, "params": {}},
                limit=limit,
                output_fields=output_fields,
                timeout=timeout,
                **extra,
            )
        return list(res[0]) if res else []

    def searches(
        self, name: str, requests: Sequence[SearchRequest], *, known: str, timeout: float
    ) -> list[list[dict[str, Any]]]:
        """One search after the other (gRPC has no such batch), nothing left out; a text
        search's hits bring their vectors, for their `cosine`, computed here."""
        dense = next((r for r in requests if not isinstance(r.data, str)), None)
        return [self._answer(name, r, dense, timeout) for r in requests]

    def _answer(
        self, name: str, r: SearchRequest, dense: SearchRequest | None, timeout: float
    ) -> list[dict[str, Any]]:
        if dense is None or isinstance(dense.data, str) or not isinstance(r.data, str):
            return self._search(name, r, [], timeout)
        field, vector = dense.anns_field, dense.data
        added = field not in r.output_fields
        hits = self._search(name, r, [field] if added else [], timeout)
        for hit in hits:
            entity = hit["entity"] = dict(hit["entity"])
            entity["cosine"] = cosine(
                vector, (entity.pop(field) if added else entity.get(field)) or []
            )
        return hits

    def _search(
        self, name: str, r: SearchRequest, extra: list[str], timeout: float
    ) -> list[dict[str, Any]]:
        return self.search(
            name,
            data=r.data,
            anns_field=r.anns_field,
            metric_type=r.metric_type,
            limit=r.limit,
            output_fields=[*r.output_fields, *extra],
            filter=r.filter,
            timeout=timeout,
        )

    def nearest(
        self, name: str, request: SearchRequest, *, known: str, have: Sequence[str], timeout: float
    ) -> tuple[list[dict[str, Any]], dict[str, float]]:
        """The search, then the vectors of the rows in `have` it did not return, read by
        key, for their cosines computed here; nothing left out of the hits."""
        hits = self._search(name, request, [], timeout)
        found = {(h.get("entity") or {}).get(known) for h in hits}
        rest = [key for key in dict.fromkeys(have) if key not in found]
        if not rest or isinstance(request.data, str):
            return hits, {}
        field = request.anns_field
        rows = self.query(
            name,
            filter=f"{known} in {json.dumps(rest)}",
            output_fields=[known, field],
            limit=len(rest),
            timeout=timeout,
        )
        return hits, {str(r[known]): cosine(request.data, r.get(field) or []) for r in rows}

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self._client.close()


def cosine(a: Sequence[float], b: Sequence[float]) -> float:
    """Cosine similarity (vectors from other providers need not be unit length)."""
    dot = sum(map(operator.mul, a, b))  # 3x a generator's speed
    norm = math.sqrt(sum(map(operator.mul, a, a))) * math.sqrt(sum(map(operator.mul, b, b)))
    return dot / norm if norm else 0.0
