"""The params `memory.forget` and `memory.forget_preview` share: one selector and its times.

Both methods take the same selector params, so they are read and checked in one place:
a preview that accepted a form `memory.forget` refused (or the reverse) would show the
user something other than what a forget then removes. `memory.forget` alone also takes
`exchanges` (exact keys, as a dry run listed them).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from memd import recall as rc
from memd.errors import InvalidParams
from memd.privacy import Selector, make_selector
from memd.rpc import Params


@dataclass(frozen=True)
class SelectorParams:
    """The selector params of one call, as given; `selector()` checks and builds it.

    Read inside the `with Params(...)` block and built after it, so an unknown param is
    reported before a bad selector, as for every other method."""

    session_id: str | None
    conversation_id: str | int | None
    after: str | None
    before: str | None
    query: str | None
    all: bool
    exchanges: list[Any] | None

    @classmethod
    def take(cls, p: Params, *, exchanges: bool) -> SelectorParams:
        """Take the selector params from `p`; `exchanges` only where the method accepts it."""
        return cls(
            session_id=p.optional("session_id", str),
            conversation_id=p.optional("conversation_id", (str, int)),
            after=p.optional("after", str),
            before=p.optional("before", str),
            query=p.optional("query", str),
            all=p.optional("all", bool, False),
            exchanges=p.optional("exchanges", list) if exchanges else None,
        )

    def selector(self, now: datetime) -> Selector:
        """The one selector given (`memd.privacy.make_selector` checks there is one)."""
        return make_selector(
            session_id=self.session_id,
            conversation_id=self.conversation_id,
            after=time_param(self.after, "after", now),
            before=time_param(self.before, "before", now),
            query=self.query,
            all=self.all,
            exchanges=None if self.exchanges is None else _keys(self.exchanges),
        )


def time_param(value: str | None, param: str, now: datetime) -> datetime | None:
    """The same forms as recall's `after`/`before`: ISO dates or times, or `30m`/`2d`/`1w`."""
    if value is None:
        return None
    try:
        return rc.parse_time(value, param, now)
    except rc.RecallArgumentError as exc:
        raise InvalidParams(exc.message, data={"param": exc.param}) from None


def _keys(items: list[Any]) -> list[tuple[str, int, int]]:
    """`exchanges`: [{session_id, conversation, exchange}, ...], as a forget listed them."""
    out = []
    for item in items:
        try:
            sid, conv, ex = item["session_id"], item["conversation"], item["exchange"]
        except (TypeError, KeyError):
            sid = conv = ex = None
        if not (isinstance(sid, str) and _number(conv) and _number(ex)):
            raise InvalidParams(
                "each of exchanges must be {session_id, conversation, exchange}",
                data={"param": "exchanges"},
            )
        out.append((sid, conv, ex))
    return out


def _number(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0
