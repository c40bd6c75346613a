"""MemoryRecall: arguments, labels, the char budget, isolation, and recall against a real index.

Unit tests build `Hit`s and transcripts by hand; the integration tests record with
`ClientSessions` (the real recording code), index with a real index server and
`memsearch watch` (tests/support/index.py) and recall through `memd.recall`. The JSON-RPC
methods and `memd recall` are tested against a real daemon in tests/test_recall_daemon.py.
"""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from memd import recall as rc
from memd.config import EmbeddingConfig, RecallConfig
from memd.indexing.query.search import Hit, IndexSearcher, IndexUnavailableError
from memd.indexing.targets import IndexTarget
from memd.layout import ClientLayout
from memd.markdown.summary import render_summary
from memd.recall import service
from memd.sessions.tracker import ClientSessions
from tests.support.embedder import EmbedderChild
from tests.support.index import ClientIndex, client_config
from tests.support.samples import ALICE, BOB

NOW = datetime(2026, 11, 30, 12, 0, 0, tzinfo=UTC)


# -- arguments --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("2026-11-01", datetime(2026, 11, 1, tzinfo=UTC)),
        ("2026-11-01T14:00", datetime(2026, 11, 1, 14, 0, tzinfo=UTC)),
        ("2026-11-01 14:00:30", datetime(2026, 11, 1, 14, 0, 30, tzinfo=UTC)),
        ("2026-11-01T14:00:00Z", datetime(2026, 11, 1, 14, 0, tzinfo=UTC)),
        ("2026-11-01T14:00+02:00", datetime(2026, 11, 1, 12, 0, tzinfo=UTC)),
        ("  2026-11-01T14:00:00-05:30 ", datetime(2026, 11, 1, 19, 30, tzinfo=UTC)),
        ("30m", NOW - timedelta(minutes=30)),
        ("6h", NOW - timedelta(hours=6)),
        ("2d", NOW - timedelta(days=2)),
        ("1w", NOW - timedelta(weeks=1)),
        ("1.5h", NOW - timedelta(minutes=90)),
        ("2D ago", NOW - timedelta(days=2)),
    ],
)
def test_parse_time_accepts_iso_and_relative_forms(text: str, expected: datetime) -> None:
    assert rc.parse_time(text, "after", NOW) == expected


@pytest.mark.parametrize(
    "value",
    [
        "yesterday",
        "5x",
        "2026-13-01",
        "30 minutes",
        "-2d",
        "",
        "   ",
        5,
        None,
        ["2d"],
        "9" * 30 + "w",
    ],
)
def test_parse_time_rejects_with_the_accepted_forms(value: Any) -> None:
    with pytest.raises(rc.RecallArgumentError) as err:
        rc.parse_time(value, "before", NOW)
    assert err.value.param == "before"
    message = err.value.message
    assert "before" in message
    if "too far back" not in message:
        for form in ("2026-11-01", "2026-11-01T14:00", "30m", "6h", "2d", "1w"):
            assert form in message


def test_parse_arguments_defaults_and_forgiven_top_k() -> None:
    args = rc.parse_arguments({"query": "  tomatoes  "}, 5, NOW)
    assert args == rc.RecallArgs("tomatoes", 5, None, None)
    assert rc.parse_arguments({"query": "q", "top_k": "7"}, 5, NOW).top_k == 7
    assert rc.parse_arguments({"query": "q", "top_k": 3.0}, 5, NOW).top_k == 3
    assert rc.parse_arguments({"query": "q", "after": "", "before": None}, 5, NOW).after is None
    both = rc.parse_arguments({"query": "q", "after": "2d", "before": "1h"}, 5, NOW)
    assert both.after == NOW - timedelta(days=2) and both.before == NOW - timedelta(hours=1)


