"""The browser's aiohttp application: routes, rendering, login and the overview page.

Every page is rendered on the server from a Jinja2 template with autoescaping on, so a
transcript's text reaches the page as text only; the pages carry no script at all (the
CSP forbids every script). Everything shown comes from memd's socket API through one
`AsyncMemdClient` (memd.proxy.rpc), as for any other client of memd.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import jinja2
from aiohttp import web

from memd.errors import RpcError
from memd.proxy.rpc import AsyncMemdClient, MemdUnavailable
from memd.ui.guard import Guard
from memd.ui.security import COOKIE, Gate, Sessions, set_cookie
from memd.ui.tokens import LoginTokens

HERE = Path(__file__).parent
REFRESH_SECONDS = 5


class UiApp:
    """Shared by the handlers: the socket client, the gate, the templates."""

    def __init__(self, rpc: AsyncMemdClient, tokens: LoginTokens, guard: Guard) -> None:
        self.rpc = rpc
        self.tokens = tokens
        self.sessions = Sessions()
        self.gate = Gate(self.sessions, guard)
        self.env = jinja2.Environment(
            loader=jinja2.FileSystemLoader(HERE / "templates"),
            autoescape=True,  # every template, whatever its name: transcripts are untrusted
            undefined=jinja2.ChainableUndefined,  # status fields come and go
        )
        self.css = (HERE / "static" / "ui.css").read_bytes()

    def application(self) -> web.Application:
        from memd.ui import actions, views

        app = web.Application(middlewares=[self.gate.middleware], client_max_size=1024 * 1024)
        app.router.add_get("/static/ui.css", self.stylesheet)
        app.router.add_get("/login", self.login_page)
        app.router.add_post("/login", self.login_form)
        app.router.add_post("/logout", self.logout)
        app.router.add_get("/", self.overview)
        views.add_routes(app, self)
        actions.add_routes(app, self)
        return app

    # --- helpers for every page -------------------------------------------------------

    def render(
        self, request: web.Request, name: str, status: int = 200, **context: Any
    ) -> web.Response:
        session = request.get("session")
        text = self.env.get_template(name).render(
            csrf=session.csrf if session is not None else "",
            logged_in=session is not None,
            **context,
        )
        return web.Response(text=text, status=status, content_type="text/html", charset="utf-8")

    async def call(
        self, request: web.Request, method: str, params: dict[str, Any], timeout: float = 120.0
    ) -> Any:
        """A socket call; memd's refusals become an error page (404 for not_found)."""
        try:
            return await self.rpc.call(method, params, timeout=timeout)
        except RpcError as exc:
            missing = exc.kind in ("not_found", "unknown_client")
            error = web.HTTPNotFound if missing else web.HTTPBadRequest
            raise error(
                text=self.error_text(request, str(exc.message), 404 if missing else 400),
                content_type="text/html",
            ) from None
        except MemdUnavailable as exc:
            raise web.HTTPServiceUnavailable(
                text=self.error_text(request, str(exc), 503), content_type="text/html"
            ) from None

    def error_text(self, request: web.Request, message: str, status: int) -> str:
        return self.render(request, "error.html", message=message, code=status).text or ""

    # --- public routes ----------------------------------------------------------------

    async def stylesheet(self, request: web.Request) -> web.Response:
        return web.Response(body=self.css, content_type="text/css")

    async def login_page(self, request: web.Request) -> web.StreamResponse:
        token = request.query.get("token")
        if token is None:
            return self.render(request, "login.html", status=401, failed=False)
        return self._login(request, token)

    async def login_form(self, request: web.Request) -> web.StreamResponse:
        form = await request.post()
        token = form.get("token")
        return self._login(request, token.strip() if isinstance(token, str) else "")

    def _login(self, request: web.Request, token: str) -> web.StreamResponse:
        if not self.tokens.claim(token):
            return self.render(request, "login.html", status=401, failed=True)
        sid, _session = self.sessions.create()
        response = web.HTTPSeeOther("/")  # the token leaves the address bar and history
        set_cookie(response, sid)
        return response

    async def logout(self, request: web.Request) -> web.StreamResponse:
        self.sessions.drop(request.cookies.get(COOKIE))
        response = web.HTTPSeeOther("/login")
        response.del_cookie(COOKIE, path="/")
        return response

    # --- the overview -----------------------------------------------------------------

    async def overview(self, request: web.Request) -> web.Response:
        status = await self.call(request, "daemon.status", {})
        clients = (await self.call(request, "clients.list", {}))["clients"]
        for row in clients:
            row["status"] = status.get("clients", {}).get(row["client_id"], {})
        return self.render(
            request,
            "overview.html",
            status=200,
            daemon=status,
            clients=clients,
            refresh=REFRESH_SECONDS,
        )
