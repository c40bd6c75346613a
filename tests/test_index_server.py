"""The per-client index server: a real `python -m memd.indexing.children.index_server` on a
Unix socket.

`start_index_server` is shared with the other index tests; the process helpers (Child,
wait_for) are in tests/support/children.py, the `children` and `short_tmp` fixtures in
conftest.py.
"""

from __future__ import annotations

import signal
import socket
import stat
import sys
from pathlib import Path
from typing import Any

import pytest

from memd.indexing import embedding
from memd.indexing.children import index_ready
from memd.indexing.index_requests import query_socket_path
from memd.indexing.query.index_client import LiteIndexClient
from tests.support.children import Child, wait_for
from tests.support.embedding import embed_one
from tests.support.hostile import needs_hostile, nobody_python


def start_index_server(children: list[Child], data_dir: Path, sock: Path, log_path: Path) -> Child:
    argv = [
        sys.executable,
        "-m",
        "memd.indexing.children.index_server",
        "--data-dir",
        str(data_dir),
        "--socket",
        str(sock),
    ]
    child = Child(argv, log_path)
    children.append(child)
    wait_for(
        lambda: "index_server_ready" in child.output() or child.proc.poll() is not None,
        what="index server start",
    )
    assert child.proc.poll() is None, child.output()
    return child


def _row(i: int, text: str) -> dict[str, Any]:
    return {
        "chunk_hash": f"h{i:04d}",
        "embedding": embed_one(text),
        "content": text,
        "source": "/x/a.md",
        "heading": f"h{i}",
        "heading_level": 2,
        "start_line": i,
        "end_line": i,
    }


def test_serves_a_private_socket_and_flushes_every_write(
    tmp_path: Path, short_tmp: Path, children: list[Child]
) -> None:
    from memsearch.store import MilvusStore

    data, sock = tmp_path / "milvus", short_tmp / "index.sock"
    child = start_index_server(children, data, sock, tmp_path / "server.log")
    assert stat.S_IMODE(sock.stat().st_mode) == 0o600
    assert index_ready(sock)

    store = MilvusStore(
        f"unix:{sock}", collection="c", dimension=embedding.DIMENSION, _create_if_missing=True
    )
    store.upsert([_row(i, t) for i, t in enumerate(["apples and pears", "rust borrow checker"])])
    hits = store.search(embed_one("borrow checker"), query_text="borrow checker")
    assert hits[0]["content"] == "rust borrow checker"
    col = data / "collections" / "c"
    assert list((col / "partitions" / "_default").rglob("data_*.parquet")), "rows not flushed"
    assert not [p for p in (col / "wal").glob("wal_data_*") if p.stat().st_size], "rows in WAL"
    store.delete_by_source("/x/a.md")
    assert store.query() == []
    store.close()
    assert child.pid > 0


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_signal_closes_the_database_and_removes_the_socket(
    tmp_path: Path, short_tmp: Path, children: list[Child], sig: int
) -> None:
    from milvus_lite.db import MilvusLite

    data, sock = tmp_path / "milvus", short_tmp / "index.sock"
    child = start_index_server(children, data, sock, tmp_path / "server.log")
    child.signal(sig)
    assert child.wait() == 0
    assert not sock.exists()
    MilvusLite(str(data)).close()  # the lock is free again


def test_a_second_server_on_the_same_database_fails_without_touching_the_socket(
    tmp_path: Path, short_tmp: Path, children: list[Child]
) -> None:
    data, sock = tmp_path / "milvus", short_tmp / "index.sock"
    start_index_server(children, data, sock, tmp_path / "a.log")
    second = Child(
        [
            sys.executable,
            "-m",
            "memd.indexing.children.index_server",
            "--data-dir",
            str(data),
            "--socket",
            str(sock),
        ],
        tmp_path / "b.log",
    )
    children.append(second)
    assert second.wait() == 1
    assert "index.server_failed" in second.output()
    assert index_ready(sock)