@pytest.mark.parametrize(
    ("arguments", "param", "fragment"),
    [
        ({}, "query", "non-empty"),
        ({"query": "   "}, "query", "non-empty"),
        ({"query": 42}, "query", "non-empty"),
        ({"query": "x" * (rc.MAX_QUERY_CHARS + 1)}, "query", "under"),
        ({"query": "q", "top_k": 0}, "top_k", "1 to 20"),
        ({"query": "q", "top_k": 21}, "top_k", "1 to 20"),
        ({"query": "q", "top_k": True}, "top_k", "integer"),
        ({"query": "q", "top_k": 2.5}, "top_k", "integer"),
        ({"query": "q", "top_k": "five"}, "top_k", "integer"),
        ({"query": "q", "after": "1d", "before": "2d"}, "after", "earlier than"),
        ({"query": "q", "after": "2026-11-02", "before": "2026-11-02"}, "after", "earlier than"),
        ({"query": "q", "topk": 3}, "topk", "accepted: query, top_k, after, before"),
    ],
)
def test_parse_arguments_errors_name_the_argument(
    arguments: dict[str, Any], param: str, fragment: str
) -> None:
    with pytest.raises(rc.RecallArgumentError) as err:
        rc.parse_arguments(arguments, 5, NOW)
    assert err.value.param == param
    assert fragment in err.value.message


def test_top_k_limit_follows_a_larger_search_top_k() -> None:
    assert rc.parse_arguments({"query": "q", "top_k": 40}, 50, NOW).top_k == 40
    assert rc.tool_definition("X", 50)["inputSchema"]["properties"]["top_k"]["maximum"] == 50


def test_tool_definition_is_valid_json_schema_and_matches_the_parser() -> None:
    tool = rc.tool_definition("Recall2", 7)
    assert tool["name"] == "Recall2"
    schema = tool["inputSchema"]
    jsonschema.Draft202012Validator.check_schema(schema)
    assert schema["required"] == ["query"]
    assert schema["properties"]["top_k"]["default"] == 7
    validator = jsonschema.Draft202012Validator(schema)
    good = {"query": "tomatoes", "top_k": 3, "after": "2026-11-01T14:00Z", "before": "2d"}
    validator.validate(good)
    rc.parse_arguments(good, 7, NOW)
    for bad in ({}, {"query": "q", "extra": 1}, {"query": "q", "top_k": 0}):
        assert not validator.is_valid(bad)
        with pytest.raises(rc.RecallArgumentError):
            rc.parse_arguments(bad, 7, NOW)
    for word in ("30m", "6h", "2d", "1w", "2026-11-01"):
        assert word in schema["properties"]["after"]["description"]
    text = rc.instructions("Recall2")
    assert "Recall2" in text and "after" in text and "before" in text
    assert rc.NO_RESULTS in text
    assert "[redacted: <kind>]" in text and "[private]" in text  # markers explained (#26)


# -- labels, expand, isolation ---------------------------------------------------------------

SESSION = "2026-11-30T02-41-07Z-3f9a"


def _hit(
    source: Path | str,
    start: int,
    end: int,
    heading: str = "",
    level: int = 2,
    content: str = "",
    score: float = 0.9,
    chunk: str = "c0ffee",
) -> Hit:
    from memd.indexing.query.search import exchange_time

    return Hit(
        chunk_hash=chunk,
        source=str(source),
        heading=heading,
        heading_level=level,
        content=content,
        score=score,
        start_line=start,
        end_line=end,
        when=exchange_time(heading),
    )


async def _record(layout: ClientLayout, *exchanges: tuple[str, str, str, str]) -> Path:
    """Record (conversation_id, user, assistant, timestamp) with the real recording code."""
    path = None
    async with ClientSessions(layout) as sessions:
        for conv, user, assistant, stamp in exchanges:
            path = (await sessions.record_exchange(conv, user, assistant, stamp))["path"]
    assert path is not None
    return Path(path)


def _lines_of(path: Path, heading: str) -> int:
    """1-based line of a heading in a file, as memsearch numbers chunk lines.

    `heading` is the heading up to the exchange number; the conversation title follows.
    """
    lines = path.read_text(encoding="utf-8").split("\n")
    return next(
        i for i, line in enumerate(lines, 1) if line == heading or line.startswith(heading + " — ")
    )


@pytest.fixture
def layout(tmp_path: Path) -> ClientLayout:
    layout = ClientLayout(tmp_path / "memory", "alice")
    layout.ensure()
    return layout


