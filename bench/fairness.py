"""How long a small call waits while another client sends a huge record (issue #13, item 6).

One client records big inputs (a 7.5 MiB exchange, a record_chat of many messages) while
another connection polls `clients.list` every 20 ms; the bench prints the slowest poll
during each big call, i.e. how long the event loop was held. Before memd bounded the
work per request by what it keeps, an 8 MiB first message stalled every client for
2-5.8 s (the title loop alone took 3 s).

    .venv/bin/python bench/fairness.py [--mib 7.5] [--messages 150000]
"""

from __future__ import annotations

import argparse
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench._daemon import running_daemon
from memd.cli.client import MemdClient

CLIENTS = {
    "big": {"memory_enabled": True, "mode": "both"},
    "small": {"memory_enabled": True, "mode": "mcp_via_llm"},
}


def _worst_poll(sock: Path, stop: threading.Event, out: list[float]) -> None:
    with MemdClient(sock, timeout=120) as conn:
        while not stop.is_set():
            start = time.perf_counter()
            conn.call("clients.list")
            out.append(time.perf_counter() - start)
            time.sleep(0.02)


def _measure(sock: Path, what: str, method: str, params: dict) -> None:
    stop, polls = threading.Event(), []
    poller = threading.Thread(target=_worst_poll, args=(sock, stop, polls))
    poller.start()
    time.sleep(0.3)
    start = time.perf_counter()
    with MemdClient(sock, timeout=600) as conn:
        conn.call(method, params)
    took = time.perf_counter() - start
    time.sleep(0.3)
    stop.set()
    poller.join()
    print(
        f"{what:<34} call {took:6.2f} s   slowest clients.list {max(polls) * 1000:8.1f} ms"
        f"   ({len(polls)} polls)"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mib", type=float, default=7.5)
    parser.add_argument("--messages", type=int, default=150_000)
    args = parser.parse_args()
    with running_daemon(clients=CLIENTS) as memd:
        sock = memd.socket
        text = "lorem ipsum dolor sit amet " * int(args.mib * 1024 * 1024 / 27)
        _measure(
            sock,
            f"record_exchange of {args.mib:g} MiB",
            "memory.record_exchange",
            {"client_id": "small", "conversation_id": "big", "user": text, "assistant": "ok"},
        )
        chat = [
            {"role": "user" if i % 2 == 0 else "assistant", "content": f"message {i}"}
            for i in range(args.messages)
        ] + [{"role": "user", "content": "last"}]
        _measure(
            sock,
            f"record_chat of {args.messages} messages",
            "memory.record_chat",
            {
                "client_id": "big",
                "messages": chat,
                "response": {"role": "assistant", "content": "done"},
            },
        )


if __name__ == "__main__":
    main()
