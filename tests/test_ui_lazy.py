"""The memory browser's port is taken at start and the browser loads at first use.

aiohttp and Jinja2 cost memd ~14 MB while nobody has the browser open (docs/ui.md), so
`memd run` listens at once and loads them at the first connection. Connections that
arrive while it loads must be served as if it had always been there.
"""

from __future__ import annotations

import json
import socket
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.support.daemon import DaemonProcess
from tests.support.ui import Browser, login_link, ui_settings, ui_status

pytestmark = pytest.mark.slow


def maps_aiohttp(memd: DaemonProcess) -> bool:
    """Whether memd's process has mapped any of aiohttp's compiled modules."""
    assert memd.proc is not None
    with open(f"/proc/{memd.proc.pid}/maps") as maps:
        return any("site-packages/aiohttp/" in line for line in maps)


def raw_get(netloc: str, path: str) -> socket.socket:
    """A connection that has sent a whole request and not read its answer yet."""
    host, port = netloc.rsplit(":", 1)
    conn = socket.create_connection((host, int(port)), timeout=60)
    conn.sendall(f"GET {path} HTTP/1.1\r\nHost: {netloc}\r\nConnection: close\r\n\r\n".encode())
    return conn


def answer(conn: socket.socket) -> bytes:
    """Everything the server sent until it closed the connection (a reset counts as closed)."""
    chunks = []
    try:
        while chunk := conn.recv(65536):
            chunks.append(chunk)
    except ConnectionResetError:
        pass
    conn.close()
    return b"".join(chunks)


def test_the_browser_loads_at_its_first_connection_and_serves_those_that_waited(
    config_file: Callable[..., Path], daemon_factory: Callable[..., DaemonProcess]
) -> None:
    memd = daemon_factory(config_file(**ui_settings()))
    ui = ui_status(memd)
    assert ui["state"] == "running" and ui["loaded"] is False
    assert not maps_aiohttp(memd)
    netloc = ui["url"].removeprefix("http://").rstrip("/")
    # Three requests sent before the browser is there: each gets the browser's answer.
    waiting = [raw_get(netloc, "/login") for _ in range(3)]
    replies = [answer(conn) for conn in waiting]
    for reply in replies:
        assert reply.startswith(b"HTTP/1.1 401"), reply[:200]
        assert b"memd ui" in reply
    ui = ui_status(memd)
    assert ui["loaded"] is True and ui["url"] == f"http://{netloc}/"
    lines = [line for line in memd.log().splitlines() if '"event": "ui.loaded"' in line]
    [loaded] = [json.loads(line) for line in lines]  # log() is the tail: parse only these
    assert loaded["waited"] >= 1  # the first one at least was accepted before the load
    assert maps_aiohttp(memd)
    # From then on it is the browser as always: a login link works.
    browser = Browser(ui["url"].rstrip("/"))
    assert browser.login(login_link(memd)).status == 303
    assert browser.get("/").status == 200


def test_a_login_link_works_before_anything_loaded_the_browser(
    config_file: Callable[..., Path], daemon_factory: Callable[..., DaemonProcess]
) -> None:
    memd = daemon_factory(config_file(**ui_settings()))
    link = login_link(memd)  # `memd ui` needs only the address and the token folder
    assert ui_status(memd)["loaded"] is False
    browser = Browser(ui_status(memd)["url"].rstrip("/"))
    assert browser.login(link).status == 303
    assert browser.get("/").status == 200


def test_connections_that_waited_for_the_browser_are_guarded_like_any(
    config_file: Callable[..., Path], daemon_factory: Callable[..., DaemonProcess]
) -> None:
    memd = daemon_factory(config_file(**ui_settings(max_connections=4, header_timeout_seconds=1.0)))
    netloc = ui_status(memd)["url"].removeprefix("http://").rstrip("/")
    host, port = netloc.rsplit(":", 1)
    # Before anything loaded the browser: a request naming another Host (kept alive), three
    # connections that send nothing, and one more than the cap of four.
    foreign = socket.create_connection((host, int(port)), timeout=30)
    foreign.sendall(f"GET / HTTP/1.1\r\nHost: evil.example:{port}\r\n\r\n".encode())
    idle = [socket.create_connection((host, int(port)), timeout=30) for _ in range(3)]
    extra = socket.create_connection((host, int(port)), timeout=30)
    try:
        assert answer(extra) == b""  # over the cap: closed, nothing served
        assert answer(foreign).startswith(b"HTTP/1.1 421")  # refused, then cut when idle
        for conn in idle:
            assert answer(conn) == b""  # cut by the header timeout, not left open
    finally:
        for conn in [foreign, *idle, extra]:
            conn.close()
    ui = ui_status(memd)
    assert ui["loaded"] is True and ui["refused"] >= 1 and ui["timed_out"] >= 4