def test_transcript_label_names_session_conversation_and_time(layout: ClientLayout) -> None:
    path = asyncio.run(
        _record(
            layout,
            ("a", "first question", "first answer", "2026-11-01T10:00:00Z"),
            ("b", "second conversation", "its answer", "2026-11-02T11:00:00Z"),
            ("b", "more in it", "more answer", "2026-11-02T11:05:00Z"),
        )
    )
    heading = "## 2026-11-02 11:05:00 UTC · exchange 2"
    line = _lines_of(path, heading)
    hit = _hit(path, line, line + 4, heading[3:])
    [memory] = rc.collect([hit], layout, 5)
    src = memory.source
    assert (src.kind, src.session_id, src.conversation) == ("transcript", path.stem, 2)
    assert src.when == "2026-11-02 11:05:00 UTC"
    assert src.path == f"sessions/{path.name}"
    assert src.label == (
        f"transcript · session {path.stem} · conversation 2 · 2026-11-02 11:05:00 UTC"
    )
    # The label says the time: the heading line is not repeated (the heading field has it).
    assert memory.content.startswith("**User:** more in it")
    assert memory.heading == heading[3:]
    assert "**User:** second conversation" not in memory.content


def test_summary_and_other_files_are_labelled_without_absolute_paths(layout: ClientLayout) -> None:
    start, end = datetime(2026, 11, 1, 9, tzinfo=UTC), datetime(2026, 11, 1, 12, tzinfo=UTC)
    text = render_summary(
        "alice",
        SESSION,
        "## Garden\n\nWe planned the greenhouse.",
        start=start,
        end=end,
        compacted_at=end.timestamp(),
        provider="openai",
        model="m",
        parts=1,
        source_sha256="0" * 64,
    )
    summary = layout.summary_file(SESSION)
    summary.write_text(text, encoding="utf-8")
    heading = next(line for line in text.split("\n") if "· summary · Garden" in line)
    line = _lines_of(summary, heading)
    level = len(heading) - len(heading.lstrip("#"))
    hit = _hit(summary, line, line + 2, heading[level + 1 :], level=level)
    [memory] = rc.collect([hit], layout, 5)
    assert "We planned the greenhouse." in memory.content
    assert memory.source.kind == "summary"
    assert memory.source.session_id == SESSION
    assert memory.source.label == (
        f"summary · session {SESSION} · 2026-11-01 09:00:00 UTC – 2026-11-01 12:00:00 UTC"
    )
    notes = layout.sessions / "sub" / "notes.md"
    notes.parent.mkdir()
    notes.write_text("# Notes\n\nbring the seeds\n", encoding="utf-8")
    [other] = rc.collect([_hit(notes, 1, 3, "Notes", level=1)], layout, 5)
    assert other.source.label == "file · sessions/sub/notes.md"
    rendered = rc.render([memory, other])
    assert str(layout.root) not in repr(rendered) and str(layout.memory_dir) not in repr(rendered)


def test_expand_refuses_sources_outside_the_clients_sessions(
    tmp_path: Path, layout: ClientLayout
) -> None:
    bob = ClientLayout(layout.memory_dir, "bob")
    bob.ensure()
    secret = ("x", "bob's secret is tangerine", "noted", NOW.isoformat())
    bob_file = asyncio.run(_record(bob, secret))
    heading = "## 2026-11-30 12:00:00 UTC · exchange 1"
    line = _lines_of(bob_file, heading)
    archived = layout.archive / "old.md"
    archived.write_text(f"{heading}\n\n**User:** archived tangerine\n", encoding="utf-8")
    outside = tmp_path / "outside.md"
    outside.write_text(f"{heading}\n\n**User:** outside tangerine\n", encoding="utf-8")
    link = layout.sessions / "link.md"
    link.symlink_to(outside)
    crafted = [
        _hit(bob_file, line, line + 4, heading[3:], content="bob's secret is tangerine"),
        _hit(
            layout.sessions / ".." / ".." / "bob" / "sessions" / bob_file.name,
            line,
            line + 4,
            heading[3:],
            content="bob's secret is tangerine",
        ),
        _hit(archived, 1, 3, heading[3:], content="archived tangerine"),
        _hit(outside, 1, 3, heading[3:], content="outside tangerine"),
        _hit(link, 1, 3, heading[3:], content="outside tangerine"),
        _hit("relative/sessions/x.md", 1, 3, heading[3:], content="tangerine"),
        _hit(layout.sessions, 1, 3, heading[3:], content="tangerine"),
    ]
    assert rc.collect(crafted, layout, 10) == []
    assert "tangerine" not in rc.render(rc.collect(crafted, layout, 10))["text"]
    assert rc.contained_path(str(layout.sessions / "a.md"), layout.sessions.resolve())


