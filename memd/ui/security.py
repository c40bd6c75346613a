"""Who gets in: the Host check, the session cookie, CSRF tokens and the security headers.

Order of checks on every request (`middleware`):

1. `Host` must be the UI's own address (`127.0.0.1:PORT`, `localhost:PORT`, or the
   bound address): a page on another site whose name resolves to 127.0.0.1 (DNS
   rebinding) sends its own name and is refused with 421.
2. Except for the login page and the stylesheet, a valid session cookie is needed;
   without one a page redirects to /login, which explains `memd ui`.
3. A state-changing request (anything but GET/HEAD) must carry the session's CSRF
   token in its form, and an `Origin`, when sent, must be the UI's own; else 403.

Sessions live in memory only (a restart of memd logs everyone out); the cookie is
`HttpOnly; SameSite=Strict; Path=/`. Every answer carries a CSP that allows nothing
but the UI's own stylesheet and forms: no script runs on these pages, ours included.
"""

from __future__ import annotations

import hmac
import secrets
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from aiohttp import web

from memd.ui.guard import Guard

COOKIE = "memd_ui"
SESSION_IDLE = 12 * 3600.0  # seconds a browser session lives without a request
MAX_SESSIONS = 32  # the oldest is logged out past this
PUBLIC = ("/login", "/static/ui.css")
CSP = (
    "default-src 'none'; style-src 'self'; img-src 'self'; form-action 'self'; "
    "frame-ancestors 'none'; base-uri 'none'"
)
HEADERS = {
    "Content-Security-Policy": CSP,
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "same-origin",  # no-referrer would make forms send `Origin: null`
    "Cross-Origin-Opener-Policy": "same-origin",
    "Cross-Origin-Resource-Policy": "same-origin",
    "Cache-Control": "no-store",
}
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@dataclass
class UiSession:
    csrf: str = field(default_factory=lambda: secrets.token_urlsafe(24))
    seen: float = field(default_factory=time.monotonic)


class Sessions:
    """The logged-in browsers, by the secret their cookie carries."""

    def __init__(self) -> None:
        self._by_id: OrderedDict[str, UiSession] = OrderedDict()

    def create(self) -> tuple[str, UiSession]:
        sid = secrets.token_urlsafe(32)
        self._by_id[sid] = session = UiSession()
        while len(self._by_id) > MAX_SESSIONS:
            self._by_id.popitem(last=False)
        return sid, session

    def get(self, sid: str | None) -> UiSession | None:
        if not sid:
            return None
        session = self._by_id.get(sid)
        if session is None:
            return None
        now = time.monotonic()
        if now - session.seen > SESSION_IDLE:
            del self._by_id[sid]
            return None
        session.seen = now
        self._by_id.move_to_end(sid)
        return session

    def drop(self, sid: str | None) -> None:
        if sid:
            self._by_id.pop(sid, None)


class Gate:
    """The checks above, for one listener bound to `hosts` (allowed Host values)."""

    def __init__(self, sessions: Sessions, guard: Guard) -> None:
        self.sessions = sessions
        self.guard = guard
        self.hosts: set[str] = set()
        self.origins: set[str] = set()

    def bind(self, host: str, port: int) -> None:
        shown = f"[{host}]" if ":" in host else host
        self.hosts = {f"{shown}:{port}", f"localhost:{port}"}
        self.origins = {f"http://{h}" for h in self.hosts}

    @web.middleware
    async def middleware(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        transport = request.transport
        if transport is not None:
            self.guard.busy(transport)
        try:
            response = await self._checked(request, handler)
        except web.HTTPException as exc:
            response = exc
        finally:
            if transport is not None:
                self.guard.idle(transport)
        response.headers.update(HEADERS)
        return response

    async def _checked(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        if request.headers.get("Host", "").lower() not in self.hosts:
            return _refusal(421, "This page is served only as memd's own loopback address.")
        if request.method not in ("GET", "HEAD"):
            origin = request.headers.get("Origin")
            if origin is not None and origin not in self.origins:
                return _refusal(403, "Cross-site request refused.")
        if request.path in PUBLIC:
            return await handler(request)
        session = self.sessions.get(request.cookies.get(COOKIE))
        if session is None:
            raise web.HTTPSeeOther("/login")
        request["session"] = session
        if request.method not in ("GET", "HEAD"):
            form = await request.post()
            sent = form.get("csrf")
            if not isinstance(sent, str) or not hmac.compare_digest(
                sent.encode(), session.csrf.encode()
            ):
                return _refusal(403, "Missing or wrong CSRF token: reload the page and retry.")
        return await handler(request)


def set_cookie(response: web.StreamResponse, sid: str) -> None:
    response.set_cookie(COOKIE, sid, httponly=True, samesite="Strict", path="/")


def _refusal(status: int, text: str) -> web.Response:
    return web.Response(status=status, text=text + "\n", content_type="text/plain")
