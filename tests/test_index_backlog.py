"""A busy index server's socket: a connect that finds the listen backlog full waits for
room instead of failing (memd.indexing.query.index_client._Conn).

Under bench/load.py (20 clients on one shared index server, 2 busy cores) the server's
backlog of 16 filled, connects made with a timeout failed at once with EAGAIN, and most
of the recalls that failed as `index_unavailable` failed so. A real listening socket
here, whose owner accepts late.
"""

from __future__ import annotations

import socket
import threading
import time
from pathlib import Path

from memd.indexing.query.index_client import LiteIndexClient


def _fill(path: Path) -> list[socket.socket]:
    """Connections nobody accepts, until the backlog refuses one."""
    fillers = []
    while True:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.setblocking(False)
        try:
            sock.connect(str(path))
        except BlockingIOError:
            sock.close()
            return fillers
        fillers.append(sock)


def _answer_late(listener: socket.socket, fillers: list[socket.socket]) -> None:
    """After a while: let the fillers go, then answer each request with `true`."""
    time.sleep(0.3)
    for sock in fillers:
        sock.close()
    while True:
        try:
            conn, _ = listener.accept()
        except OSError:
            return
        with conn, conn.makefile("rb") as reader:
            if reader.readline():
                conn.sendall(b'{"ok": true, "result": true}\n')
                return


def test_a_connect_to_a_full_backlog_waits_for_room(short_tmp: Path) -> None:
    path = short_tmp / "busy.sock"
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(path))
    listener.listen(1)
    fillers = _fill(path)
    assert fillers  # the backlog is full now
    server = threading.Thread(target=_answer_late, args=(listener, fillers), daemon=True)
    server.start()
    client = LiteIndexClient(path)
    try:
        assert client.request("ping", 10.0) is True
    finally:
        client.close()
        listener.close()
        server.join(5)
