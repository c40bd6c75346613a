"""The reading pages: a client's conversations, one conversation, one long message, search.

A conversation is shown `PAGE` exchanges at a time and each message to `WINDOW`
characters, with a link to read the rest of a longer one `LONG_WINDOW` characters at a
time: a 5 MB paste never becomes one 5 MB page. Search shows exactly what
`memory.recall` returns for the client (the same call as the `MemoryRecall` tool: its
results, labels, scores and the "nothing found" text).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from aiohttp import web

from memd.ui.forms import client_of, number, text_param

if TYPE_CHECKING:
    from memd.ui.app import UiApp

PAGE = 50  # exchanges per conversation page
WINDOW = 20_000  # characters of each message on a conversation page
LONG_WINDOW = 100_000  # characters per page of one long message


def add_routes(app: web.Application, ui: UiApp) -> None:
    views = Views(ui)
    app.router.add_get("/c/{client}", views.client)
    app.router.add_get("/c/{client}/s/{session}/{conv}", views.conversation)
    app.router.add_get("/c/{client}/s/{session}/{conv}/x/{exchange}", views.message)
    app.router.add_get("/c/{client}/search", views.search)


class Views:
    def __init__(self, ui: UiApp) -> None:
        self.ui = ui

    async def client(self, request: web.Request) -> web.Response:
        client = client_of(request)
        after, before = text_param(request, "after"), text_param(request, "before")
        params: dict[str, Any] = {"client_id": client}
        params.update({k: v for k, v in (("after", after), ("before", before)) if v})
        listing = await self.ui.call(request, "browse.conversations", params)
        return self.ui.render(
            request,
            "client.html",
            client=client,
            sessions=listing["sessions"],
            after=after,
            before=before,
        )

    async def conversation(self, request: web.Request) -> web.Response:
        client = client_of(request)
        params: dict[str, Any] = {
            "client_id": client,
            "session_id": request.match_info["session"],
            "conversation": number(request.match_info["conv"], "conversation"),
            "limit": PAGE,
            "text_limit": WINDOW,
        }
        at = request.query.get("at")
        if at is not None:
            params["around"] = number(at, "at")
        else:
            params["offset"] = (number(request.query.get("page", "1"), "page", 1) - 1) * PAGE
        conv = await self.ui.call(request, "browse.conversation", params)
        pages = max(1, -(-conv["total"] // PAGE))
        return self.ui.render(
            request,
            "conversation.html",
            client=client,
            conv=conv,
            page=conv["offset"] // PAGE + 1,
            pages=pages,
            window=WINDOW,
        )

    async def message(self, request: web.Request) -> web.Response:
        """One message of an exchange, LONG_WINDOW characters at a time."""
        client = client_of(request)
        part = number(request.query.get("part", "0"), "part")
        start = number(request.query.get("from", "0"), "from")
        conv = await self.ui.call(
            request,
            "browse.conversation",
            {
                "client_id": client,
                "session_id": request.match_info["session"],
                "conversation": number(request.match_info["conv"], "conversation"),
                "around": number(request.match_info["exchange"], "exchange"),
                "limit": 1,
                "text_offset": start,
                "text_limit": LONG_WINDOW,
            },
        )
        exchange = conv["exchanges"][0]
        if part >= len(exchange["parts"]):
            raise web.HTTPNotFound(text="no such message\n")
        return self.ui.render(
            request,
            "message.html",
            client=client,
            conv=conv,
            exchange=exchange,
            part=exchange["parts"][part],
            index=part,
            start=start,
            window=LONG_WINDOW,
        )

    async def search(self, request: web.Request) -> web.Response:
        client = client_of(request)
        query = text_param(request, "q")
        after, before = text_param(request, "after"), text_param(request, "before")
        found = None
        if query:
            params: dict[str, Any] = {"client_id": client, "query": query}
            params.update({k: v for k, v in (("after", after), ("before", before)) if v})
            found = await self.ui.call(request, "memory.recall", params)
            for result in found["results"]:
                result["link"] = result_link(client, result)
        return self.ui.render(
            request,
            "search.html",
            client=client,
            query=query,
            after=after,
            before=before,
            found=found,
        )


def result_link(client: str, result: dict[str, Any]) -> str | None:
    """Where a recall result lives in the browser: its exchange, or its session's summary."""
    from memd.ui.forms import exchange_number, quote

    sid, conv = result.get("session_id"), result.get("conversation")
    if not sid:
        return None
    if result.get("kind") == "transcript" and conv is not None:
        at = exchange_number(result.get("heading", ""))
        base = f"/c/{quote(client)}/s/{quote(sid)}/{conv}"
        return f"{base}?at={at}#x{at}" if at is not None else base
    return f"/c/{quote(client)}#s-{quote(sid)}"
