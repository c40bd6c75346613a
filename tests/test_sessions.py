"""Sessions and conversations of one client, with real files, real sqlite and a fake clock."""

from __future__ import annotations

import asyncio
import shutil
import sqlite3
from collections.abc import Iterator
from contextlib import AbstractAsyncContextManager
from pathlib import Path
from typing import Any

import pytest

from memd.errors import StorageError
from memd.layout import ClientLayout
from memd.markdown import transcript
from memd.markdown.transcript import Part
from memd.sessions import chat
from memd.sessions.chat import InvalidRecord
from memd.sessions.tracker import ClientSessions
from tests.support.sessions import T0, Clock, archive, open_sessions, run

# Every test runs twice: with the prefix index all in memory, and with memory for one
# node only, so that nearly every lookup goes to the nodes on disk.
INDEX_CAPACITY: dict[str, int] = {}


@pytest.fixture(
    autouse=True, params=[chat.INDEX_CAPACITY, 1], ids=["index-in-memory", "index-on-disk"]
)
def index_capacity(request: pytest.FixtureRequest) -> Iterator[int]:
    INDEX_CAPACITY["value"] = request.param
    yield request.param
    INDEX_CAPACITY.clear()


def store(root: Path, clock: Clock, **kw: Any) -> AbstractAsyncContextManager[ClientSessions]:
    kw.setdefault("max_minutes", 120)
    kw.setdefault("index_capacity", INDEX_CAPACITY.get("value", chat.INDEX_CAPACITY))
    return open_sessions(root, clock, **kw)


def parse(result: dict[str, Any]) -> transcript.ParsedTranscript:
    return transcript.read_transcript(Path(result["path"]))


def texts(parsed: transcript.ParsedTranscript, number: int | None = None) -> list[str]:
    return [
        p.text
        for c in parsed.conversations
        if number in (None, c.number)
        for e in c.exchanges
        for p in e.parts
    ]


def u(text: Any) -> dict[str, Any]:
    return {"role": "user", "content": text}


def a(text: Any) -> dict[str, Any]:
    return {"role": "assistant", "content": text}


def s(text: str) -> dict[str, Any]:
    return {"role": "system", "content": text}


# --- mcp_via_llm ---------------------------------------------------------------------------


def test_record_exchange_numbers_and_transcript(tmp_path: Path) -> None:
    async def scenario() -> None:
        clock = Clock()
        async with store(tmp_path, clock) as cs:
            r1 = await cs.record_exchange("mcp-a", "first question", "first answer")
            clock.advance(1)
            r2 = await cs.record_exchange("mcp-a", "second question", "second answer")
            r3 = await cs.record_exchange("mcp-b", "other chat", "other answer")
            clock.advance(1)
            r4 = await cs.record_exchange("mcp-a", "third question", "third answer")
        assert r1["session_id"] == r2["session_id"] == r3["session_id"] == r4["session_id"]
        assert (r1["conversation"], r2["conversation"], r3["conversation"], r4["conversation"]) == (
            1,
            1,
            2,
            1,
        )
        assert r1["path"] == str(ClientLayout(tmp_path, "c1").session_file(r1["session_id"]))
        parsed = parse(r1)
        assert parsed.meta["session_id"] == r1["session_id"]
        assert parsed.meta["started"] == "2027-01-15T08:00:00Z"
        heads = [(c.number, c.info) for c in parsed.conversations]
        assert heads == [
            (1, "2027-01-15 08:00:00 UTC"),
            (2, "2027-01-15 08:01:00 UTC"),
            (1, "2027-01-15 08:02:00 UTC, continued"),
        ]
        assert texts(parsed, 1) == [
            "first question",
            "first answer",
            "second question",
            "second answer",
            "third question",
            "third answer",
        ]
        exchanges = [e.number for c in parsed.conversations for e in c.exchanges]
        assert exchanges == [1, 2, 1, 3]
        assert parsed.conversations[0].exchanges[1].parts[0] == Part("User", "second question")

    run(scenario)


@pytest.mark.parametrize(
    ("args", "field"),
    [
        ((None, "u", "a"), "conversation_id"),
        ((7, "u", "a"), "conversation_id"),
        (("", "u", "a"), "conversation_id"),
        (("   ", "u", "a"), "conversation_id"),
        (("x" * 257, "u", "a"), "conversation_id"),
        (("a\nb", "u", "a"), "conversation_id"),
        (("a\x00b", "u", "a"), "conversation_id"),
        (("c", None, "a"), "user"),
        (("c", "u", ["a"]), "assistant"),
        (("c", "u", "a", "yesterday"), "timestamp"),
        (("c", "u", "a", 1700000000), "timestamp"),
        (("c", "u", "a", "2026-13-01T00:00:00Z"), "timestamp"),
    ],
)
def test_record_exchange_rejects_bad_input(
    tmp_path: Path, args: tuple[Any, ...], field: str
) -> None:
    async def scenario() -> None:
        async with store(tmp_path, Clock()) as cs:
            with pytest.raises(InvalidRecord) as caught:
                await cs.record_exchange(*args)
            assert caught.value.field == field
            assert caught.value.to_dict()["code"] == -32602
            assert await cs.list_sessions() == []  # nothing was started

    run(scenario)


