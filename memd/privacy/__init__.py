"""Privacy controls: forget exchanges for good, export a client's memory, import it back."""

from __future__ import annotations

from typing import TYPE_CHECKING

from memd import lazy_face

if TYPE_CHECKING:
    from memd.privacy.browse import list_conversations, preview, read_conversation
    from memd.privacy.export import MAX_PAGE_SIZE, PAGE_SIZE, export_page, iter_exchanges
    from memd.privacy.forgetting import Target, forget, query_gate
    from memd.privacy.select import Plan, Selector, make_selector, plan
else:
    __getattr__ = lazy_face(__name__, __file__)