def test_deleted_files_front_matter_and_shared_sections_are_dropped(layout: ClientLayout) -> None:
    path = asyncio.run(
        _record(layout, ("a", "tomatoes " * 300, "water daily " * 300, "2026-11-01T10:00:00Z"))
    )
    lines = path.read_text(encoding="utf-8").split("\n")
    heading = "## 2026-11-01 10:00:00 UTC · exchange 1"
    line = _lines_of(path, heading)
    front = "\n".join(lines[:5])
    hits = [
        _hit(path, 1, 5, "", level=0, content=front, score=0.99, chunk="front"),
        _hit(path, line, line + 2, heading[3:], score=0.9, chunk="part1"),
        _hit(path, line + 3, line + 4, heading[3:], score=0.8, chunk="part2"),
        _hit(layout.sessions / "gone.md", 1, 3, heading[3:], content="deleted", chunk="gone"),
    ]
    memories = rc.collect(hits, layout, 5)
    assert [m.chunk_hash for m in memories] == ["part1"]
    assert "client_id:" not in memories[0].content
    assert memories[0].content.rstrip().endswith("water daily")


def test_top_k_counts_distinct_sections(layout: ClientLayout) -> None:
    path = asyncio.run(
        _record(
            layout,
            *[
                ("a", f"question {i}", f"answer {i}", f"2026-11-0{i}T10:00:00Z")
                for i in range(1, 5)
            ],
        )
    )
    hits = []
    for i in range(1, 5):
        heading = f"## 2026-11-0{i} 10:00:00 UTC · exchange {i}"
        line = _lines_of(path, heading)
        hits += [
            _hit(path, line, line + 4, heading[3:], chunk=f"h{i}a"),
            _hit(path, line, line + 4, heading[3:], chunk=f"h{i}b"),
        ]
    memories = rc.collect(hits, layout, 3)
    assert [m.chunk_hash for m in memories] == ["h1a", "h2a", "h3a"]


# -- output -----------------------------------------------------------------------------------


def _memory(content: str, score: float = 0.8, focus: int = 0, n: int = 1) -> rc.Memory:
    source = rc.Source(
        f"sessions/{SESSION}.md", "transcript", SESSION, n, "2026-11-01 10:00:00 UTC"
    )
    heading = content.split("\n", 1)[0].lstrip("# ")
    return rc.Memory(source, heading, content, score, f"hash{n}", focus)


def test_no_results_text_is_exact() -> None:
    assert rc.render([]) == {"results": [], "text": "No relevant memories found."}


def test_text_numbers_results_with_labels_scores_and_content() -> None:
    first = _memory(
        "## 2026-11-01 10:00:00 UTC · exchange 1\n\n**User:** tomatoes?\n\n"
        "**Assistant:** water them",
        score=0.987,
        n=1,
    )
    second = _memory("## 2026-11-02 10:00:00 UTC · exchange 2\n\n**User:** Grüße 🌱", 0.5, n=2)
    out = rc.render([first, second])
    assert out["text"] == (
        "Found 2 memories in past conversations with this user (most relevant first):\n\n"
        f"[1] relevance 0.99 · transcript · session {SESSION} · conversation 1 · "
        "2026-11-01 10:00:00 UTC\n" + first.content + "\n\n"
        f"[2] relevance 0.50 · transcript · session {SESSION} · conversation 2 · "
        "2026-11-01 10:00:00 UTC\n" + second.content
    )
    assert [r["chunk_hash"] for r in out["results"]] == ["hash1", "hash2"]
    result = out["results"][0]
    assert set(result) >= {"source", "heading", "content", "score", "chunk_hash"}
    assert result["source"] == f"sessions/{SESSION}.md" and result["score"] == 0.987
    assert result["truncated"] is False


def test_char_budget_bounds_the_text_and_shares_it_fairly() -> None:
    short = _memory("## short\n\n**User:** brief", n=1)
    longs = [_memory("## long\n\n" + ("word " * 5000), n=i) for i in range(2, 6)]
    out = rc.render([short, *longs], budget=4000)
    assert len(out["text"]) <= 4000
    assert short.content in out["text"]  # short sections are never cut
    assert all(r["truncated"] for r in out["results"][1:])
    sizes = [len(r["content"]) for r in out["results"][1:]]
    assert max(sizes) - min(sizes) <= 20  # the rest is shared evenly
    assert all(r["content"].endswith("[… truncated]") for r in out["results"][1:])


