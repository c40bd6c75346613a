"""Which exchanges a `memory.forget` selector names, found in the transcript files.

Selectors (exactly one per call): `session_id` (every exchange of it), `conversation_id`
(an MCP conversation id; or, with `session_id`, the conversation's number in that
session), `after`/`before` (exchange times, same forms as recall), `query` (the
exchanges recall shows as relevant for it, by recall's own gate, each one by its own
heading: a conversation header or a summary hit never stands for more), `exchanges`
(exact (session, conversation, exchange) keys: what a preview showed), `all`. The plan
is a set of (conversation, exchange) keys per session; the files are read, never the
state, so what a person already edited away is not counted again.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from memd.errors import InvalidParams, NotFound
from memd.indexing import in_range
from memd.layout import ClientLayout
from memd.markdown import SESSION_ID_RE, Span, exchange_spans
from memd.privacy.export import session_files

Key = tuple[int, int]  # (conversation number, exchange number) within one session file
MAX_EXACT = 1000  # exact keys in one call (a preview shows a recall's few results)
MAX_LISTED = 1000  # exchanges a forget's result lists by name; the rest are counted

Hit = tuple[str, str, int | None]  # recall result: source path, heading, conversation

ExternalIds = Mapping[str, tuple[str, int]]  # MCP conversation id -> (session_id, number)


@dataclass(frozen=True)
class Selector:
    """One validated selector; `describe()` says what it names, for confirmations."""

    session_id: str | None = None
    conversation: str | int | None = None  # MCP id, or a number within session_id
    after: datetime | None = None
    before: datetime | None = None
    query: str | None = None
    all: bool = False
    exchanges: tuple[tuple[str, int, int], ...] | None = None

    def describe(self) -> str:
        if self.all:
            return "all memory"
        if self.query is not None:
            return f"the exchanges recall finds relevant for {self.query!r}"
        if self.exchanges is not None:
            return f"{len(self.exchanges)} named exchange(s)"
        if self.conversation is not None:
            where = f" of session {self.session_id}" if self.session_id else ""
            return f"conversation {self.conversation}{where}"
        if self.session_id is not None:
            return f"session {self.session_id}"
        span = [
            f"from {self.after.isoformat()}" if self.after else "",
            f"before {self.before.isoformat()}" if self.before else "",
        ]
        return "exchanges " + " ".join(s for s in span if s)


def make_selector(
    *,
    session_id: str | None = None,
    conversation_id: str | int | None = None,
    after: datetime | None = None,
    before: datetime | None = None,
    query: str | None = None,
    all: bool = False,
    exchanges: Iterable[tuple[str, int, int]] | None = None,
) -> Selector:
    """Check that exactly one selector is given (a conversation number needs its session)."""
    given = [
        name
        for name, on in (
            ("session_id", session_id is not None and conversation_id is None),
            ("conversation_id", conversation_id is not None),
            ("after/before", after is not None or before is not None),
            ("query", query is not None),
            ("exchanges", exchanges is not None),
            ("all", all),
        )
        if on
    ]
    if len(given) != 1:
        raise InvalidParams(
            "give exactly one of session_id, conversation_id, after/before, "
            f"query, exchanges, all (got {', '.join(given) or 'none'})",
            data={"param": given[1] if len(given) > 1 else "session_id"},
        )
    if session_id is not None and not SESSION_ID_RE.match(session_id):
        raise InvalidParams(
            f"session_id {session_id!r} is not a session id", data={"param": "session_id"}
        )
    if isinstance(conversation_id, int) and session_id is None:
        raise InvalidParams(
            "a conversation number needs its session_id", data={"param": "conversation_id"}
        )
    if isinstance(conversation_id, str) and not conversation_id:
        raise InvalidParams("conversation_id must not be empty", data={"param": "conversation_id"})
    if query is not None and not query.strip():
        raise InvalidParams("query must not be empty", data={"param": "query"})
    if after is not None and before is not None and after >= before:
        raise InvalidParams("after must be earlier than before", data={"param": "after"})
    keys = None if exchanges is None else _exact(exchanges)
    return Selector(session_id, conversation_id, after, before, query, all, keys)


def _exact(exchanges: Iterable[tuple[str, int, int]]) -> tuple[tuple[str, int, int], ...]:
    keys = tuple(exchanges)
    if not keys or len(keys) > MAX_EXACT:
        raise InvalidParams(
            f"exchanges must name 1 to {MAX_EXACT} exchanges", data={"param": "exchanges"}
        )
    for sid, _conv, _ex in keys:
        if not SESSION_ID_RE.match(sid):
            raise InvalidParams(f"{sid!r} is not a session id", data={"param": "exchanges"})
    return keys


@dataclass
class Plan:
    """Exchanges to cut per session, and the summaries that covered any of them."""

    cuts: dict[str, set[Key]] = field(default_factory=dict)
    summaries: set[str] = field(default_factory=set)  # session ids

    @property
    def exchanges(self) -> int:
        return sum(len(keys) for keys in self.cuts.values())

    def add(self, session_id: str, keys: Iterable[Key]) -> None:
        keys = set(keys)
        if keys:
            self.cuts.setdefault(session_id, set()).update(keys)


def plan(
    layout: ClientLayout,
    selector: Selector,
    external: ExternalIds,
    hits: Iterable[Hit] = (),
) -> Plan:
    """The exchanges `selector` names. `hits` are recall's relevant results for a query.

    Raises NotFound for a session or conversation that does not exist; a time range or
    query that matches nothing gives an empty plan.
    """
    files = dict(session_files(layout))
    out = Plan()
    if selector.conversation is not None:
        sid, number = _conversation(selector, external)
        path = files.get(sid)
        keys = [s.key for s in _spans(path) if s.conversation == number] if path else []
        if not keys:
            raise NotFound(
                f"no conversation {selector.conversation!r}"
                + (f" in session {sid}" if selector.session_id else ""),
                data={"conversation_id": selector.conversation},
            )
        out.add(sid, keys)
    elif selector.session_id is not None:
        sid = selector.session_id
        if sid not in files and not layout.summary_file(sid).exists():
            raise NotFound(f"no session {sid!r}", data={"session_id": sid})
        if sid in files:
            out.add(sid, [s.key for s in _spans(files[sid])])
        out.summaries.add(sid)
    elif selector.query is not None:
        _plan_hits(layout, files, hits, out)
    elif selector.exchanges is not None:
        _plan_exact(files, selector.exchanges, out)
    else:
        for sid, path in files.items():
            out.add(
                sid,
                [
                    s.key
                    for s in _spans(path)
                    if selector.all or in_range(s.when, selector.after, selector.before)
                ],
            )
        if selector.all:
            out.summaries.update(_summary_ids(layout))
    out.summaries.update(sid for sid in out.cuts if layout.summary_file(sid).exists())
    return out


def _conversation(selector: Selector, external: ExternalIds) -> tuple[str, int]:
    if isinstance(selector.conversation, int):
        assert selector.session_id is not None
        return selector.session_id, selector.conversation
    found = external.get(str(selector.conversation))
    if found is None:
        raise NotFound(
            f"no conversation {selector.conversation!r}",
            data={"conversation_id": selector.conversation},
        )
    if selector.session_id is not None and found[0] != selector.session_id:
        raise NotFound(
            f"conversation {selector.conversation!r} is not in session {selector.session_id}",
            data={"conversation_id": selector.conversation},
        )
    return found


def _spans(path: Path) -> list[Span]:
    try:
        return exchange_spans(path.read_bytes().decode("utf-8", "replace"))
    except FileNotFoundError:
        return []


def _summary_ids(layout: ClientLayout) -> set[str]:
    return {
        p.name[: -len("-summary.md")]
        for p in layout.sessions.glob("*-summary.md")
        if SESSION_ID_RE.match(p.name[: -len("-summary.md")])
    }


def _plan_hits(
    layout: ClientLayout, files: Mapping[str, Path], hits: Iterable[Hit], out: Plan
) -> None:
    """Recall's hits back to exchanges: a transcript hit names one exchange by its heading
    and conversation number (a conversation header's hit names none: it is never taken for
    the whole conversation); a summary hit names the summary (regenerated or removed)."""
    sessions = layout.sessions.resolve()
    wanted: dict[str, set[tuple[int | None, str]]] = {}
    for source, heading, conversation in hits:
        path = Path(source)
        if path.parent.resolve() != sessions:
            continue
        name = path.name
        if name.endswith("-summary.md") and SESSION_ID_RE.match(name[: -len("-summary.md")]):
            out.summaries.add(name[: -len("-summary.md")])
        elif SESSION_ID_RE.match(path.stem) and path.stem in files:
            wanted.setdefault(path.stem, set()).add((conversation, heading))
    for sid, named in wanted.items():
        try:
            lines = files[sid].read_bytes().decode("utf-8", "replace").split("\n")
        except FileNotFoundError:
            continue
        out.add(
            sid,
            [
                s.key
                for s in exchange_spans("\n".join(lines))
                if (s.conversation, lines[s.start][3:]) in named
            ],
        )


def _plan_exact(
    files: Mapping[str, Path], exchanges: Iterable[tuple[str, int, int]], out: Plan
) -> None:
    """Exactly the named exchanges that still exist (a preview's list, confirmed)."""
    named: dict[str, set[Key]] = {}
    for sid, conv, ex in exchanges:
        named.setdefault(sid, set()).add((conv, ex))
    for sid, keys in named.items():
        path = files.get(sid)
        if path is not None:
            out.add(sid, [s.key for s in _spans(path) if s.key in keys])
    if not out.cuts:
        raise NotFound("none of the named exchanges exists", data={"param": "exchanges"})


def listing(
    layout: ClientLayout, todo: Plan, limit: int = MAX_LISTED
) -> tuple[list[dict[str, Any]], int]:
    """The planned exchanges as people know them (session, conversation, exchange, time,
    title), oldest session first, at most `limit`; and how many more there are."""
    files = dict(session_files(layout))
    out: list[dict[str, Any]] = []
    total = 0
    for sid in sorted(todo.cuts):
        keys = todo.cuts[sid]
        total += len(keys)
        path = files.get(sid)
        for span in _spans(path) if path is not None and len(out) < limit else []:
            if span.key in keys and len(out) < limit:
                out.append(
                    {
                        "session_id": sid,
                        "conversation": span.conversation,
                        "exchange": span.exchange,
                        "time": span.when.strftime("%Y-%m-%dT%H:%M:%SZ"),
                        "title": span.title,
                    }
                )
    return out, total - len(out)
