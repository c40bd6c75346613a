"""Record calls: how `record_exchange` and `record_chat` decide, and where their work runs.

`Recorder` is the part of `ClientSessions` (memd.sessions.tracker) that turns a record
call into a decided, queued change. It decides under the client's decision lock and
queues before letting go, so changes commit in decision order; callers wait for the
group commit after the lock is released. The CPU-heavy part of a big request (over
OFFLOAD_MESSAGES messages or OFFLOAD_CHARS characters: hashing, matching a long history
against the prefix index, rendering) runs in the client's worker thread meanwhile, so
the event loop serves every other client; a `record_chat` of 150k messages had held it
for 12-24 s. A failed write voids the state while such a step runs: the step notices
(`Stale`) and the call decides again on the reloaded state.

While `memory.forget` rewrites the client's files (`ClientSessions.erase`, seconds for a
long chat), record calls are refused at once with `busy` (a retry hint in its data)
instead of queueing behind it: a queued call was answered only after the rewrite and
written even when its caller had given up by then, so a caller that retries on timeout
recorded it twice. A refused call has written nothing; one already deciding finishes
first (the rewrite waits for it).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from typing import Any, TypeVar

from memd.markdown import Part, transcript
from memd.redaction import Scrubbed, Scrubber
from memd.sessions import chat, exchange_keys, scrubbing, sealing
from memd.sessions.book import ACTIVE, Op, title_of
from memd.sessions.core import SessionCore, Stale
from memd.sessions.exchange_keys import Recorded
from memd.sessions.store import Change, Conv, Session

T = TypeVar("T")
OFFLOAD_MESSAGES = 256  # hash, match and render bigger requests in a thread, off the loop
# Clean and escape bigger exchanges in a thread: 7.5 MiB held the event loop for 0.8 s.
OFFLOAD_CHARS = 256 * 1024
# The line a chat call's new exchanges are noted with, by how they join the conversation.
_NOTES = {
    "regenerated": "regenerated reply to exchange {ref}",
    "edited": "edited, branches after exchange {ref}",
    "branch": "branch after exchange {ref}",
}


class Recorder:
    """record_exchange and record_chat over one client's SessionCore; a part of
    ClientSessions, which hands it the core and its `reopen` (memd.sessions.tracker)."""

    def __init__(self, core: SessionCore, reopen: Callable[[Conv], Awaitable[None]]) -> None:
        self._core = core
        self._reopen = reopen

    async def record_exchange(
        self,
        conversation_id: Any,
        user: Any,
        assistant: Any,
        timestamp: Any = None,
        exchange_id: Any = None,
    ) -> dict[str, Any]:
        """mcp_via_llm: append one user/assistant exchange to conversation `conversation_id`.

        An `exchange_id` seen before in it writes nothing: see memd.sessions.exchange_keys.
        """
        chat.check_conversation_id(conversation_id)
        key = exchange_keys.check_exchange_id(exchange_id)
        parts, body, redacted, digest = await self._exchange_input(user, assistant, key)
        when = chat.parse_timestamp(timestamp)
        core = self._core
        while True:
            core.refuse_while_rewriting()
            async with core.deciding:
                await core.wait_ready()
                book = core.book
                conv = book.by_external.get(conversation_id)
                if key is not None and self._recorded(conversation_id, key) is not None:
                    barrier = core.committer.enqueue(Change(), [])
                else:
                    now, op = core.clock(), Op()
                    sess = book.target(conv, now, op)
                    if sess is not None:
                        op.redacted.update(redacted)
                        pending = self._write_exchange(
                            op, sess, conv, conversation_id, key, digest, parts, body, when, now
                        )
                        break
                    barrier = None
            if barrier is None:
                assert conv is not None
                await self._reopen(conv)
                continue
            assert key is not None
            await barrier  # its first call is on disk
            if (seen := self._recorded(conversation_id, key)) is not None:
                return exchange_keys.replay(seen, digest, conversation_id, key, core.layout)
            # its first call failed after all: decide again
        return await pending

    async def _exchange_input(
        self, user: Any, assistant: Any, key: str | None
    ) -> tuple[list[Part], str, Counter[str], bytes]:
        """The exchange's parts, markdown and redactions (in the worker thread when big),
        and the digest its `exchange_id` is kept with (b"" without one)."""
        core = self._core
        big = isinstance(user, str) and isinstance(assistant, str)
        big = big and len(user) + len(assistant) > OFFLOAD_CHARS
        parts, body, redacted = await core.cpu(
            big, _exchange_parts, core.scrubber, user, assistant, core.index_chars
        )
        if key is None:
            return parts, body, redacted, b""
        return (
            parts,
            body,
            redacted,
            exchange_keys.digest(parts[0].text, parts[1].text, core.seal_key),
        )

    def _write_exchange(
        self,
        op: Op,
        sess: Session,
        conv: Conv | None,
        conversation_id: str,
        key: str | None,
        digest: bytes,
        parts: list[Part],
        body: str,
        when: datetime | None,
        now: float,
    ) -> Awaitable[dict[str, Any]]:
        """Decide and queue one exchange (under the decision lock); await for its answer."""
        book = self._core.book
        if conv is None:
            conv = book.by_external[conversation_id] = book.new_conv("mcp", conversation_id)
            conv.title = title_of(parts[0].text)
        stamp = when or _dt(now)
        header = book.header_if_due(sess, conv, stamp)
        conv.exchanges += 1
        block = transcript.exchange_block(
            conv.exchanges, stamp, parts, title=conv.title or "", body=body
        )
        if key is not None:
            op.keys.append(book.keys.add(conv.key, key, digest, sess.session_id, conv.number))
        book.append(op, sess, conv, now, header + block)
        result = {
            "session_id": sess.session_id,
            "conversation": conv.number,
            "path": str(self._core.layout.session_file(sess.session_id)),
            "duplicate": False,
            "redacted": sum(op.redacted.values()),
        }
        return _then(self._core.enqueue(op), result)

    def _recorded(self, conversation_id: str, key: str) -> Recorded | None:
        """What the first call with this key recorded (maybe not on disk yet), or None."""
        book = self._core.book
        conv = book.by_external.get(conversation_id)
        return book.keys.get(conv.key, key) if conv is not None else None

    async def record_chat(
        self, messages: Any, response: Any, timestamp: Any = None, after: Any = None
    ) -> dict[str, Any]:
        """both: record an OpenAI chat call (the messages sent and the reply); see module doc.

        With `after` (the `head` an earlier call returned) `messages` are only what follows
        that recorded point: how a gateway records an API that sends only the new turn."""
        when = chat.parse_timestamp(timestamp)
        base = chat.parse_after(after)
        many = isinstance(messages, list) and len(messages) > OFFLOAD_MESSAGES
        msgs, resp, hashes, size, seen, head = await self._core.cpu(
            many, _prepare, self._core.scrubber, self._core.seal_key, messages, response, base
        )
        core, key = self._core, self._core.seal_key
        sealed_base = sealing.seal(key, sealing.unmask(key, base)) if base is not None else None
        big = len(msgs) > OFFLOAD_MESSAGES or size > OFFLOAD_CHARS
        while True:
            core.refuse_while_rewriting()
            async with core.deciding:
                await core.wait_ready()
                try:
                    pending = await self._decide_chat(
                        msgs, resp, hashes, when, big, (sealed_base, head, seen)
                    )
                except Stale:
                    continue
            if isinstance(pending, Conv):
                await self._reopen(pending)
                continue
            return await pending

    async def _decide_chat(
        self,
        msgs: list[chat.Message],
        resp: chat.Message,
        hashes: list[bytes],
        when: datetime | None,
        big: bool,
        at: tuple[bytes | None, bytes, list[Scrubbed | None]],
    ) -> Awaitable[dict[str, Any]] | Conv:
        """Decide and queue one chat call (under the decision lock): its answer to await,
        or the conversation whose session must be reopened first. `at`: the sealed hash the
        call chains on from (`after`), the masked head to answer, what was redacted."""
        core, (base, head, seen) = self._core, at
        book, generation = core.book, core.generation
        k, kind, key, ref = await core.cpu_fresh(
            generation, big, book.index.classify, msgs, hashes, base
        )
        now, op = core.clock(), Op()
        conv = book.convs[key] if key is not None else None
        if kind == "duplicate":
            assert conv is not None
            return self._duplicate(conv, now, op, head)
        sess = book.target(conv, now, op)
        if sess is None:
            assert conv is not None
            return conv
        if conv is None:
            conv = book.new_conv("chat", None)
        stamp = when or _dt(now)
        header = book.header_if_due(sess, conv, stamp)
        new = [*msgs[k:], resp]
        note = _NOTES.get(kind, "").format(ref=ref)
        join_open = kind == "continuation" and not header and ref == conv.exchanges
        rendered = await core.cpu_fresh(
            generation,
            big,
            _render_chat,
            (book.index, hashes, k, base if kind != "new" else None),  # no dangling parent
            conv,
            msgs if conv.title is None else None,
            chat.RenderPlan(new, conv.exchanges, stamp, note, kind == "new", join_open),
            core.index_chars,
        )
        text, op.nodes, conv.title, conv.exchanges = rendered
        for outcome in filter(None, seen[k:]):  # what this call writes: new messages, reply
            op.redacted.update(outcome.kinds)
        book.append(op, sess, conv, now, header + text)
        result = self._chat_result(conv, kind, len(new), head)
        result["redacted"] = sum(op.redacted.values())
        return _then(core.enqueue(op), result)

    def _duplicate(self, conv: Conv, now: float, op: Op, head: bytes) -> Awaitable[dict[str, Any]]:
        """A retried call: nothing is written; it only counts as activity of a live session."""
        book = self._core.book
        sess = book.sessions.get(conv.session_id or "")
        if sess is not None and sess.state == ACTIVE and not book.end_if_due(sess, now, op):
            book.touch(op, sess, conv, now)
        return _then(self._core.enqueue(op), self._chat_result(conv, "duplicate", 0, head))

    def _chat_result(self, conv: Conv, kind: str, appended: int, head: bytes) -> dict[str, Any]:
        sid = conv.session_id or ""
        return {
            "session_id": sid,
            "conversation": conv.number,
            "new_conversation": kind == "new",
            "appended": appended,
            "match": kind,
            "path": str(self._core.layout.session_file(sid)) if sid else "",
            "head": head.hex(),  # what a later call's `after` names to continue from here
            "redacted": 0,
        }


async def _then(done: Awaitable[None], result: T) -> T:
    await done
    return result


def _exchange_parts(
    scrubber: Scrubber, user: Any, assistant: Any, index_chars: int | None
) -> tuple[list[Part], str, Counter[str]]:
    """The exchange's two parts, checked, cleaned and scrubbed, their markdown, and what
    was redacted by kind (pure: may run in a thread before the call decides anything)."""
    asked, said, kinds = scrubbing.scrub_pair(
        scrubber, chat.require_text(user, "user"), chat.require_text(assistant, "assistant")
    )
    parts = [Part("User", asked), Part("Assistant", said)]
    return parts, transcript.parts_block(parts, index_chars), kinds


def _prepare(
    scrubber: Scrubber, key: bytes, messages: Any, response: Any, after: bytes | None = None
) -> tuple[list[chat.Message], chat.Message, list[bytes], int, list[Scrubbed | None], bytes]:
    """The call scrubbed (memd.sessions.scrubbing), then chat.prepare with hashes sealed
    (memd.sessions.sealing), the request's size in characters (what rendering it costs),
    what was redacted in each message, and the masked head a later `after` names.

    `after` is such a head: unmasked, the chain goes on from the plain hash it hides, so
    the hashes come out as if the whole history had been sent (memd.sessions.sealing)."""
    messages, response, seen = scrubbing.scrub_chat(scrubber, messages, response)
    base = sealing.unmask(key, after) if after is not None else None
    msgs, resp, plain = chat.prepare(messages, response, base)
    size = sum(len(m.key) for m in msgs) + len(resp.key)
    return msgs, resp, sealing.seal_all(key, plain), size, seen, sealing.mask(key, plain[-1])


def _render_chat(
    at: tuple[chat.PrefixIndex, list[bytes], int, bytes | None],
    conv: Conv,
    title_from: list[chat.Message] | None,
    plan: chat.RenderPlan,
    index_chars: int | None,
) -> tuple[str, list[chat.Node], str | None, int]:
    """The markdown of a chat call's new messages, its index nodes, the conversation's
    title and exchange count (may run in the worker thread, under the decision lock).
    `at`: the prefix index, the call's hashes, k and the base they were chained from."""
    index, hashes, k, base = at
    title = conv.title
    if title_from is not None:  # the request carries the whole history: its first question
        title = title_of(chat.first_user_text(title_from))
    text, numbers, exchanges = chat.render(
        plan.new,
        plan.exchanges,
        plan.when,
        plan.note,
        preamble=plan.preamble,
        join_open=plan.join_open,
        title=title or "",
        index_chars=index_chars,
    )
    return text, index.add(hashes, k, numbers, conv.key, base), title, exchanges


def _dt(ts: float) -> datetime:
    return datetime.fromtimestamp(ts, UTC)