def test_conversation_id_is_only_data(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with store(tmp_path, Clock()) as cs:
            r1 = await cs.record_exchange("../../../etc/passwd", "u1", "a1")
            r2 = await cs.record_exchange("/abs/path\\win", "u2", "a2")
            r3 = await cs.record_exchange("../../../etc/passwd", "u3", "a3")
        assert (r1["conversation"], r2["conversation"], r3["conversation"]) == (1, 2, 1)
        files = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*") if p.is_file())
        assert [str(p) for p in files if "sessions" in str(p)] == [
            f"c1/sessions/{r1['session_id']}.md"
        ]
        assert "passwd" not in Path(r1["path"]).read_text()

    run(scenario)


def test_timestamp_labels_the_exchange_only(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with store(tmp_path, Clock()) as cs:
            r = await cs.record_exchange("c", "u", "a", "2020-01-02T03:04:05+02:00")
            await cs.record_exchange("c", "u", "a", "2020-01-02T03:04:05")
            await cs.record_exchange("c", "u", "a", "2020-01-02T03:04:05.123Z")
        assert r["session_id"].startswith("2027-01-15T08-00-00Z")  # sessions follow the clock
        times = [e.when.isoformat() for c in parse(r).conversations for e in c.exchanges]
        assert times == [
            "2020-01-02T01:04:05+00:00",
            "2020-01-02T03:04:05+00:00",
            "2020-01-02T03:04:05+00:00",
        ]
        assert parse(r).conversations[0].info == "2020-01-02 01:04:05 UTC"

    run(scenario)


# --- both: conversation detection ----------------------------------------------------------


def test_new_then_continuations_append_only_new_messages(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with store(tmp_path, Clock()) as cs:
            history = [s("You are terse."), u("hi")]
            r1 = await cs.record_chat(history, a("hello"))
            history += [a("hello"), u("how are you")]
            r2 = await cs.record_chat(history, a("fine"))
            history += [a("fine"), u("bye")]
            r3 = await cs.record_chat(history, {"content": "ciao"})
        assert (r1["new_conversation"], r1["appended"], r1["match"]) == (True, 3, "new")
        assert (r2["new_conversation"], r2["appended"], r2["match"]) == (False, 2, "continuation")
        assert (r3["appended"], r3["conversation"]) == (2, 1)
        parsed = parse(r1)
        assert [c.number for c in parsed.conversations] == [1]
        assert parsed.conversations[0].preamble == [Part("System", "You are terse.")]
        assert texts(parsed) == ["hi", "hello", "how are you", "fine", "bye", "ciao"]

    run(scenario)


def test_regenerate_is_marked_and_nothing_is_duplicated(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with store(tmp_path, Clock()) as cs:
            await cs.record_chat([u("q1")], a("a1"))
            request = [u("q1"), a("a1"), u("q2")]
            await cs.record_chat(request, a("a2"))
            regen = await cs.record_chat(request, a("a2, take two"))
            again = await cs.record_chat(request, a("a2, take two"))  # a retried call
            after = await cs.record_chat([*request, a("a2, take two"), u("q3")], a("a3"))
        assert (regen["match"], regen["appended"], regen["new_conversation"]) == (
            "regenerated",
            1,
            False,
        )
        assert (again["match"], again["appended"]) == ("duplicate", 0)
        assert (after["match"], after["appended"]) == ("continuation", 2)
        parsed = parse(regen)
        assert texts(parsed) == ["q1", "a1", "q2", "a2", "a2, take two", "q3", "a3"]
        notes = [(e.number, e.note) for e in parsed.conversations[0].exchanges]
        assert notes == [(1, ""), (2, ""), (3, "regenerated reply to exchange 2"), (4, "")]

    run(scenario)


def test_edited_last_user_message_branches_in_the_same_conversation(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with store(tmp_path, Clock()) as cs:
            await cs.record_chat([u("q1")], a("a1"))
            await cs.record_chat([u("q1"), a("a1"), u("q2 with a typo")], a("a2"))
            edit = await cs.record_chat([u("q1"), a("a1"), u("q2 fixed")], a("a2 fixed"))
            on_edit = await cs.record_chat(
                [u("q1"), a("a1"), u("q2 fixed"), a("a2 fixed"), u("q3")], a("a3")
            )
            old = await cs.record_chat(  # back on the original branch
                [u("q1"), a("a1"), u("q2 with a typo"), a("a2"), u("q3'")], a("a3'")
            )
        assert (edit["match"], edit["appended"], edit["conversation"]) == ("edited", 2, 1)
        assert (on_edit["match"], on_edit["appended"]) == ("continuation", 2)
        assert (old["match"], old["appended"], old["conversation"]) == ("continuation", 2, 1)
        parsed = parse(edit)
        assert len(parsed.conversations) == 1
        assert texts(parsed) == [
            "q1",
            "a1",
            "q2 with a typo",
            "a2",
            "q2 fixed",
            "a2 fixed",
            "q3",
            "a3",
            "q3'",
            "a3'",
        ]
        notes = [e.note for e in parsed.conversations[0].exchanges]
        assert notes == ["", "", "edited, branches after exchange 1", "", ""]

    run(scenario)


def test_changed_system_prompt_starts_a_new_conversation(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with store(tmp_path, Clock()) as cs:
            r1 = await cs.record_chat([s("Be formal."), u("hi")], a("Good day."))
            r2 = await cs.record_chat([s("Be casual."), u("hi")], a("hey"))
            r3 = await cs.record_chat([s("Be formal."), u("something else")], a("Indeed."))
            r4 = await cs.record_chat([s("Be casual."), u("hi"), a("hey"), u("sup")], a("nm"))
        assert [r["conversation"] for r in (r1, r2, r3, r4)] == [1, 2, 3, 2]
        assert [r["new_conversation"] for r in (r1, r2, r3, r4)] == [True, True, True, False]
        preambles = [c.preamble for c in parse(r1).conversations]
        assert preambles == [
            [Part("System", "Be formal.")],
            [Part("System", "Be casual.")],
            [Part("System", "Be formal.")],
            [],
        ]

    run(scenario)


def test_tool_messages_stay_in_their_exchange_and_read_back(tmp_path: Path) -> None:
    call = {
        "id": "call_1",
        "type": "function",
        "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
    }
    asked = [s("Use tools."), u("Weather in Paris?")]
    tool_turn = {"role": "assistant", "content": None, "tool_calls": [call]}
    result = {"role": "tool", "tool_call_id": "call_1", "content": "18°C, sunny"}

    async def scenario() -> None:
        async with store(tmp_path, Clock()) as cs:
            r1 = await cs.record_chat(asked, tool_turn)
            # the client re-serialises the arguments: still the same message
            resent = {
                **tool_turn,
                "tool_calls": [
                    {**call, "function": {"name": "get_weather", "arguments": '{"city":"Paris"}'}}
                ],
            }
            r2 = await cs.record_chat([*asked, resent, result], a("It is 18°C and sunny."))
            r3 = await cs.record_chat(
                [
                    *asked,
                    tool_turn,
                    result,
                    a("It is 18°C and sunny."),
                    {"role": "function", "name": "legacy", "content": "old style"},
                    u("thanks"),
                ],
                {
                    "role": "assistant",
                    "content": "",
                    "function_call": {"name": "noop", "arguments": "{}"},
                },
            )
        assert (r2["match"], r2["appended"]) == ("continuation", 2)
        assert (r3["match"], r3["appended"]) == ("continuation", 3)
        exchanges = parse(r1).conversations[0].exchanges
        assert [e.number for e in exchanges] == [1, 2]
        assert exchanges[0].parts == [
            Part("User", "Weather in Paris?"),
            Part("Tool call (get_weather · call_1)", '{"city": "Paris"}'),
            Part("Tool (call_1)", "18°C, sunny"),
            Part("Assistant", "It is 18°C and sunny."),
            Part("Function (legacy)", "old style"),  # a result: it belongs to the open turn
        ]
        assert exchanges[1].parts == [Part("User", "thanks"), Part("Function call (noop)", "{}")]

    run(scenario)


def test_list_of_parts_content_matches_string_content(tmp_path: Path) -> None:
    parts = [
        {"type": "text", "text": "Look at"},
        {"type": "text", "text": "this picture"},
        {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}},
        {"type": "image_url", "image_url": {"url": "https://example.org/cat.png"}},
        {"type": "input_audio", "input_audio": {"data": "AAAA", "format": "wav"}},
    ]

    async def scenario() -> None:
        async with store(tmp_path, Clock()) as cs:
            r1 = await cs.record_chat([u(parts)], a([{"type": "text", "text": "A cat."}]))
            r2 = await cs.record_chat([u(parts), a("A cat."), u("cute?")], a("Very."))
            other = [
                *parts[:2],
                {"type": "image_url", "image_url": {"url": "data:image/png;base64,BBBB"}},
            ]
            r3 = await cs.record_chat([u(other)], a("A dog."))  # another image: another chat
        assert (r2["match"], r2["appended"]) == ("continuation", 2)
        assert r3["new_conversation"]
        got = parse(r1).conversations[0].exchanges[0].parts
        assert got == [
            Part(
                "User",
                "Look at\nthis picture\n[image]\n"
                "[image: https://example.org/cat.png]\n[input_audio]",
            ),
            Part("Assistant", "A cat."),
        ]

    run(scenario)


def test_whitespace_and_normalisation_changes_still_continue(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with store(tmp_path, Clock()) as cs:
            await cs.record_chat([u("Hello   world\n\n")], a("Caf\u00e9 ok"))
            r = await cs.record_chat(
                [u(" Hello world"), a("Cafe\u0301 ok\r\n"), u("next")], a("done")
            )
        assert (r["match"], r["appended"]) == ("continuation", 2)

    run(scenario)


def test_two_chats_that_open_identically(tmp_path: Path) -> None:
    """Indistinguishable from a regenerate: one conversation, each tab on its own leaf."""

    async def scenario() -> None:
        async with store(tmp_path, Clock()) as cs:
            t1 = await cs.record_chat([u("hi")], a("Hello! How can I help?"))
            t2 = await cs.record_chat([u("hi")], a("Hello! How can I help?"))
            t1b = await cs.record_chat(
                [u("hi"), a("Hello! How can I help?"), u("tab one")], a("one")
            )
            t2b = await cs.record_chat(
                [u("hi"), a("Hello! How can I help?"), u("tab two")], a("two")
            )
            t1c = await cs.record_chat(
                [u("hi"), a("Hello! How can I help?"), u("tab one"), a("one"), u("more one")],
                a("one again"),
            )
            t2c = await cs.record_chat(
                [u("hi"), a("Hello! How can I help?"), u("tab two"), a("two"), u("more two")],
                a("two again"),
            )
        assert t2["match"] == "duplicate" and t2["appended"] == 0
        assert (t1b["match"], t2b["match"]) == ("continuation", "edited")
        assert (t1c["match"], t1c["appended"], t2c["match"], t2c["appended"]) == (
            "continuation",
            2,
            "continuation",
            2,
        )
        assert {r["conversation"] for r in (t1, t2, t1b, t2b, t1c, t2c)} == {1}
        assert texts(parse(t1)) == [
            "hi",
            "Hello! How can I help?",
            "tab one",
            "one",
            "tab two",
            "two",
            "more one",
            "one again",
            "more two",
            "two again",
        ]

    run(scenario)


def test_two_live_chats_interleave_with_repeated_headers(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with store(tmp_path, Clock()) as cs:
            x = [s("sys"), u("about cats")]
            y = [s("sys"), u("about dogs")]
            r = [await cs.record_chat(x, a("cats!")), await cs.record_chat(y, a("dogs!"))]
            x += [a("cats!"), u("more cats")]
            y += [a("dogs!"), u("more dogs")]
            r += [await cs.record_chat(x, a("meow")), await cs.record_chat(y, a("woof"))]
        assert [q["conversation"] for q in r] == [1, 2, 1, 2]
        assert [q["new_conversation"] for q in r] == [True, True, False, False]
        parsed = parse(r[0])
        assert [c.number for c in parsed.conversations] == [1, 2, 1, 2]
        assert texts(parsed, 1) == ["about cats", "cats!", "more cats", "meow"]
        assert texts(parsed, 2) == ["about dogs", "dogs!", "more dogs", "woof"]

    run(scenario)


def test_continuation_after_ten_thousand_messages(tmp_path: Path) -> None:
    history: list[dict[str, Any]] = [s("long")]
    for i in range(5000):
        history += [u(f"question {i}"), a(f"answer {i}")]

    async def scenario() -> None:
        async with store(tmp_path, Clock()) as cs:
            first = await cs.record_chat(history[:-1], history[-1])
            assert (first["new_conversation"], first["appended"]) == (True, 10001)
            r = await cs.record_chat([*history, u("question 5000")], a("answer 5000"))
            assert (r["match"], r["appended"], r["conversation"]) == ("continuation", 2, 1)
            regen = await cs.record_chat([*history, u("question 5000")], a("answer 5000 bis"))
            assert (regen["match"], regen["appended"]) == ("regenerated", 1)
        exchanges = parse(r).conversations[0].exchanges
        assert len(exchanges) == 5002
        assert exchanges[-2].parts == [
            Part("User", "question 5000"),
            Part("Assistant", "answer 5000"),
        ]

    run(scenario)


def test_unicode_round_trips_through_chat(tmp_path: Path) -> None:
    words = [
        "😀 𝕏 𝄞 🧑‍🚀",
        "שלום עולם — مرحبا",
        "e\u0301 n\u0303 Z\u0336",
        "# Conversation 3 (x)",
        "---",
        "## 2026-11-30 02:41:07 UTC · exchange 9",
    ]

    async def scenario() -> None:
        async with store(tmp_path, Clock()) as cs:
            r = await cs.record_chat([u(words[0])], a(words[1]))
            r2 = await cs.record_chat(
                [u(words[0]), a(words[1]), u("\n".join(words[2:4]))], a("\n".join(words[4:]))
            )
            r3 = await cs.record_exchange(words[3], words[4], words[5])
        assert r2["match"] == "continuation"
        assert r3["conversation"] == 2
        parsed = parse(r)
        assert texts(parsed) == [
            words[0],
            words[1],
            "\n".join(words[2:4]),
            "\n".join(words[4:]),
            words[4],
            words[5],
        ]
        assert [c.number for c in parsed.conversations] == [1, 2]

    run(scenario)


@pytest.mark.parametrize(
    ("messages", "response", "field"),
    [
        ("hi", a("x"), "messages"),
        ([], a("x"), "messages"),
        ([{"content": "no role"}], a("x"), "messages[0].role"),
        ([{"role": "wizard", "content": "x"}], a("x"), "messages[0].role"),
        ([u(3)], a("x"), "messages[0].content"),
        ([u([{"text": "no type"}])], a("x"), "messages[0].content[0]"),
        ([u([{"type": "text", "text": 5}])], a("x"), "messages[0].content[0]"),
        (
            [u("x"), {"role": "assistant", "content": "", "tool_calls": "no"}],
            a("x"),
            "messages[1].tool_calls",
        ),
        (
            [u("x"), {"role": "assistant", "tool_calls": [{"function": {}}]}],
            a("x"),
            "messages[1].tool_calls[0]",
        ),
        ([{"role": "user", "content": "x", "name": 5}], a("x"), "messages[0].name"),
        ([u("x")], {"role": "user", "content": "x"}, "response.role"),
        ([u("x")], "text", "response"),
        ([u("x")], {"choices": [{"message": a("x")}]}, "response"),
    ],
)
def test_record_chat_rejects_bad_input(
    tmp_path: Path, messages: Any, response: Any, field: str
) -> None:
    async def scenario() -> None:
        async with store(tmp_path, Clock()) as cs:
            with pytest.raises(InvalidRecord) as caught:
                await cs.record_chat(messages, response)
            assert caught.value.field == field
            with pytest.raises(InvalidRecord):
                await cs.record_chat([u("x")], a("y"), timestamp="not a time")
            assert await cs.list_sessions() == []

    run(scenario)


# --- session rules -------------------------------------------------------------------------


def test_monitor_ends_sessions_by_inactivity_and_by_maximum_duration(tmp_path: Path) -> None:
    async def scenario() -> None:
        clock = Clock()
        ended: list[dict[str, Any]] = []
        async with store(
            tmp_path, clock, inactivity_minutes=10, max_minutes=25, on_end=[ended.append]
        ) as cs:
            r1 = await cs.record_exchange("c", "u", "a")
            clock.advance(9.9)
            assert await cs.expire() == []
            clock.advance(0.2)
            [info] = await cs.expire()
            assert (info["session_id"], info["state"], info["end_reason"]) == (
                r1["session_id"],
                "ended",
                "inactivity",
            )
            assert info["ended"] == "2027-01-15T08:10:00Z"  # at the deadline, not when noticed
            assert await cs.expire() == []
            # busy session: activity every 8 minutes never idles, but 25 minutes is the cap
            # (a new conversation: "c" would reopen its own session)
            r2 = await cs.record_exchange("d", "u", "a")
            for _ in range(3):
                clock.advance(8)
                assert await cs.expire() == []
                await cs.record_exchange("d", "u", "a")
            clock.advance(1.5)  # 25.5 minutes since the start
            [info2] = await cs.expire(clock.t)
            assert (info2["session_id"], info2["end_reason"]) == (r2["session_id"], "max_duration")
            started = transcript.iso(T0 + 10.1 * 60)
            assert info2["started"] == started
            assert info2["ended"] == transcript.iso(T0 + 10.1 * 60 + 25 * 60)
            assert [e["session_id"] for e in ended] == [r1["session_id"], r2["session_id"]]
            states = [(x["session_id"], x["state"]) for x in await cs.list_sessions()]
            assert states == [(r1["session_id"], "ended"), (r2["session_id"], "ended")]

    run(scenario)


def test_fractional_minutes_and_set_limits_at_runtime(tmp_path: Path) -> None:
    async def scenario() -> None:
        clock = Clock()
        async with store(tmp_path, clock, inactivity_minutes=0.05, max_minutes=60) as cs:
            await cs.record_exchange("c", "u", "a")
            clock.t += 2.9
            assert await cs.expire() == []
            clock.t += 0.2  # 3.1 s > 0.05 min
            assert len(await cs.expire()) == 1
            await cs.record_exchange("c", "u", "a")
            cs.set_limits(inactivity_minutes=120, max_minutes=1)
            clock.advance(0.5)
            assert await cs.expire() == []
            clock.advance(0.6)
            [info] = await cs.expire()
            assert info["end_reason"] == "max_duration"
            with pytest.raises(ValueError):
                cs.set_limits(0, 5)

    run(scenario)


def test_close_active_list_sessions_and_hooks(tmp_path: Path) -> None:
    async def scenario() -> None:
        clock = Clock()
        calls: list[str] = []

        def broken(info: dict[str, Any]) -> None:
            raise RuntimeError("hook bug")

        async def slow(info: dict[str, Any]) -> None:
            await asyncio.sleep(0.01)
            calls.append(info["session_id"])

        async with store(tmp_path, clock, on_end=[broken, slow]) as cs:
            assert await cs.close_active() == []
            assert cs.active_session() is None and cs.active_sessions() == []
            r = await cs.record_exchange("c", "u", "a")
            active = cs.active_session()
            assert active is not None and active["expires"] == "2027-01-15T08:30:00Z"
            clock.advance(2)
            [info] = await cs.close_active()
            assert (info["state"], info["end_reason"], info["ended"]) == (
                "ended",
                "closed",
                "2027-01-15T08:02:00Z",
            )
            assert calls == [r["session_id"]]  # hooks ran (the broken one only logged)
            [listed] = await cs.list_sessions()
            assert listed == {k: v for k, v in info.items()}
            assert listed["path"] == r["path"] and listed["conversations"] == 1
            r2 = await cs.record_exchange("d", "u", "a")
            assert r2["session_id"] != r["session_id"]

    run(scenario)


# --- durability ----------------------------------------------------------------------------


def test_restart_keeps_session_conversations_and_expiry(tmp_path: Path) -> None:
    async def scenario() -> None:
        clock = Clock()
        async with store(tmp_path, clock, inactivity_minutes=10) as cs:
            r1 = await cs.record_exchange("mcp", "u1", "a1")
            await cs.record_exchange("other", "u", "a")
            c1 = await cs.record_chat([s("sys"), u("q1")], a("a1"))
            clock.advance(3)
            await cs.record_chat([s("sys"), u("q1"), a("a1"), u("q2")], a("a2"))
        clock.advance(1)
        async with store(tmp_path, clock, inactivity_minutes=10) as cs:
            r2 = await cs.record_exchange("mcp", "u2", "a2")
            c2 = await cs.record_chat(
                [s("sys"), u("q1"), a("a1"), u("q2"), a("a2"), u("q3")], a("a3")
            )
            regen = await cs.record_chat([s("sys"), u("q1"), a("a1"), u("q2")], a("a2 bis"))
        assert (r2["session_id"], r2["conversation"]) == (r1["session_id"], 1)
        assert (c2["session_id"], c2["conversation"], c2["match"]) == (
            c1["session_id"],
            3,
            "continuation",
        )
        assert regen["match"] == "regenerated"
        clock.advance(9.9)  # 10 minutes after the last activity, which was before the restart
        async with store(tmp_path, clock, inactivity_minutes=10) as cs:
            assert await cs.expire() == []
            clock.advance(0.2)
            [info] = await cs.expire()
            assert info["ended"] == transcript.iso(T0 + 14 * 60)
        parsed = parse(r1)
        assert [c.number for c in parsed.conversations] == [1, 2, 3, 1, 3]
        assert texts(parsed, 3) == ["q1", "a1", "q2", "a2", "q3", "a3", "a2 bis"]

    run(scenario)


def test_restart_cuts_unacknowledged_tail_and_removes_orphan_file(tmp_path: Path) -> None:
    layout = ClientLayout(tmp_path, "c1")

    async def scenario() -> None:
        clock = Clock()
        async with store(tmp_path, clock) as cs:
            r = await cs.record_exchange("mcp", "u1", "a1")
        path = Path(r["path"])
        good = path.read_bytes()
        # what a crash between the transcript fsync and the state commit leaves behind
        with open(path, "ab") as fh:
            fh.write(b"## 2027-01-15 08:00:00 UTC \xc2\xb7 exchange 2\n\n**User:** lost")
        orphan_id = "2099-01-01T00-00-00Z-abcd"
        layout.session_file(orphan_id).write_text(
            transcript.front_matter("c1", orphan_id, T0) + "# Conversation 1 (x)\n"
        )
        notes = layout.sessions / "2099-01-01T00-00-00Z-ffff.md"
        notes.write_text("# the user's own notes\n")
        async with store(tmp_path, clock) as cs:
            assert path.read_bytes() == good
            assert not layout.session_file(orphan_id).exists()
            assert notes.exists()
            r2 = await cs.record_exchange("mcp", "u2", "a2")
        assert r2["session_id"] == r["session_id"]
        assert [e.number for e in parse(r).conversations[0].exchanges] == [1, 2]
        assert texts(parse(r)) == ["u1", "a1", "u2", "a2"]

    run(scenario)


def test_lost_state_database_never_deletes_transcripts(tmp_path: Path) -> None:
    layout = ClientLayout(tmp_path, "c1")

    async def scenario() -> None:
        async with store(tmp_path, Clock()) as cs:
            r = await cs.record_exchange("mcp", "u1", "a1")
        shutil.rmtree(layout.state_dir)
        async with store(tmp_path, Clock(T0 + 60)) as cs:
            r2 = await cs.record_exchange("mcp", "u2", "a2")
        assert Path(r["path"]).exists() and r2["session_id"] != r["session_id"]

    run(scenario)


def test_user_deleting_the_active_transcript(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with store(tmp_path, Clock()) as cs:
            r = await cs.record_exchange("mcp", "private", "secret")
            Path(r["path"]).unlink()
            r2 = await cs.record_exchange("mcp", "u2", "a2")
        assert r2["session_id"] == r["session_id"]
        parsed = parse(r)
        assert parsed.meta["session_id"] == r["session_id"]
        assert texts(parsed) == ["u2", "a2"]

    run(scenario)


def test_concurrent_records_never_interleave(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with store(tmp_path, Clock()) as cs:

            async def one(i: int) -> dict[str, Any]:
                body = "\n".join(f"line {j} of {i}" for j in range(i % 7 + 1))
                return await cs.record_exchange(
                    f"conv-{i % 8}", f"user {i}\n{body}", f"assistant {i}\n{body}"
                )

            results = await asyncio.gather(*(one(i) for i in range(400)))
            chats = await asyncio.gather(
                *(cs.record_chat([u(f"chat {i}")], a(f"reply {i}")) for i in range(50))
            )
        assert len({r["session_id"] for r in results}) == 1
        assert all(c["new_conversation"] for c in chats)
        parsed = parse(results[0])
        users = [
            p.text.split("\n")[0]
            for c in parsed.conversations
            for e in c.exchanges
            for p in e.parts
            if p.label == "User"
        ]
        assert sorted(users) == sorted(
            [f"user {i}" for i in range(400)] + [f"chat {i}" for i in range(50)]
        )
        for c in parsed.conversations:
            for e in c.exchanges:
                i = e.parts[0].text.split("\n")[0].split()[-1]
                assert all(p.text.split("\n")[0].endswith(f" {i}") for p in e.parts)
        per_conv: dict[int, list[int]] = {}
        for c in parsed.conversations:
            per_conv.setdefault(c.number, []).extend(e.number for e in c.exchanges)
        assert all(nums == list(range(1, len(nums) + 1)) for nums in per_conv.values())

    run(scenario)


def test_failed_write_fails_the_call_and_the_store_recovers(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with store(tmp_path, Clock()) as cs:
            r = await cs.record_exchange("mcp", "u1", "a1")
            path = Path(r["path"])
            saved = path.read_bytes()
            path.unlink()
            path.mkdir()  # the next append cannot open the transcript
            with pytest.raises(StorageError):
                await cs.record_exchange("mcp", "u2", "a2")
            path.rmdir()
            path.write_bytes(saved)
            r3 = await cs.record_exchange("mcp", "u3", "a3")
        assert r3["session_id"] == r["session_id"]
        assert texts(parse(r)) == ["u1", "a1", "u3", "a3"]
        assert [e.number for e in parse(r).conversations[0].exchanges] == [1, 2]

    run(scenario)


def test_closed_store_refuses_calls(tmp_path: Path) -> None:
    async def scenario() -> None:
        cs = ClientSessions(ClientLayout(tmp_path, "c1"))
        with pytest.raises(StorageError):
            await cs.record_exchange("c", "u", "a")
        await cs.open()
        await cs.close()
        await cs.close()
        with pytest.raises(StorageError):
            await cs.list_sessions()

    run(scenario)


def _titles(result: dict[str, Any]) -> list[tuple[int, int, str]]:
    parsed = parse(result)
    return [(c.number, e.number, e.title) for c in parsed.conversations for e in c.exchanges]


def test_title_in_every_exchange_heading_survives_restart(tmp_path: Path) -> None:
    async def scenario() -> None:
        clock = Clock()
        async with store(tmp_path, clock) as cs:
            r = await cs.record_exchange("mcp", "How do I rotate\nthe API keys?", "Like so.")
            await cs.record_exchange("mcp", "and for staging?", "Same.")
            history = [s("sys"), u("Which sqlite pragma is safest?"), a("FULL")]
            await cs.record_chat(history[:2], history[2])
            await cs.record_exchange("mcp", "and in prod?", "Carefully.")
        clock.advance(1)
        async with store(tmp_path, clock) as cs:
            await cs.record_exchange("mcp", "thanks", "welcome")
            await cs.record_chat([*history, u("why?")], a("durability"))
            await cs.record_chat([*history, u("why?")], a("durability, again"))  # regenerated
        keys, pragma = "How do I rotate the API keys?", "Which sqlite pragma is safest?"
        assert _titles(r) == [
            (1, 1, keys),
            (1, 2, keys),
            (2, 1, pragma),
            (1, 3, keys),
            (1, 4, keys),
            (2, 2, pragma),
            (2, 3, pragma),
        ]
        assert parse(r).conversations[-1].exchanges[-1].note == "regenerated reply to exchange 2"

    run(scenario)


def test_title_survives_archive_and_resume(tmp_path: Path) -> None:
    async def scenario() -> None:
        clock = Clock()
        layout = ClientLayout(tmp_path, "c1")
        async with store(tmp_path, clock) as cs:
            r = await cs.record_exchange("mcp", "Kubernetes upgrade plan", "step one")
            await cs.close_active()
        archive(layout, r["session_id"])
        async with store(tmp_path, clock) as cs:
            await cs.mark_compacted(r["session_id"])
        clock.advance(60)
        async with store(tmp_path, clock) as cs:
            r2 = await cs.record_exchange("mcp", "and then?", "step two")
        assert r2["session_id"] == r["session_id"]
        assert [t for _, _, t in _titles(r)] == ["Kubernetes upgrade plan"] * 2

    run(scenario)


def test_long_first_message_is_kept_only_as_its_title(tmp_path: Path) -> None:
    """memd keeps every conversation in memory: a megabyte-long first message must not
    stay there (or in the state database) whole, only the title its headings show."""
    long_question = "Please review this log " + "line after line " * 70_000
    title = transcript.conversation_title(long_question)

    async def scenario() -> None:
        clock = Clock()
        async with store(tmp_path, clock) as cs:
            r = await cs.record_exchange("mcp", long_question, "ok")
            await cs.record_chat([u(long_question)], a("ok"))
        async with store(tmp_path, clock) as cs:
            await cs.record_exchange("mcp", "and?", "done")
        assert _titles(r) == [(1, 1, title), (2, 1, title), (1, 2, title)]

    run(scenario)
    db = sqlite3.connect(tmp_path / "c1" / ".memd" / "state.sqlite3")
    stored = [row[0] for row in db.execute("SELECT title FROM conversations")]
    db.close()
    assert stored == [title, title]
    assert len(title) <= 70


def test_state_database_without_title_column_is_migrated(tmp_path: Path) -> None:
    async def scenario() -> None:
        clock = Clock()
        async with store(tmp_path, clock) as cs:
            r = await cs.record_exchange("old", "old question", "old answer")
        db = sqlite3.connect(tmp_path / "c1" / ".memd" / "state.sqlite3")
        db.execute("ALTER TABLE conversations DROP COLUMN title")
        db.commit()
        db.close()
        async with store(tmp_path, clock) as cs:
            await cs.record_exchange("old", "follow-up", "answer")  # title unknown: none
            await cs.record_exchange("new", "fresh topic", "answer")
        async with store(tmp_path, clock) as cs:
            await cs.record_exchange("new", "more", "answer")
        assert _titles(r) == [
            (1, 1, "old question"),
            (1, 2, ""),
            (2, 1, "fresh topic"),
            (2, 2, "fresh topic"),
        ]

    run(scenario)
