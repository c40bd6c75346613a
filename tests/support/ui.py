"""The memory browser under test: a real `memd run` with [ui] on a free port, and HTTP."""

from __future__ import annotations

import http.client
import re
import subprocess
import sys
import time
import urllib.parse
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.support.daemon import REPO, DaemonProcess

CLIENT = "demo"


def ui_settings(**ui: Any) -> dict[str, Any]:
    """Config keys for a test daemon with the browser on and one recording client."""
    return {
        "ui": {"listen": "127.0.0.1:0", **ui},
        "clients": {CLIENT: {"memory_enabled": True, "mode": "both"}},
    }


def ui_status(memd: DaemonProcess, timeout: float = 30.0) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while True:
        ui = memd.call("daemon.status").get("ui")
        if (ui and ui.get("state") != "stopped") or time.monotonic() > deadline:
            return ui or {}
        time.sleep(0.1)


def login_link(memd: DaemonProcess) -> str:
    """What `memd ui --print` prints: the address and a fresh single-use token."""
    out = subprocess.run(
        [sys.executable, "-m", "memd.cli", "ui", "--print", "--config", str(memd.config_path)],
        capture_output=True,
        text=True,
        env=memd.env,
        cwd=str(REPO),
        timeout=60,
        check=True,
    )
    link = out.stdout.strip()
    assert re.match(r"^http://127\.0\.0\.1:\d+/login\?token=", link), out
    return link


@dataclass
class Reply:
    status: int
    headers: dict[str, str]
    body: str


@dataclass
class Browser:
    """A cookie-keeping HTTP client that can send any Host header."""

    base: str
    cookies: dict[str, str] = field(default_factory=dict)

    @property
    def netloc(self) -> str:
        return urllib.parse.urlsplit(self.base).netloc

    def request(
        self,
        method: str,
        path: str,
        form: dict[str, str] | None = None,
        headers: dict[str, str] | None = None,
    ) -> Reply:
        host, port = self.netloc.rsplit(":", 1)
        conn = http.client.HTTPConnection(host, int(port), timeout=60)
        sent = {"Host": self.netloc, **(headers or {})}
        if self.cookies:
            sent["Cookie"] = "; ".join(f"{k}={v}" for k, v in self.cookies.items())
        body = None
        if form is not None:
            body = urllib.parse.urlencode(form)
            sent["Content-Type"] = "application/x-www-form-urlencoded"
        try:
            conn.request(method, path, body=body, headers=sent)
            resp = conn.getresponse()
            text = resp.read().decode("utf-8", "replace")
            for header in resp.headers.get_all("Set-Cookie") or []:
                name, _, rest = header.partition("=")
                self.cookies[name] = rest.split(";")[0]
            return Reply(resp.status, {k.lower(): v for k, v in resp.getheaders()}, text)
        finally:
            conn.close()

    def get(self, path: str, **kw: Any) -> Reply:
        return self.request("GET", path, **kw)

    def post(self, path: str, form: dict[str, str], **kw: Any) -> Reply:
        return self.request("POST", path, form=form, **kw)

    def login(self, link: str) -> Reply:
        parts = urllib.parse.urlsplit(link)
        return self.get(f"{parts.path}?{parts.query}")


def csrf_of(page: str) -> str:
    m = re.search(r'name="csrf" value="([^"]+)"', page)
    assert m, page[:2000]
    return m.group(1)


def record(memd: DaemonProcess, conversation: str, user: str, assistant: str) -> dict[str, Any]:
    return memd.call(
        "memory.record_exchange",
        {
            "client_id": CLIENT,
            "conversation_id": conversation,
            "user": user,
            "assistant": assistant,
        },
    )


def files_text(memd_dir: Path) -> str:
    """Every transcript and summary of the client, as one string."""
    root = memd_dir / CLIENT
    return "".join(
        p.read_text(errors="replace")
        for sub in ("sessions", "archive")
        for p in (root / sub).glob("*.md")
    )