def test_one_huge_section_gets_only_its_share_cut_around_its_match() -> None:
    lines = [
        "## system prompt",
        "",
        *[f"rule {i}: " + "y" * 80 for i in range(120)],
        "NEEDLE the matching rule",
        *[f"rule tail {i}: " + "z" * 80 for i in range(20)],
    ]
    huge = _memory("\n".join(lines), focus=lines.index("NEEDLE the matching rule"), n=1)
    others = [_memory(f"## short {i}\n\n**User:** fact number {i}", n=i) for i in range(2, 6)]
    out = rc.render([huge, *others], budget=12_000)
    first = out["results"][0]["content"]
    assert len(first) <= 12_000 // 5 and out["results"][0]["truncated"]
    assert "NEEDLE the matching rule" in first and "[…]" in first
    assert first.endswith("[… truncated]")
    assert [r["content"] for r in out["results"][1:]] == [m.content for m in others]


def test_too_many_sections_for_the_budget_drop_the_least_relevant() -> None:
    memories = [_memory("## m\n\n" + "x " * 2000, score=1 - i / 100, n=i) for i in range(20)]
    out = rc.render(memories, budget=2000)
    assert len(out["text"]) <= 2000
    assert 1 <= len(out["results"]) < 20
    assert [r["chunk_hash"] for r in out["results"]] == [
        f"hash{i}" for i in range(len(out["results"]))
    ]
    assert "less relevant memories left out" in out["text"]


def test_clip_keeps_the_heading_and_the_matched_chunk() -> None:
    lines = [
        "## 2026-11-01 10:00:00 UTC · exchange 1",
        "",
        "**User:** the question",
        *[f"filler line {i} " + "x" * 60 for i in range(200)],
        "NEEDLE is here",
        *[f"tail {i}" for i in range(50)],
    ]
    text = "\n".join(lines)
    clipped = rc.clip(text, 1000, focus_line=lines.index("NEEDLE is here"))
    assert len(clipped) <= 1000
    assert clipped.startswith(lines[0])
    assert "NEEDLE is here" in clipped and "[…]" in clipped
    head_only = rc.clip(text, 1000, focus_line=2)
    assert len(head_only) <= 1000 and "the question" in head_only and "[…]\n" not in head_only
    assert rc.clip("short", 1000) == "short"


def test_allot_gives_no_one_more_than_an_equal_share() -> None:
    assert rc.allot([10, 1000, 1000], 610) == [10, 203, 203]
    assert rc.allot([5, 5], 100) == [5, 5]
    assert sum(rc.allot([7, 900, 13, 400], 500)) <= 500


# -- against a real index ---------------------------------------------------------------------


@pytest.fixture(scope="module")
def indexed(
    tmp_path_factory: pytest.TempPathFactory, embedder: EmbedderChild
) -> Iterator[dict[str, ClientIndex]]:
    """alice and bob, each with their own index server, watcher and transcripts."""
    config = client_config(tmp_path_factory.mktemp("recall") / "memory", "alice", "bob")
    indexes = {cid: ClientIndex(config, cid, embedder.endpoint()) for cid in ("alice", "bob")}
    try:
        for cid, exchanges in (("alice", ALICE), ("bob", BOB)):
            index = indexes[cid].start()
            asyncio.run(_record(index.layout, *exchanges))
        indexes["alice"].wait_rows(len(ALICE))
        indexes["bob"].wait_rows(len(BOB))
        yield indexes
    finally:
        for index in indexes.values():
            index.stop()


def _recall(
    index: ClientIndex,
    query: str,
    top_k: int = 5,
    after: str | None = None,
    before: str | None = None,
    **kw: Any,
) -> dict[str, Any]:
    args = rc.parse_arguments({"query": query, "top_k": top_k, "after": after, "before": before}, 5)
    return asyncio.run(
        rc.recall(
            index.searcher, args.query, args.top_k, args.after, args.before, index.layout, **kw
        )
    )


@pytest.mark.slow
def test_recall_finds_the_right_exchange(indexed: dict[str, ClientIndex]) -> None:
    alice = indexed["alice"]
    everything = RecallConfig(min_score=0.0, drop_below=0.0)  # no relevance cut here
    out = _recall(alice, "capital of Australia", top_k=3, settings=everything)
    best = out["results"][0]
    assert "Canberra is the capital of Australia." in best["content"]
    assert best["heading"].startswith("2026-10-01 10:00:00 UTC · exchange 1 — ")
    assert best["kind"] == "transcript" and best["when"] == "2026-10-01 10:00:00 UTC"
    assert best["source"].startswith("sessions/") and 0 < best["score"] <= 1
    assert out["text"].startswith("Found 3 memories")
    assert "[1] relevance" in out["text"] and "Canberra" in out["text"].split("[2]")[0]
    assert str(alice.layout.memory_dir) not in repr(out)
    assert all("client_id:" not in r["content"] for r in out["results"])


