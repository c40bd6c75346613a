"""Floods of unfinished lines on memd's socket leave no memory behind (issue 24, item 10).

60 connections each holding 8 MiB with no newline took memd from 149 to 410 MB while held
and 667 MB after they closed: end of stream turned each unfinished line into a message
(append a newline, copy, decode in a thread, answer). Now such a line is dropped unread
and its buffer released, so memd's RSS returns to within 50 MB of where it was.
"""

from __future__ import annotations

import socket
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from tests.support.faults import call, wait_for

CONNS = 30  # x 8 MiB: under limits.max_buffered_mib (256), so every line is held
LINE = 8 * 1024 * 1024
SLACK_MB = 50


def _rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")


def _unfinished(sock: Path) -> socket.socket:
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    conn.connect(str(sock))
    head = b'{"jsonrpc": "2.0", "id": 1, "method": "daemon.status", "params": {"x": "'
    conn.sendall(head + b"a" * (LINE - len(head)))
    return conn


def test_rss_returns_after_unfinished_lines_close(daemon_factory, config_file) -> None:
    memd = daemon_factory(config_file())
    pid, sock = memd.proc.pid, memd.socket
    time.sleep(2)
    start = _rss_mb(pid)
    for _ in range(2):
        with ThreadPoolExecutor(8) as pool:
            conns = list(pool.map(lambda _: _unfinished(sock), range(CONNS)))
        held = wait_for(lambda: _rss_mb(pid) > start + 100 and _rss_mb(pid), 30, what="lines held")
        for conn in conns:
            conn.close()
        wait_for(
            lambda: _rss_mb(pid) <= start + SLACK_MB,
            60,
            0.5,
            what=f"RSS back within {SLACK_MB} MB of {start:.0f} MB (held {held:.0f} MB, "
            f"now {_rss_mb(pid):.0f} MB)",
        )
    assert call(sock, "daemon.status")["state"] == "running"
    assert "rpc.unfinished_line_dropped" in memd.log()
