"""Who gets into the memory browser, over real HTTP to a real `memd run` (docs/ui.md).

Login is a single-use token file only memd's uid can read; then an HttpOnly,
SameSite=Strict cookie; a CSRF token on every POST; the Host header must be the UI's
own; every answer carries a strict CSP; the listener caps connections and cuts those
that send no request. Off means no port; a taken port leaves memd running.
"""

from __future__ import annotations

import os
import shutil
import socket
import stat
import subprocess
import sys
import time
import urllib.parse
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from memd.config import ConfigError, parse_config
from memd.ui.tokens import LoginTokens, TokenError
from tests.support.daemon import DaemonProcess
from tests.support.ui import CLIENT, Browser, csrf_of, login_link, record, ui_settings, ui_status

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def shared(module_daemon: Callable[..., tuple[DaemonProcess, Path]]) -> Iterator[DaemonProcess]:
    memd, _tmp = module_daemon(**ui_settings(max_connections=4, header_timeout_seconds=1.0))
    record(memd, "c1", "My bike lock code is 4811.", "Noted: 4811.")
    yield memd


def browser(memd: DaemonProcess) -> Browser:
    return Browser(ui_status(memd)["url"].rstrip("/"))


def logged_in(memd: DaemonProcess) -> Browser:
    b = browser(memd)
    assert b.login(login_link(memd)).status == 303
    return b


def test_without_a_cookie_every_page_sends_you_to_a_page_that_explains_memd_ui(
    shared: DaemonProcess,
) -> None:
    b = browser(shared)
    for path in ("/", f"/c/{CLIENT}", f"/c/{CLIENT}/search?q=bike", f"/c/{CLIENT}/export"):
        reply = b.get(path)
        assert (reply.status, reply.headers["location"]) == (303, "/login"), path
        assert "4811" not in reply.body
    page = b.get("/login")
    assert page.status == 401 and "memd ui" in page.body and "not logged in" in page.body
    forged = b.get("/", headers={"Cookie": "memd_ui=made-up"})
    assert forged.status == 303


def test_a_login_token_works_once_and_a_wrong_one_never(shared: DaemonProcess) -> None:
    link = login_link(shared)
    b = browser(shared)
    reply = b.login(link)
    assert (reply.status, reply.headers["location"]) == (303, "/")
    cookie = reply.headers["set-cookie"]
    assert "HttpOnly" in cookie and "SameSite=Strict" in cookie and "Path=/" in cookie
    overview = b.get("/")
    assert overview.status == 200 and CLIENT in overview.body
    again = browser(shared)
    reused = again.login(link)
    assert reused.status == 401 and "used already" in reused.body and not again.cookies
    token = urllib.parse.parse_qs(urllib.parse.urlsplit(link).query)["token"][0]
    wrong = token[:-4] + ("aaaa" if not token.endswith("aaaa") else "bbbb")
    for bad in (wrong, "", "nonsense", "é" * 40, f"{token}x"):
        assert browser(shared).get(f"/login?token={urllib.parse.quote(bad)}").status == 401
    pasted = browser(shared)
    form = pasted.post("/login", {"token": login_link(shared).split("token=")[1]})
    assert form.status == 303 and pasted.get("/").status == 200


def test_a_post_needs_the_csrf_token_and_the_ui_s_own_origin(shared: DaemonProcess) -> None:
    b = logged_in(shared)
    sid = shared.call("browse.conversations", {"client_id": CLIENT})["sessions"][0]["session_id"]
    fields = {"session_id": sid, "conversation": "1", "fingerprint": "x"}
    preview = b.get(f"/c/{CLIENT}/forget?session_id={sid}&conversation=1")
    assert preview.status == 200 and "4811" in preview.body
    csrf = csrf_of(preview.body)
    assert b.post(f"/c/{CLIENT}/forget", fields).status == 403
    assert b.post(f"/c/{CLIENT}/forget", {**fields, "csrf": "wrong"}).status == 403
    cross = b.post(
        f"/c/{CLIENT}/forget", {**fields, "csrf": csrf}, headers={"Origin": "http://evil.example"}
    )
    assert cross.status == 403
    stale = b.post(f"/c/{CLIENT}/forget", {**fields, "csrf": csrf})
    assert stale.status == 409 and "changed since the preview" in stale.body  # gate passed
    assert "4811" in "".join(
        x["title"]
        for x in shared.call(
            "memory.forget_preview", {"client_id": CLIENT, "session_id": sid, "conversation_id": 1}
        )["exchanges"]
    )
    assert browser(shared).post("/logout", {"csrf": csrf}).status == 303  # no cookie: refused
    assert b.get("/").status == 200


def test_a_foreign_host_header_is_refused_even_with_a_session(shared: DaemonProcess) -> None:
    b = logged_in(shared)
    port = b.netloc.rsplit(":", 1)[1]
    for host in ("evil.example", f"evil.example:{port}", "127.0.0.1", f"127.0.0.2:{port}"):
        reply = b.get("/", headers={"Host": host})
        assert reply.status == 421 and "4811" not in reply.body, host
    assert b.get("/", headers={"Host": f"localhost:{port}"}).status == 200


