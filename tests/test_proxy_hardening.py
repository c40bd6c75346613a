"""The proxy's port against other local users: keys, idle connections, descriptors.

Issue 24: a non-ASCII key gave a 500 (item 8); 1,100 idle connections from another user
took every descriptor memd had, so `memd record` timed out, supervision failed and the
log grew by 90 MB (item 7); `memd proxy` beside a `memd run` that serves the proxy said
only "address already in use" (item 13). A proxy that could not listen kept saying
"failed" after a config edit turned it off (the browser's hook forgot the error; the
proxy's did not). Attacker steps run as uid 65534 where the tests run as root
(tests/support/hostile.py).
"""

from __future__ import annotations

import os
import resource
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from memd.cli.client import MemdClient
from tests.support.daemon import REPO, DaemonProcess, base_config, write_config
from tests.support.hostile import needs_hostile

CLIENTS = {"alice": {"memory_enabled": True, "mode": "both", "inject_recall": False}}
FLOOD = 1100
SOFT = 1024  # what most shells give memd; the hard limit is left as it is


class Proxy:
    def __init__(self, proc: DaemonProcess) -> None:
        self.proc = proc
        status = self.call("daemon.status")["proxy"]
        self.url: str = status["url"]
        self.port = int(self.url.rsplit(":", 1)[1].split("/")[0])
        self.key = self.cli("proxy", "key", "alice").stdout.strip()

    def call(self, method: str, params: dict[str, Any] | None = None, timeout: float = 30) -> Any:
        with MemdClient(self.proc.socket, timeout=timeout) as client:
            return client.call(method, params)

    def cli(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "memd.cli", *args, "--config", str(self.proc.config_path)],
            capture_output=True,
            text=True,
            env=self.proc.env,
            cwd=str(REPO),
            timeout=60,
            check=check,
        )

    def raw(self, request: bytes) -> bytes:
        """One raw HTTP exchange (for what an HTTP library refuses to send)."""
        with socket.create_connection(("127.0.0.1", self.port), timeout=30) as conn:
            conn.sendall(request)
            data = b""
            while chunk := conn.recv(65536):
                data += chunk
            return data


@pytest.fixture(scope="module")
def proxy(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Proxy]:
    tmp = tmp_path_factory.mktemp("proxy-hardening")
    config = base_config(
        tmp,
        clients=CLIENTS,
        proxy={"listen": "127.0.0.1:0", "upstream_base_url": "http://127.0.0.1:9/v1"},
    )
    proc = DaemonProcess(write_config(tmp / "config.toml", config))
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(SOFT, hard), hard))  # memd inherits it
    try:
        proc.start()
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    try:
        yield Proxy(proc)
    finally:
        proc.stop()


# --- item 8: any malformed key is a 401 ---------------------------------------------------


@pytest.mark.parametrize(
    "token",
    [
        "sk-memd~alice~s\xe9cr\xe8t".encode(),  # UTF-8
        "sk-memd~alice~s\xe9cr\xe8t".encode("latin-1"),  # not UTF-8 at all
        b"sk-memd~alice~\xff\xfex",
        "sk-memd~\u0430lice~abc".encode(),  # a Cyrillic a in the client id
    ],
)
def test_a_non_ascii_key_is_a_401(proxy: Proxy, token: bytes) -> None:
    body = b'{"model": "m", "messages": []}'
    answer = proxy.raw(
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n"
        b"Content-Type: application/json\r\nAuthorization: Bearer " + token + b"\r\n"
        b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body
    )
    status = answer.split(b"\r\n", 1)[0]
    assert b" 401 " in status, answer[:400]
    assert b"invalid_api_key" in answer


# --- item 7: idle connections and descriptors -----------------------------------------------


def test_a_connection_that_sends_no_request_is_closed(proxy: Proxy) -> None:
    """Nothing sent, or a request head that never ends: closed within the head's deadline."""
    from memd.proxy.listener import HEADER_TIMEOUT

    idle = socket.create_connection(("127.0.0.1", proxy.port))
    slow = socket.create_connection(("127.0.0.1", proxy.port))
    slow.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n")
    try:
        for conn in (idle, slow):
            conn.settimeout(HEADER_TIMEOUT + 30)
            start = time.monotonic()
            try:
                while conn.recv(4096):
                    pass
            except TimeoutError:
                pytest.fail("the proxy held a connection without a request head")
            assert time.monotonic() - start < HEADER_TIMEOUT + 30
    finally:
        idle.close()
        slow.close()


FLOOD_CODE = """
import socket, sys, time
port, n = int(sys.argv[1]), int(sys.argv[2])
conns = []
for _ in range(n):
    try:
        conns.append(socket.create_connection(("127.0.0.1", port), timeout=5))
    except OSError:
        pass
print(len(conns), flush=True)
sys.stdin.read()
"""