@pytest.mark.slow
def test_an_unrelated_query_finds_nothing_and_a_related_one_clears_the_bar(
    indexed: dict[str, ClientIndex],
) -> None:
    alice = indexed["alice"]
    for query in ("quantum chromodynamics", "xylophone", "who won the 1998 world cup?"):
        assert _recall(alice, query) == {"results": [], "text": rc.NO_RESULTS}, query
    out = _recall(alice, "what is the capital of Australia?")
    assert "Canberra" in out["results"][0]["content"]
    assert all(r["score"] >= RecallConfig().drop_below for r in out["results"])
    assert out["results"][0]["score"] >= RecallConfig().min_score
    # With the bar at 0 the same unrelated query gets its (weak) nearest matches.
    loose = _recall(alice, "xylophone", settings=RecallConfig(min_score=0.0, drop_below=0.0))
    assert loose["results"] and all(r["score"] < 0.5 for r in loose["results"])


@pytest.mark.slow
def test_time_filters_select_single_exchanges_of_one_file(indexed: dict[str, ClientIndex]) -> None:
    alice = indexed["alice"]
    both = _recall(alice, "greenhouse tomatoes", top_k=2)
    assert {r["source"] for r in both["results"]} == {both["results"][0]["source"]}
    assert {r["when"] for r in both["results"]} == {
        "2026-11-05 09:00:00 UTC",
        "2026-11-05 15:00:00 UTC",
    }
    later = _recall(alice, "greenhouse tomatoes", after="2026-11-05T12:00")
    assert [r["when"] for r in later["results"]][:1] == ["2026-11-05 15:00:00 UTC"]
    assert all("09:00:00" not in r["when"] for r in later["results"])
    earlier = _recall(alice, "greenhouse tomatoes", before="2026-11-05T12:00:00Z")
    assert "Water the greenhouse tomatoes" in earlier["results"][0]["content"]
    assert all(r["when"] < "2026-11-05 12" for r in earlier["results"])
    exact = _recall(
        alice, "greenhouse tomatoes", after="2026-11-05T15:00:00Z", before="2026-11-05T15:00:01Z"
    )
    assert [r["when"] for r in exact["results"]] == ["2026-11-05 15:00:00 UTC"]
    day = _recall(alice, "tomatoes", after="2026-11-05", before="2026-11-06")
    assert len(day["results"]) == 2


@pytest.mark.slow
def test_relative_time_filters(indexed: dict[str, ClientIndex]) -> None:
    alice = indexed["alice"]
    recent = _recall(alice, "sourdough starter", after="1d")
    assert [r["content"] for r in recent["results"]] and all(
        "doubled overnight" in r["content"] for r in recent["results"]
    )
    old = _recall(alice, "sourdough starter", after="1w", before="1d")
    assert "acetone" in old["results"][0]["content"]
    assert all("doubled" not in r["content"] for r in old["results"])


@pytest.mark.slow
def test_filters_that_exclude_everything_say_no_memories(indexed: dict[str, ClientIndex]) -> None:
    out = _recall(indexed["alice"], "greenhouse tomatoes", after="2020-01-01", before="2020-01-02")
    assert out == {"results": [], "text": rc.NO_RESULTS}


@pytest.mark.slow
def test_unicode_queries_and_content(indexed: dict[str, ClientIndex]) -> None:
    alice = indexed["alice"]
    for query in ("Straßenbahn Zürich", "Москве метро"):
        best = _recall(alice, query, top_k=1)["results"][0]
        assert (
            "Die Straßenbahn fährt alle 7 Minuten; в Москве тоже метро. 東京の電車も便利です。"
            in best["content"]
        )
        assert "🚋" in best["content"]


