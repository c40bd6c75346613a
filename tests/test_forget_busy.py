"""Records to a client while `memory.forget` rewrites its files: `busy` at once, never late.

Issue 24 item 3, through a real `memd run`: one long chat (20,000 messages) makes the
erase take seconds. Records sent to the same client on other connections meanwhile must
each be answered (recorded) or refused with `busy` (code -32012, a retry hint in its
data), and a refused one is not written. Before, they waited until the erase had finished
and were then written: a record whose caller had given up (closed its connection) still
landed, and a caller that retries on timeout duplicated it. Here a caller gives up between
two refusals; its record must never appear. The proxy's recorder, refused the same way,
waits the hinted time and records its exchange once, the chat untouched; so does
`memd record`.
"""

from __future__ import annotations

import asyncio
import json
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from memd.cli.client import MemdClient, RemoteError
from memd.proxy.recorder import Recorder, Stats
from memd.proxy.rpc import AsyncMemdClient
from tests.support.daemon import DaemonProcess

pytestmark = pytest.mark.slow

CLIENT = "chatty"
MESSAGES = 20_000
PAYLOAD = "word " * 20


def history(n: int) -> list[dict[str, str]]:
    out = []
    for i in range(n // 2):
        out += [
            {"role": "user", "content": f"{PAYLOAD} question {i}"},
            {"role": "assistant", "content": f"{PAYLOAD} answer {i}"},
        ]
    return out


def chat_params(marker: str) -> dict[str, Any]:
    return {
        "client_id": CLIENT,
        "messages": [{"role": "user", "content": f"Please note {marker} for me."}],
        "response": {"role": "assistant", "content": "Noted."},
    }


def probe(memd: DaemonProcess, marker: str) -> tuple[str, float, dict[str, Any]]:
    """Record one small chat call: ("ok" or the error kind, seconds waited, error data)."""
    started = time.monotonic()
    try:
        with MemdClient(memd.socket, timeout=120) as client:
            client.call("memory.record_chat", chat_params(marker))
    except RemoteError as exc:
        data = exc.data if isinstance(exc.data, dict) else {}
        return str(exc.kind), time.monotonic() - started, {**data, "code": exc.code}
    return "ok", time.monotonic() - started, {}


def give_up(memd: DaemonProcess, marker: str) -> None:
    """Send a record and close the connection at once, as a caller that timed out does."""
    line = {"jsonrpc": "2.0", "id": 1, "method": "memory.record_chat"}
    line["params"] = chat_params(marker)  # type: ignore[assignment]
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.connect(str(memd.socket))
        sock.sendall(json.dumps(line).encode() + b"\n")


def written(root: Path, marker: str) -> bool:
    return any(marker in p.read_text(errors="replace") for p in root.rglob("*.md"))


def proxy_record(memd: DaemonProcess, marker: str, stats: Stats) -> None:
    """What `memd proxy` does after answering a chat: record it in the background."""

    async def run() -> None:
        rpc = AsyncMemdClient(memd.socket)
        recorder = Recorder(rpc, stats)
        params = chat_params(marker)
        recorder.submit(CLIENT, params["messages"], params["response"])
        await recorder.drain(timeout=300)
        await rpc.close()

    asyncio.run(run())


Outcome = tuple[str, str, float, dict[str, Any]]  # marker, "ok" or error kind, s, data


def cli_record(memd: DaemonProcess) -> subprocess.Popen[str]:
    """`memd record CLIENT --chat -`, started (Python's start-up takes seconds on a busy
    machine) and waiting for its chat on stdin: `send_chat` gives it."""
    cmd = [sys.executable, "-m", "memd.cli", "record", CLIENT, "--chat", "-"]
    cmd += ["--config", str(memd.config_path)]
    pipe = subprocess.PIPE
    return subprocess.Popen(cmd, stdin=pipe, stdout=pipe, stderr=pipe, text=True)


def send_chat(proc: subprocess.Popen[str], marker: str) -> None:
    assert proc.stdin is not None
    params = chat_params(marker)
    proc.stdin.write(json.dumps({"messages": params["messages"], "response": params["response"]}))
    proc.stdin.close()


def probe_while(
    memd: DaemonProcess, worker: threading.Thread, stats: Stats, cli: subprocess.Popen[str]
) -> tuple[list[Outcome], list[str], threading.Thread | None]:
    """Record every 50 ms while `worker` (the forget) runs; after a refusal, give up on
    one record and probe again. The outcomes, the records given up on between two
    refusals, and the proxy's recording started at the first refusal (when `cli` is
    given its chat too)."""
    outcomes: list[Outcome] = []
    abandoned: list[str] = []  # given up between two refusals: must never be written
    proxy: threading.Thread | None = None
    n = 0
    while worker.is_alive():
        n += 1
        first = f"PROBE-{n}a"
        kind, took, data = probe(memd, first)
        outcomes.append((first, kind, took, data))
        if kind == "busy" and proxy is None:
            proxy = threading.Thread(target=proxy_record, args=(memd, "PROXIED-1", stats))
            proxy.start()
            send_chat(cli, "CLIRECORD-1")
        if kind == "busy":
            gone = f"GAVEUP-{n}x"
            give_up(memd, gone)
            second = f"PROBE-{n}b"
            kind2, took2, data2 = probe(memd, second)
            outcomes.append((second, kind2, took2, data2))
            if kind2 == "busy":
                abandoned.append(gone)
        time.sleep(0.05)
    return outcomes, abandoned, proxy


def forget_in_thread(
    memd: DaemonProcess, session_id: str, conversation: int
) -> tuple[threading.Thread, dict[str, Any]]:
    """`memory.forget` of one conversation, started in a thread; its result lands in the dict."""
    result: dict[str, Any] = {}
    params = {"client_id": CLIENT, "session_id": session_id, "conversation_id": conversation}

    def run() -> None:
        with memd.client(timeout=600) as client:
            result["forget"] = client.call("memory.forget", params)

    worker = threading.Thread(target=run)
    worker.start()
    return worker, result


def check_outcomes(root: Path, outcomes: list[Outcome], abandoned: list[str]) -> None:
    """Each record answered (and written) or refused with `busy` (and not written); none
    given up on between two refusals written, even later."""
    assert {o[1] for o in outcomes} <= {"ok", "busy"}, outcomes
    for _marker, kind, _took, data in outcomes:
        if kind == "busy":
            assert data["code"] == -32012
            assert data["retry_after"] > 0
    assert abandoned, f"no give-up landed between two refusals: {outcomes}"
    time.sleep(2.0)  # anything still queued would be written by now
    for marker, kind, _took, _data in outcomes:
        assert written(root, marker) == (kind == "ok"), (marker, kind)
    late = [m for m in abandoned if written(root, m)]
    assert late == [], f"records written after their caller gave up: {late}"


def test_records_during_forget_are_answered_or_refused_busy_never_written_late(
    tmp_path: Path, config_file, daemon_factory
) -> None:
    memd = daemon_factory(config_file(clients={CLIENT: {"memory_enabled": True, "mode": "both"}}))
    root = tmp_path / "memory" / CLIENT
    chat = history(MESSAGES)
    with memd.client(timeout=300) as client:
        big = client.call(
            "memory.record_chat",
            {"client_id": CLIENT, "messages": chat[:-1], "response": chat[-1]},
        )

    cli = cli_record(memd)
    try:
        worker, result = forget_in_thread(memd, big["session_id"], big["conversation"])
        stats = Stats()
        outcomes, abandoned, proxy = probe_while(memd, worker, stats, cli)
        worker.join()
        assert proxy is not None, f"no record was refused while the forget ran: {outcomes}"
        proxy.join(300)
        assert cli.stdout is not None and cli.stderr is not None
        out, err = cli.stdout.read(), cli.stderr.read()
        assert cli.wait(300) == 0 and "recorded" in out, (out, err)
        assert result["forget"]["removed"]["exchanges"] == MESSAGES // 2

        check_outcomes(root, outcomes, abandoned)
        assert (stats.recorded, stats.record_failures) == (1, 0), stats
        assert written(root, "PROXIED-1")
        assert written(root, "CLIRECORD-1")
        assert not written(root, "question 9999")  # the long chat itself is gone
    finally:
        if cli.poll() is None:  # a failure before it got its chat
            cli.kill()
            cli.wait()
