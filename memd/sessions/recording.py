"""Record calls: how `record_exchange` and `record_chat` decide, and where their work runs.

`Recording` is the part of `ClientSessions` (memd.sessions.tracker) that turns a record
call into a decided, queued change. It decides under the client's decision lock and
queues before letting go, so changes commit in decision order; callers wait for the
group commit after the lock is released. The CPU-heavy part of a big request (over
OFFLOAD_MESSAGES messages or OFFLOAD_CHARS characters: hashing, matching a long history
against the prefix index, rendering) runs in the client's worker thread meanwhile, so
the event loop serves every other client; a `record_chat` of 150k messages had held it
for 12-24 s. A failed write voids the state while such a step runs: the step notices
(`_Stale`) and the call decides again on the reloaded state.

While `memory.forget` rewrites the client's files (`ClientSessions.erase`, seconds for a
long chat), record calls are refused at once with `busy` (a retry hint in its data)
instead of queueing behind it: a queued call was answered only after the rewrite and
written even when its caller had given up by then, so a caller that retries on timeout
recorded it twice. A refused call has written nothing; one already deciding finishes
first (the rewrite waits for it).
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from typing import Any, TypeVar

from memd.errors import Busy
from memd.layout import ClientLayout
from memd.markdown import Part, transcript
from memd.redaction import Scrubbed, Scrubber
from memd.sessions import chat, exchange_keys, scrubbing, sealing
from memd.sessions.book import ACTIVE, Op, SessionBook, title_of
from memd.sessions.committer import Committer
from memd.sessions.exchange_keys import Recorded
from memd.sessions.store import Change, Conv, Session, StateStore

T = TypeVar("T")
OFFLOAD_MESSAGES = 256  # hash, match and render bigger requests in a thread, off the loop
# Clean and escape bigger exchanges in a thread: 7.5 MiB held the event loop for 0.8 s.
OFFLOAD_CHARS = 256 * 1024
RETRY_AFTER = 1.0  # seconds: the hint a record refused during a rewrite gets


class _Stale(Exception):
    """The state was voided (a failed write reloads it) while a decision was in a thread."""


class Recording:
    """record_exchange and record_chat; ClientSessions provides the state and the rest."""

    layout: ClientLayout
    _book: SessionBook
    _committer: Committer
    _deciding: asyncio.Lock
    _generation: int
    _ready: asyncio.Event
    _hashing: ThreadPoolExecutor | None
    _index_chars: int | None
    _clock: Callable[[], float]
    scrubber: Scrubber
    _seal_key: bytes
    _disk: StateStore
    _rewriting: int  # rewrites (forget's erase, resync) running or waiting for the lock
    client_id: str

    def _refuse_while_rewriting(self) -> None:
        """Fail fast with `busy` while a rewrite holds or awaits the decision lock."""
        if self._rewriting:
            raise Busy(
                f"memd is forgetting from the memory of client {self.client_id!r}; nothing "
                f"was recorded, retry in {RETRY_AFTER:g} s",
                data={"retry_after": RETRY_AFTER, "client_id": self.client_id},
            )

    async def _wait_ready(self) -> None:
        raise NotImplementedError

    async def _reopen(self, conv: Conv) -> None:
        raise NotImplementedError

    def _enqueue(self, op: Op, *, wait_hooks: bool = False) -> Awaitable[None]:
        raise NotImplementedError

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
        big = isinstance(user, str) and isinstance(assistant, str)
        big = big and len(user) + len(assistant) > OFFLOAD_CHARS
        parts, body, redacted = await self._cpu(
            big, _exchange_parts, self.scrubber, user, assistant, self._index_chars
        )
        when = chat.parse_timestamp(timestamp)
        digest = (
            exchange_keys.digest(parts[0].text, parts[1].text, self._seal_key)
            if key is not None
            else b""
        )
        while True:
            self._refuse_while_rewriting()
            async with self._deciding:
                await self._wait_ready()
                book = self._book
                conv = book.by_external.get(conversation_id)
                if key is not None and self._recorded(conversation_id, key) is not None:
                    barrier = self._committer.enqueue(Change(), [])
                else:
                    now, op = self._clock(), Op()
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
                return exchange_keys.replay(seen, digest, conversation_id, key, self.layout)
            # its first call failed after all: decide again
        return await pending

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
        book = self._book
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
            "path": str(self.layout.session_file(sess.session_id)),
            "duplicate": False,
            "redacted": sum(op.redacted.values()),
        }
        return _then(self._enqueue(op), result)

    def redaction_counts(self) -> dict[str, int]:
        """Secrets redacted on record so far, by kind (what `memd status` shows)."""
        return dict(self._disk.redacted)

    def _recorded(self, conversation_id: str, key: str) -> Recorded | None:
        """What the first call with this key recorded (maybe not on disk yet), or None."""
        conv = self._book.by_external.get(conversation_id)
        return self._book.keys.get(conv.key, key) if conv is not None else None

    async def record_chat(
        self, messages: Any, response: Any, timestamp: Any = None, after: Any = None
    ) -> dict[str, Any]:
        """both: record an OpenAI chat call (the messages sent and the reply); see module doc.

        With `after` (the `head` an earlier call returned) `messages` are only what follows
        that recorded point: how a gateway records an API that sends only the new turn."""
        when = chat.parse_timestamp(timestamp)
        base = chat.parse_after(after)
        many = isinstance(messages, list) and len(messages) > OFFLOAD_MESSAGES
        msgs, resp, hashes, size, seen, head = await self._cpu(
            many, _prepare, self.scrubber, self._seal_key, messages, response, base
        )
        key = self._seal_key
        sealed_base = sealing.seal(key, sealing.unmask(key, base)) if base is not None else None
        big = len(msgs) > OFFLOAD_MESSAGES or size > OFFLOAD_CHARS
        while True:
            self._refuse_while_rewriting()
            async with self._deciding:
                await self._wait_ready()
                try:
                    pending = await self._decide_chat(
                        msgs, resp, hashes, when, big, (sealed_base, head, seen)
                    )
                except _Stale:
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
        book, generation = self._book, self._generation
        base, head, seen = at
        k, kind, key, ref = await self._cpu_fresh(
            generation, big, book.index.classify, msgs, hashes, base
        )
        now, op = self._clock(), Op()
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
        note = {
            "regenerated": f"regenerated reply to exchange {ref}",
            "edited": f"edited, branches after exchange {ref}",
            "branch": f"branch after exchange {ref}",
        }.get(kind, "")
        join_open = kind == "continuation" and not header and ref == conv.exchanges
        rendered = await self._cpu_fresh(
            generation,
            big,
            _render_chat,
            (book.index, hashes, k, base if kind != "new" else None),  # no dangling parent
            conv,
            msgs if conv.title is None else None,
            chat.RenderPlan(new, conv.exchanges, stamp, note, kind == "new", join_open),
            self._index_chars,
        )
        text, op.nodes, conv.title, conv.exchanges = rendered
        for outcome in seen[k:]:  # what this call writes: the new messages and the reply
            if outcome is not None:
                op.redacted.update(outcome.kinds)
        book.append(op, sess, conv, now, header + text)
        result = self._chat_result(conv, kind, len(new), head)
        result["redacted"] = sum(op.redacted.values())
        return _then(self._enqueue(op), result)

    def _duplicate(self, conv: Conv, now: float, op: Op, head: bytes) -> Awaitable[dict[str, Any]]:
        """A retried call: nothing is written; it only counts as activity of a live session."""
        sess = self._book.sessions.get(conv.session_id or "")
        if sess is not None and sess.state == ACTIVE and not self._book.end_if_due(sess, now, op):
            self._book.touch(op, sess, conv, now)
        return _then(self._enqueue(op), self._chat_result(conv, "duplicate", 0, head))

    def _chat_result(self, conv: Conv, kind: str, appended: int, head: bytes) -> dict[str, Any]:
        sid = conv.session_id or ""
        return {
            "session_id": sid,
            "conversation": conv.number,
            "new_conversation": kind == "new",
            "appended": appended,
            "match": kind,
            "path": str(self.layout.session_file(sid)) if sid else "",
            "head": head.hex(),  # what a later call's `after` names to continue from here
            "redacted": 0,
        }

    async def _cpu(self, big: bool, fn: Callable[..., T], *args: Any) -> T:
        """fn(*args) in this client's worker thread when the input is big, else here."""
        if not big or self._hashing is None:
            return fn(*args)
        return await asyncio.get_running_loop().run_in_executor(self._hashing, fn, *args)

    async def _cpu_fresh(self, generation: int, big: bool, fn: Callable[..., T], *args: Any) -> T:
        """`_cpu` within a decision: raises _Stale if the state was voided meanwhile."""
        try:
            result = await self._cpu(big, fn, *args)
        except Exception:
            if self._stale(generation):
                raise _Stale from None  # e.g. the old index's reader was closed under it
            raise
        if self._stale(generation):
            raise _Stale
        return result

    def _stale(self, generation: int) -> bool:
        return generation != self._generation or not self._ready.is_set()


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