def test_every_answer_carries_a_strict_csp_and_no_script(shared: DaemonProcess) -> None:
    b = logged_in(shared)
    for path in ("/login", "/", f"/c/{CLIENT}", f"/c/{CLIENT}/search?q=bike", "/static/ui.css"):
        reply = b.get(path)
        csp = reply.headers["content-security-policy"]
        assert "default-src 'none'" in csp and "script-src" not in csp, path
        assert "frame-ancestors 'none'" in csp and reply.headers["x-frame-options"] == "DENY"
        assert reply.headers["cache-control"] == "no-store"
        assert "<script" not in reply.body, path


def test_only_memd_s_uid_can_read_the_token_file(shared: DaemonProcess, tmp_path: Path) -> None:
    memory_dir = Path(shared.call("daemon.status")["memory_dir"])
    token = LoginTokens(memory_dir).issue()
    path = memory_dir / ".ui" / f"login-{token.split('~')[0]}"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    if os.geteuid() != 0 or not shutil.which("setpriv"):
        pytest.skip("needs root and setpriv to act as another uid")
    copy = tmp_path / "copy"  # even a copy in an open folder keeps the file's mode
    shutil.copy2(path, copy)
    os.chmod(tmp_path, 0o755)
    for target in (path, copy):
        other = subprocess.run(
            ["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups", "cat", str(target)],
            capture_output=True,
            text=True,
            timeout=30,
        )
        assert other.returncode != 0 and token not in other.stdout, other
        assert "Permission denied" in other.stderr


def test_idle_connections_are_capped_and_cut(shared: DaemonProcess) -> None:
    b = browser(shared)
    host, port = b.netloc.rsplit(":", 1)
    idle = [socket.create_connection((host, int(port)), timeout=5) for _ in range(4)]
    try:
        time.sleep(0.3)
        extra = socket.create_connection((host, int(port)), timeout=5)
        assert extra.recv(1) == b""  # over the cap: closed at once
        extra.close()
        half = idle[0]
        half.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n")  # never finishes its head
        for conn in idle:
            conn.settimeout(5)
            start = time.monotonic()
            with _closed():
                assert conn.recv(1) == b""
            assert time.monotonic() - start < 4.5
    finally:
        for conn in idle:
            conn.close()
    assert b.get("/login").status == 401
    ui = ui_status(shared)
    assert ui["refused"] >= 1 and ui["timed_out"] >= 4


class _closed:
    """A connection closed by the server reads b'' or is reset: both are closed."""

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: Any, exc: Any, tb: Any) -> bool:
        return kind is ConnectionResetError


def test_off_means_no_port_and_memd_ui_says_so(
    config_file: Callable[..., Path], daemon_factory: Callable[..., DaemonProcess]
) -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    settings = ui_settings()
    settings["ui"] = {"enabled": False, "listen": f"127.0.0.1:{port}"}
    memd = daemon_factory(config_file(**settings))
    assert memd.call("daemon.status").get("ui") is None
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.1", port), timeout=5)
    with pytest.raises(subprocess.CalledProcessError) as failed:
        login_link(memd)
    assert "off" in (failed.value.stderr or "")


def test_a_taken_port_is_reported_and_memd_keeps_running(
    config_file: Callable[..., Path], daemon_factory: Callable[..., DaemonProcess]
) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        settings = ui_settings()
        settings["ui"] = {"listen": f"127.0.0.1:{port}"}
        memd = daemon_factory(config_file(**settings))
        ui = ui_status(memd)
        assert ui["state"] == "failed" and f"127.0.0.1:{port}" in ui["error"], ui
        assert record(memd, "c", "still recording", "yes")["session_id"]
        with pytest.raises(subprocess.CalledProcessError) as failed:
            login_link(memd)
        assert "not running" in (failed.value.stderr or "")


@pytest.mark.parametrize("listen", ["0.0.0.0:8767", "192.168.1.5:0", "[::]:8767", "nonsense"])
def test_a_non_loopback_or_malformed_address_is_refused(listen: str) -> None:
    with pytest.raises(ConfigError, match=r"ui\.listen"):
        parse_config({"ui": {"listen": listen}})
    allowed: dict[str, Any] = {"ui": {"listen": "0.0.0.0:0", "allow_non_loopback": True}}
    assert parse_config(allowed).ui.address == ("0.0.0.0", 0)
    assert parse_config({}).ui.listen == "127.0.0.1:8767" and parse_config({}).ui.enabled