@pytest.mark.slow
def test_isolation_between_clients(indexed: dict[str, ClientIndex]) -> None:
    alice, bob = indexed["alice"], indexed["bob"]
    bob_hits = bob.searcher.search("Project Nightingale tangerine", 3)
    assert bob_hits and "tangerine-42" in bob_hits[0].content
    probes = [
        "Project Nightingale launch code tangerine-42",
        bob_hits[0].chunk_hash,
        bob_hits[0].source,
        f"bob {Path(bob_hits[0].source).name}",
        "launch code",
    ]
    for query in probes:
        out = _recall(alice, query, top_k=20)
        assert "Nightingale" not in repr(out) and "tangerine" not in repr(out), query
        assert "bob" not in "".join(r["source"] for r in out["results"])
    # Even a hit of bob's handed to alice's expand is never resolved.
    assert rc.collect(bob_hits, alice.layout, 5) == []
    own = _recall(bob, "Project Nightingale", top_k=1)
    assert "tangerine-42" in own["text"]


@pytest.mark.slow
@pytest.mark.slow
def test_a_burst_of_recalls_for_one_client_queues_rather_than_fails(
    indexed: dict[str, ClientIndex],
) -> None:
    """A gateway with several connections can send a client's recalls all at once: they
    wait their turn on the client's two search threads instead of being refused."""
    alice = indexed["alice"]

    async def burst() -> list[dict[str, Any]]:
        return await asyncio.gather(
            *(
                rc.recall(alice.searcher, "capital of Australia", 1, None, None, alice.layout)
                for _ in range(12)
            )
        )

    results = asyncio.run(burst())
    assert all("Canberra" in r["text"] for r in results)


@pytest.mark.slow
def test_a_recall_needs_none_of_the_loops_default_threads(
    indexed: dict[str, ClientIndex],
) -> None:
    """The search and the reading of the transcripts run on the client's own lane, one
    after the other on one thread: a loop whose default threads are all busy (memd
    loaded with other work) still answers the recall."""
    alice = indexed["alice"]

    async def crowded() -> dict[str, Any]:
        loop = asyncio.get_running_loop()
        release = threading.Event()
        pool = ThreadPoolExecutor(2)
        loop.set_default_executor(pool)
        blockers = [loop.run_in_executor(None, release.wait) for _ in range(2)]
        try:
            return await rc.recall(
                alice.searcher, "capital of Australia", 3, None, None, alice.layout, timeout=5.0
            )
        finally:
            release.set()
            await asyncio.gather(*blockers)

    assert "Canberra" in asyncio.run(crowded())["text"]


def test_reading_past_the_deadline_is_a_timeout_not_the_index() -> None:
    """When the search ended but reading the transcripts outruns the deadline, memd is
    overloaded: recall says so with its own error (kind `timeout`), not the index's; a
    search that never ended is the index's (kind `index_unavailable`)."""

    async def stuck(searched: float | None) -> Any:
        never: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        return await service._answer(never, lambda: searched, 0.2)

    with pytest.raises(rc.RecallTimeoutError, match="overloaded"):
        asyncio.run(stuck(time.monotonic()))
    with pytest.raises(IndexUnavailableError, match="did not answer"):
        asyncio.run(stuck(None))


def test_empty_index_says_no_memories(tmp_path: Path, embedder: EmbedderChild) -> None:
    config = client_config(tmp_path / "memory", "carol")
    index = ClientIndex(config, "carol", embedder.endpoint())
    try:
        index.start()
        assert _recall(index, "anything at all") == {"results": [], "text": rc.NO_RESULTS}
    finally:
        index.stop()


def test_unreachable_or_silent_index_is_unavailable_never_a_hang(
    tmp_path: Path, layout: ClientLayout
) -> None:
    with pytest.raises(IndexUnavailableError):
        asyncio.run(rc.recall(None, "q", 5, None, None, layout))
    missing = IndexSearcher(
        IndexTarget(f"unix:{tmp_path}/none.sock", "memd_alice"),
        EmbeddingConfig(),
        root=layout.root,
        timeout=2,
    )
    silent_path = tmp_path / "silent.sock"
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(silent_path))
    listener.listen(8)  # accepts connections, never answers
    silent = IndexSearcher(
        IndexTarget(f"unix:{silent_path}", "memd_alice"),
        EmbeddingConfig(),
        root=layout.root,
        timeout=2,
    )
    try:
        for searcher in (missing, silent):
            with pytest.raises(IndexUnavailableError):
                asyncio.run(rc.recall(searcher, "q", 5, None, None, layout, timeout=1.0))
    finally:
        missing.close()
        silent.close()
        listener.close()
