"""Privacy controls: forget exchanges for good, export a client's memory, import it back."""

from __future__ import annotations

from typing import TYPE_CHECKING

from memd import public_face

if TYPE_CHECKING:
    from memd.privacy.browse import list_conversations, preview, read_conversation
    from memd.privacy.export import MAX_PAGE_SIZE, PAGE_SIZE, export_page, iter_exchanges
    from memd.privacy.forgetting import Target, forget, query_gate
    from memd.privacy.select import Plan, Selector, make_selector, plan

__all__ = [
    "MAX_PAGE_SIZE",
    "PAGE_SIZE",
    "Plan",
    "Selector",
    "Target",
    "export_page",
    "forget",
    "iter_exchanges",
    "list_conversations",
    "make_selector",
    "plan",
    "preview",
    "query_gate",
    "read_conversation",
]

__getattr__ = public_face(
    __name__,
    {
        "browse": ("list_conversations", "preview", "read_conversation"),
        "export": ("MAX_PAGE_SIZE", "PAGE_SIZE", "export_page", "iter_exchanges"),
        "forgetting": ("Target", "forget", "query_gate"),
        "select": ("Plan", "Selector", "make_selector", "plan"),
    },
)