def test_a_5_mb_paste_is_paged_not_one_page(shared: DaemonProcess) -> None:
    paste = ("<b>pasted log line</b> " * 230_000)[:5_000_000] + "END-OF-PASTE"
    done = record(shared, "paste", "Here is the whole log:\n" + paste, "Thanks.")
    b = logged_in(shared)
    base = f"/c/{CLIENT}/s/{done['session_id']}/{done['conversation']}"
    page = b.get(base)
    assert page.status == 200 and len(page.body) < 200_000, len(page.body)
    assert "END-OF-PASTE" not in page.body and "&lt;b&gt;pasted log line&lt;/b&gt;" in page.body
    assert "<b>pasted" not in page.body
    more = page.body.split('class="more"><a href="', 1)[1].split('"', 1)[0].replace("&amp;", "&")
    window = b.get(more)
    assert window.status == 200 and 100_000 < len(window.body) < 800_000
    last = b.get(more.split("from=")[0] + f"from={len(paste) - 100}")
    assert last.status == 200 and "END-OF-PASTE" in last.body


def test_memd_status_shows_the_address_and_a_config_edit_turns_the_ui_off_and_on(
    config_file: Callable[..., Path], daemon_factory: Callable[..., DaemonProcess]
) -> None:
    memd = daemon_factory(config_file(**ui_settings()))
    url = ui_status(memd)["url"]
    shown = subprocess.run(
        [sys.executable, "-m", "memd.cli", "status", "--config", str(memd.config_path)],
        capture_output=True,
        text=True,
        env=memd.env,
        timeout=60,
    )
    assert f"ui       {url}" in shown.stdout, shown
    port = int(url.rstrip("/").rsplit(":", 1)[1])
    off = ui_settings()
    off["ui"]["enabled"] = False
    config_file(**off)
    _until(lambda: memd.call("daemon.status").get("ui") is None, memd)
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.1", port), timeout=5)
    config_file(**ui_settings())
    _until(lambda: (memd.call("daemon.status").get("ui") or {}).get("state") == "running", memd)
    assert browser(memd).login(login_link(memd)).status == 303


def _until(predicate: Callable[[], bool], memd: DaemonProcess, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, memd.log()
        time.sleep(0.2)


def test_login_tokens_refuse_stale_open_and_linked_files(tmp_path: Path) -> None:
    tokens = LoginTokens(tmp_path)
    good = tokens.issue()
    assert tokens.claim(good) and not tokens.claim(good)  # once
    stale = LoginTokens(tmp_path, ttl=0.0)
    old = stale.issue()
    time.sleep(0.05)
    assert not stale.claim(old) and not tokens.claim(old)  # expired, and used up
    opened = tokens.issue()
    path = tmp_path / ".ui" / f"login-{opened.split('~')[0]}"
    os.chmod(path, 0o644)
    assert not tokens.claim(opened)
    linked = tokens.issue()
    ident = linked.split("~")[0]
    target = tmp_path / "elsewhere"
    target.write_text(linked + "\n")
    os.chmod(target, 0o600)
    (tmp_path / ".ui" / f"login-{ident}").unlink()
    (tmp_path / ".ui" / f"login-{ident}").symlink_to(target)
    assert not tokens.claim(linked)
    os.chmod(tmp_path / ".ui", 0o755)
    with pytest.raises(TokenError, match="open to group or others"):
        tokens.issue()


def test_memd_ui_without_a_running_memd_says_how_to_start_it(
    config_file: Callable[..., Path],
) -> None:
    path = config_file(**ui_settings())
    done = subprocess.run(
        [sys.executable, "-m", "memd.cli", "ui", "--print", "--config", str(path)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 3 and "memd run" in done.stderr and not done.stdout, done
    assert not (path.parent / "memory" / ".ui").exists()  # no token issued for nobody


def test_forget_a_time_range_from_the_client_page(
    config_file: Callable[..., Path],
    daemon_factory: Callable[..., DaemonProcess],
    tmp_path: Path,
) -> None:
    memd = daemon_factory(config_file(**ui_settings()))
    record(memd, "old", "My passport number is P-7Q31.", "Noted.")
    record(memd, "new", "The gate code is 5150.", "Noted.")
    b = logged_in(memd)
    page = b.get(f"/c/{CLIENT}?after=1h&before=")
    link = next(
        part.split('"', 1)[0].replace("&amp;", "&")
        for part in page.body.split('href="')
        if "forget?after=" in part.split('"', 1)[0]
    )
    shown = b.get(link)
    assert shown.status == 200 and "2 exchanges</strong>" in shown.body, shown.body[-3000:]
    fields = {"after": "1h", "csrf": csrf_of(shown.body)}
    fields["fingerprint"] = shown.body.split('name="fingerprint" value="', 1)[1].split('"', 1)[0]
    done = b.post(f"/c/{CLIENT}/forget", fields)
    assert done.status == 200 and "Removed 2 exchanges" in done.body, done.body[-3000:]
    text = "".join(p.read_text() for p in (tmp_path / "memory" / CLIENT).rglob("*.md"))
    assert "P-7Q31" not in text and "5150" not in text
    again = b.post(f"/c/{CLIENT}/forget", fields)  # the same confirmation, replayed
    assert again.status == 409 and "Nothing matches" in again.body
