"""Idle connections to the proxy's port against memd's file descriptors (issue 24, item 7).

Starts a real `memd run` with the proxy on and a soft open-file limit of 1,024 (what
most shells give), then another process (uid 65534 when run as root) opens `--conns`
idle TCP connections to the proxy's port and holds them. Meanwhile it measures what a
user sees: how long `memd record` (memory.record_exchange over the socket) and
`daemon.status` take, how many descriptors memd holds, how much memd logged, and how
many of the idle connections memd still holds after `--hold` seconds.

    .venv/bin/python bench/fd_flood.py [--conns 1100] [--hold 25]
"""

from __future__ import annotations

import argparse
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench._daemon import running_daemon
from memd.cli.client import ClientError, MemdClient

FLOOD = """
import socket, sys, time
port, n, hold = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3])
conns = []
for _ in range(n):
    try:
        conns.append(socket.create_connection(("127.0.0.1", port), timeout=5))
    except OSError:
        pass
print("opened", len(conns), flush=True)
time.sleep(hold)
open_ = 0
for c in conns:
    c.setblocking(False)
    try:
        open_ += c.recv(1) != b""
    except BlockingIOError:
        open_ += 1
    except OSError:
        pass
print("still_open", open_, flush=True)
"""


def flood(port: int, conns: int, hold: float) -> subprocess.Popen[str]:
    argv = [sys.executable, "-I", "-S", "-c", FLOOD, str(port), str(conns), str(hold)]
    if os.geteuid() == 0:
        argv = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "--", *argv]
    return subprocess.Popen(argv, stdout=subprocess.PIPE, text=True)


def timed(sock: Path, method: str, params: dict | None = None) -> str:
    start = time.perf_counter()
    try:
        with MemdClient(sock, timeout=30) as client:
            client.call(method, params)
        return f"{(time.perf_counter() - start) * 1000:.0f} ms"
    except ClientError as exc:
        return f"failed after {time.perf_counter() - start:.1f} s ({exc})"


def fds(pid: int) -> int:
    try:
        return len(os.listdir(f"/proc/{pid}/fd"))
    except OSError:
        return -1


def soft_limit(pid: int) -> str:
    for line in Path(f"/proc/{pid}/limits").read_text().splitlines():
        if line.startswith("Max open files"):
            return " ".join(line.split()[3:5])
    return "?"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--conns", type=int, default=1100)
    parser.add_argument("--hold", type=float, default=25.0)
    args = parser.parse_args()
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    resource.setrlimit(resource.RLIMIT_NOFILE, (1024, hard))  # memd inherits this
    clients = {"alice": {"memory_enabled": True, "mode": "mcp_via_llm"}}
    proxy = {"listen": "127.0.0.1:0", "upstream_base_url": "http://127.0.0.1:9/v1"}
    with running_daemon(clients=clients, proxy=proxy) as memd:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))  # the flood needs many
        assert memd.proc is not None
        pid, sock = memd.proc.pid, memd.socket
        with MemdClient(sock, timeout=30) as client:
            url = client.call("daemon.status")["proxy"]["url"]
        port = int(url.rsplit(":", 1)[1].split("/")[0])
        record = {"client_id": "alice", "conversation_id": "c", "user": "hi", "assistant": "ok"}
        print(f"memd soft/hard open files: {soft_limit(pid)}; fds before: {fds(pid)}")
        print(f"record before the flood: {timed(sock, 'memory.record_exchange', record)}")
        log_before = memd.log_path.stat().st_size
        proc = flood(port, args.conns, args.hold)
        assert proc.stdout is not None
        print(f"flood: {proc.stdout.readline().strip()} of {args.conns} idle connections")
        time.sleep(2)
        print(f"memd fds during the flood: {fds(pid)}")
        print(f"record during the flood: {timed(sock, 'memory.record_exchange', record)}")
        print(f"daemon.status during the flood: {timed(sock, 'daemon.status')}")
        print(f"flood after {args.hold:g} s: {proc.stdout.readline().strip()}")
        proc.wait(60)
        time.sleep(1)
        grown = memd.log_path.stat().st_size - log_before
        text = memd.log_path.read_text(errors="replace")
        print(f"memd log grew {grown / 1e6:.2f} MB during the flood")
        print(f"'Too many open files' in memd's log: {text.count('Too many open files')}")
        print(f"record after the flood: {timed(sock, 'memory.record_exchange', record)}")
        print(f"memd fds after the flood: {fds(pid)}")


if __name__ == "__main__":
    main()