def _open_files(pid: int) -> tuple[int, int]:
    for line in Path(f"/proc/{pid}/limits").read_text().splitlines():
        if line.startswith("Max open files"):
            soft, hard = line.split()[3:5]
            return int(soft), int(hard)
    raise AssertionError("no open-file limit in /proc")


@needs_hostile
def test_idle_connections_from_another_user_leave_memd_answering(proxy: Proxy) -> None:
    """1,100 idle connections from uid 65534 to the proxy's port, memd started with a soft
    limit of 1,024: memd raised its limit to the hard one, the proxy holds at most its
    cap, a record and the status answer at once, and memd's log stays small."""
    assert proxy.proc.proc is not None
    pid = proxy.proc.proc.pid
    soft, hard = _open_files(pid)
    assert soft == hard, f"memd kept a soft open-file limit of {soft} (hard {hard})"
    cap = proxy.call("daemon.status")["proxy"]["max_connections"]
    log_before = proxy.proc.log_path.stat().st_size
    flood = subprocess.Popen(
        [
            "setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "--",
            sys.executable, "-I", "-S", "-c", FLOOD_CODE, str(proxy.port), str(FLOOD),
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )  # fmt: skip
    try:
        assert flood.stdout is not None
        assert int(flood.stdout.readline()) > SOFT
        time.sleep(2)  # let memd accept what it will
        held = len(os.listdir(f"/proc/{pid}/fd"))
        assert held < cap + 200, f"memd holds {held} descriptors (cap {cap})"
        start = time.monotonic()
        params = {"client_id": "alice", "conversation_id": "c", "user": "hi", "assistant": "ok"}
        proxy.call("memory.record_exchange", params, timeout=10)
        status = proxy.call("daemon.status", timeout=10)
        assert time.monotonic() - start < 10
        assert status["proxy"]["refused_connections"] > 0
        assert all(
            (c.get("state") or "RUNNING") != "FATAL"
            for client in status["clients"].values()
            for c in client.values()
            if isinstance(c, dict)
        ), status["clients"]
    finally:
        if flood.stdin is not None:
            flood.stdin.close()
        flood.wait(30)
    grown = proxy.proc.log_path.stat().st_size - log_before
    assert grown < 100_000, f"memd's log grew {grown} bytes:\n{proxy.proc.log()[-2000:]}"


# --- item 13: a second proxy beside memd run's ---------------------------------------------


def test_memd_proxy_beside_memd_run_says_memd_serves_it(proxy: Proxy, tmp_path: Path) -> None:
    """`memd proxy` on the address `memd run` already serves: says so and how to go on."""
    import tomllib

    data = tomllib.loads(proxy.proc.config_path.read_text())
    data["proxy"]["listen"] = f"127.0.0.1:{proxy.port}"
    path = write_config(proxy.proc.config_path.with_name("second.toml"), data)
    done = subprocess.run(
        [sys.executable, "-m", "memd.cli", "proxy", "--config", str(path)],
        capture_output=True,
        text=True,
        env=proxy.proc.env,
        cwd=str(REPO),
        timeout=60,
    )
    assert done.returncode != 0
    assert "memd run" in done.stderr and proxy.url in done.stderr, done.stderr
    assert "Traceback" not in done.stderr


# --- a proxy that could not listen, then turned off or fixed by a config edit ---------------


def test_a_failed_listen_is_forgotten_when_the_proxy_is_turned_off_or_fixed(
    config_file: Callable[..., Path], daemon_factory: Callable[..., DaemonProcess]
) -> None:
    """The browser's hook cleared its old error on a reload; the proxy's kept "failed"."""
    upstream = "http://127.0.0.1:9/v1"
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        memd = daemon_factory(
            config_file(
                clients=CLIENTS,
                proxy={"listen": f"127.0.0.1:{port}", "upstream_base_url": upstream},
            )
        )
        failed = memd.call("daemon.status")["proxy"]
        assert failed["state"] == "failed" and f"127.0.0.1:{port}" in failed["error"], failed
        assert "proxy    failed" in _memd_status(memd)

        config_file(clients=CLIENTS)  # no upstream: the proxy is off
        _until(lambda: memd.call("daemon.status").get("proxy") is None, memd)
        assert "proxy" not in _memd_status(memd)

    config_file(clients=CLIENTS, proxy={"listen": "127.0.0.1:0", "upstream_base_url": upstream})
    _until(lambda: (memd.call("daemon.status").get("proxy") or {}).get("state") == "running", memd)
    assert "error" not in memd.call("daemon.status")["proxy"]


def _memd_status(memd: DaemonProcess) -> str:
    shown = subprocess.run(
        [sys.executable, "-m", "memd.cli", "status", "--config", str(memd.config_path)],
        capture_output=True,
        text=True,
        env=memd.env,
        cwd=str(REPO),
        timeout=60,
    )
    return shown.stdout


def _until(predicate: Callable[[], bool], memd: DaemonProcess, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, memd.log()[-3000:]
        time.sleep(0.2)
