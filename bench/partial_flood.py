"""memd's RSS under floods of unfinished lines on its socket (issue 24, item 10).

Starts a real `memd run`, then `--rounds` times: `--conns` connections each send
`--mib` MiB with no newline and hold it, then all close. Prints memd's RSS before,
while held, right after the close and `--settle` seconds later (the heap trim runs every
60 s). Goal: back within 50 MB of the start within 60 s of the close.

    .venv/bin/python bench/partial_flood.py [--conns 60] [--mib 8] [--rounds 3]
"""

from __future__ import annotations

import argparse
import contextlib
import socket
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench._daemon import running_daemon


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return -1.0


def send_partial(sock: Path, size: int) -> socket.socket:
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    conn.connect(str(sock))
    chunk = b'{"jsonrpc": "2.0", "id": 1, "method": "daemon.status", "params": {"x": "'
    chunk += b"a" * (size - len(chunk))
    with contextlib.suppress(OSError):  # refused past the server-wide bound: closed by memd
        conn.sendall(chunk)
    return conn


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--conns", type=int, default=60)
    parser.add_argument("--mib", type=float, default=8.0)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--settle", type=float, default=60.0)
    args = parser.parse_args()
    size = int(args.mib * 1024 * 1024) - 16
    with running_daemon() as memd:
        assert memd.proc is not None
        pid, sock = memd.proc.pid, memd.socket
        time.sleep(3)
        start = rss_mb(pid)
        print(f"RSS at start: {start:.0f} MB")
        for round_ in range(1, args.rounds + 1):
            with ThreadPoolExecutor(16) as pool:
                conns = list(pool.map(lambda _: send_partial(sock, size), range(args.conns)))
            time.sleep(2)
            held = rss_mb(pid)
            for conn in conns:
                conn.close()
            time.sleep(2)
            closed = rss_mb(pid)
            time.sleep(args.settle)
            settled = rss_mb(pid)
            print(
                f"round {round_}: held {held:.0f} MB, 2 s after close {closed:.0f} MB, "
                f"{args.settle:g} s later {settled:.0f} MB (start {start:.0f} MB, "
                f"{settled - start:+.0f} MB)"
            )


if __name__ == "__main__":
    main()