def test_a_stale_socket_is_not_ready_and_gets_replaced(
    tmp_path: Path, short_tmp: Path, children: list[Child]
) -> None:
    sock = short_tmp / "index.sock"
    stale = socket.socket(socket.AF_UNIX)
    stale.bind(str(sock))
    stale.close()  # the file stays, nobody listens: what a kill -9 leaves behind
    assert sock.exists() and not index_ready(sock)
    start_index_server(children, tmp_path / "milvus", sock, tmp_path / "server.log")
    assert index_ready(sock)


def test_rows_survive_kill_9_even_mid_index_write(
    tmp_path: Path, short_tmp: Path, children: list[Child]
) -> None:
    """Milvus Lite writes index sidecars in place; a kill during one leaves a truncated
    file that would make every later load fail. Simulate that and restart."""
    from memsearch.store import MilvusStore

    data, sock = tmp_path / "milvus", short_tmp / "index.sock"
    child = start_index_server(children, data, sock, tmp_path / "a.log")
    store = MilvusStore(
        f"unix:{sock}", collection="c", dimension=embedding.DIMENSION, _create_if_missing=True
    )
    store.upsert([_row(1, "durable row")])
    store.close()
    child.signal(signal.SIGKILL)
    child.wait()
    segments = list(data.glob("collections/c/partitions/_default/data/data_*.parquet"))
    assert segments
    for seg in segments:
        idx = seg.parent.parent / "indexes" / f"{seg.stem}.embedding.flat.idx"
        idx.parent.mkdir(exist_ok=True)
        idx.write_bytes(b"\x93NUMPY")  # a torn write
    start_index_server(children, data, sock, tmp_path / "b.log")
    store = MilvusStore(f"unix:{sock}", collection="c", dimension=embedding.DIMENSION)
    assert [r["content"] for r in store.query()] == ["durable row"]
    store.close()


QUERY_PEER = """
import socket, sys
conn = socket.socket(socket.AF_UNIX)
try:
    conn.connect(sys.argv[1])
except OSError as exc:
    print("denied", exc.errno)
    raise SystemExit
conn.settimeout(20)
try:
    conn.sendall(b'{"op": "query", "collection": "c", "filter": "chunk_hash != \\\\"\\\\"", '
                 b'"output_fields": ["content"]}\\n')
    answer = conn.recv(65536)
    print(answer.decode() if answer else "closed")
except OSError:  # dropped before or while it wrote
    print("closed")
"""


@needs_hostile
def test_another_uid_reads_nothing_from_the_json_socket(
    tmp_path: Path, short_tmp: Path, children: list[Child]
) -> None:
    """recall's JSON socket (index.q.sock: 0600 in a 0700 folder) keeps other local users
    out; one that reaches it anyway (the modes loosened here on purpose) is dropped
    unanswered (SO_PEERCRED), and the server goes on serving its owner."""
    from memsearch.store import MilvusStore

    sock = short_tmp / "index.sock"
    start_index_server(children, tmp_path / "milvus", sock, tmp_path / "server.log")
    store = MilvusStore(
        f"unix:{sock}", collection="c", dimension=embedding.DIMENSION, _create_if_missing=True
    )
    store.upsert([_row(1, "the staging password is hunter2")])
    store.close()
    json_sock = query_socket_path(sock)
    assert nobody_python(QUERY_PEER, str(json_sock)).stdout.startswith("denied")
    short_tmp.chmod(0o755)
    json_sock.chmod(0o777)
    try:
        assert nobody_python(QUERY_PEER, str(json_sock)).stdout.strip() == "closed"
    finally:
        json_sock.chmod(0o600)
        short_tmp.chmod(0o700)
    owner = LiteIndexClient(json_sock)
    try:
        rows = owner.request(
            "query", 20, collection="c", filter='chunk_hash != ""', output_fields=["content"]
        )
    finally:
        owner.close()
    assert [r["content"] for r in rows] == ["the staging password is hunter2"]
