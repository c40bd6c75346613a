"""The pages that change or take away memory: forget (preview, confirm, receipt), export.

Forget never acts on more than it showed: the preview (`memory.forget_preview`) names
each exchange and carries a fingerprint of that set; the confirmation sends the
fingerprint back, and the UI previews again and forgets only if the set is the same
(new exchanges in the range, or a query that now finds other things, show the new
preview instead). Export streams `memory.export` pages to the download, one page in
memory at a time.
"""

from __future__ import annotations

import hmac
import json
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from aiohttp import web

from memd.ui.forms import bad, client_of, selector, text_param
from memd.ui.security import HEADERS

if TYPE_CHECKING:
    from memd.ui.app import UiApp


def add_routes(app: web.Application, ui: UiApp) -> None:
    actions = Actions(ui)
    app.router.add_get("/c/{client}/forget", actions.preview)
    app.router.add_post("/c/{client}/forget", actions.forget)
    app.router.add_get("/c/{client}/export", actions.export)


class Actions:
    def __init__(self, ui: UiApp) -> None:
        self.ui = ui

    async def preview(self, request: web.Request) -> web.Response:
        client = client_of(request)
        params = selector(request.query)
        shown = await self.ui.call(
            request, "memory.forget_preview", {"client_id": client, **params}
        )
        return self._preview_page(request, client, params, shown, changed=False)

    def _preview_page(
        self,
        request: web.Request,
        client: str,
        params: dict[str, Any],
        shown: dict[str, Any],
        changed: bool,
    ) -> web.Response:
        fields = {k: v for k, v in params.items() if k != "conversation_id"}
        if "conversation_id" in params:
            fields["conversation"] = params["conversation_id"]
        return self.ui.render(
            request,
            "forget.html",
            status=409 if changed else 200,
            client=client,
            fields=fields,
            shown=shown,
            changed=changed,
        )

    async def forget(self, request: web.Request) -> web.Response:
        client = client_of(request)
        form = await request.post()
        params = selector(form)
        sent = form.get("fingerprint")
        if not isinstance(sent, str) or not sent:
            raise bad("confirm from the preview page: the fingerprint is missing")
        call = {"client_id": client, **params}
        now = await self.ui.call(request, "memory.forget_preview", call)
        if not hmac.compare_digest(now["fingerprint"].encode(), sent.encode()):
            return self._preview_page(request, client, params, now, changed=True)
        if not now["counts"]["exchanges"] and not now["counts"]["summaries"]:
            raise bad("nothing to forget")
        # A forget returns once the index is rebuilt: minutes for a large client.
        receipt = await self.ui.call(request, "memory.forget", call, timeout=1800.0)
        return self.ui.render(request, "receipt.html", client=client, receipt=receipt, shown=now)

    async def export(self, request: web.Request) -> web.StreamResponse:
        client = client_of(request)
        kind = request.query.get("format", "jsonl")
        if kind not in ("jsonl", "markdown"):
            raise bad("format must be jsonl or markdown")
        params: dict[str, Any] = {"client_id": client}
        for key in ("after", "before"):
            if value := text_param(request, key):
                params[key] = value
        first = await self.ui.call(request, "memory.export", params)  # errors before headers
        stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
        name = f"memd-{client}-{stamp}.{'jsonl' if kind == 'jsonl' else 'md'}"
        response = web.StreamResponse(
            headers={
                "Content-Type": "application/x-ndjson" if kind == "jsonl" else "text/markdown",
                "Content-Disposition": f'attachment; filename="{name}"',
            }
        )
        response.headers.update(HEADERS)  # the gate's own update comes after prepare
        await response.prepare(request)
        page, session = first, None
        while True:
            for record in page["exchanges"]:
                session, text = _line(kind, record, session)
                await response.write(text.encode("utf-8"))
            cursor = page.get("next_cursor")
            if not cursor:
                break
            page = await self.ui.call(request, "memory.export", {**params, "cursor": cursor})
        await response.write_eof()
        return response


def _line(kind: str, record: dict[str, Any], session: str | None) -> tuple[str | None, str]:
    """One exported exchange as `memd export` writes it (JSON line, or markdown)."""
    if kind == "jsonl":
        return session, json.dumps(record, ensure_ascii=False) + "\n"
    text = ""
    if record["session_id"] != session:
        session = record["session_id"]
        text = f"# Session {session}\n\n"
    head = f"## {record['time']} · conversation {record['conversation']}"
    if record.get("conversation_id"):
        head += f" ({record['conversation_id']})"
    body = "".join(f"**{p['label']}:** {p['text']}\n\n" for p in record["parts"])
    return session, text + f"{head} · exchange {record['exchange']}\n\n{body}"
