"""Fuzz the params of every JSON-RPC method against one real daemon started for the module.

Wrong types, huge strings, deep nesting, lone surrogates, invalid UTF-8 as raw bytes on the
socket, and ids with path tricks (`../`, absolute paths, NUL, very long, Unicode
look-alikes) in client_id / conversation_id / session_id. The daemon must answer every
request with a well-formed JSON-RPC response (never -32603: that is an unhandled bug),
never die, and write nothing outside its memory_dir. tests/test_rpc_fuzz.py fuzzes the
framing against a bare server; this file fuzzes memd's own methods.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import re
import socket
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from memd.api.methods import build_registry
from memd.cli.client import MemdClient
from memd.markdown.transcript import SESSION_ID_RE
from tests.support.daemon import DaemonProcess, base_config, write_config

FUZZ = settings(
    max_examples=60,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)

CLIENTS = {
    "gw": {"memory_enabled": True, "mode": "both"},
    "agent": {"memory_enabled": True, "mode": "mcp_via_llm"},
    "off": {"memory_enabled": False, "mode": "both"},
    "router": {"memory_enabled": True, "mode": "llm_only"},
}
ESCAPE = "fzesc"  # every path-trick id names this, so an escape is easy to find on disk
TRICK_IDS = [
    f"../{ESCAPE}",
    f"../../{ESCAPE}",
    f"../../../../../../tmp/{ESCAPE}",
    f"/tmp/{ESCAPE}",
    f"/{ESCAPE}",
    f"gw/../{ESCAPE}",
    f"gw/../../{ESCAPE}",
    f"gw/{ESCAPE}",
    f"gw\\..\\{ESCAPE}",
    f"..\\{ESCAPE}",
    ".",
    "..",
    "",
    " ",
    "gw ",
    " gw",
    "GW",
    "gw\n",
    "gw\x00",
    f"\x00{ESCAPE}",
    f"gw\x00/../{ESCAPE}",
    "~",
    f"~/{ESCAPE}",
    f"$HOME/{ESCAPE}",
    f"%2e%2e%2f{ESCAPE}",
    f"gw\u2215..\u2215{ESCAPE}",  # division slash
    f"\uff0e\uff0e\uff0f{ESCAPE}",  # fullwidth ../
    "\uff47\uff57",  # fullwidth "gw"
    "gw\u200b",  # zero-width space
    "g\u0175",  # w with circumflex
    "gw\u0338",  # combining overlay
    "\u202egw",  # right-to-left override
    "gw\ud800",  # lone surrogate
    ESCAPE * 20,
    "g" * 64,
    "g" * 65,
    "g" * 4096,
    "a" * 100_000,
    "2026-11-30T02-41-07Z-3f9a",
    f"2026-11-30T02-41-07Z-3f9a/../../{ESCAPE}",
    "2026-11-30T02-41-07Z-3f9a.md",
    "2026-11-30T02-41-07Z-3f9a-summary",
]


# --- strategies ------------------------------------------------------------------------------

any_text = st.text(st.characters(codec=None, exclude_categories=()), max_size=40)
huge_text = st.sampled_from([50_000, 1_000_000]).map(lambda n: "huge " * (n // 5))
scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**70), 2**70),
    st.floats(allow_nan=False, allow_infinity=False),
    any_text,
)
json_values = st.recursive(
    scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4), st.dictionaries(any_text, inner, max_size=4)
    ),
    max_leaves=12,
)


@dataclass(frozen=True)
class Deep:
    """A value nested `depth` levels deep, spliced into the request line as raw JSON text
    (deeper than the test's own json.dumps could encode)."""

    depth: int
    kind: str

    def text(self) -> str:
        if self.kind == "list":
            return "[" * self.depth + '"deep"' + "]" * self.depth
        return '{"k":' * self.depth + '"deep"' + "}" * self.depth


deep = st.builds(
    Deep, st.sampled_from([50, 500, 990, 5_000, 50_000]), st.sampled_from(["list", "dict"])
)
junk = st.one_of(json_values, deep, huge_text)


ids = st.one_of(st.sampled_from(TRICK_IDS), any_text)
good_clients = st.sampled_from(["gw", "gw", "agent", "agent", "off", "router", "nobody"])
words = st.text(st.characters(categories=["L", "N", "Zs", "P", "S"]), min_size=1, max_size=60)
texts = st.one_of(words, words, words, any_text, huge_text)
timestamps = st.sampled_from(
    [
        "2026-11-30T02:41:07Z",
        "2026-11-30",
        "1999-01-01T00:00",
        "9999-12-31T23:59:59+14:00",
        "0001-01-01T00:00:00-14:00",
        "yesterday",
        "",
        "0" * 70,
        "2026-13-45T99:99",
    ]
)
times = st.sampled_from(
    [
        "2d",
        "30m",
        "1.5h",
        "2d ago",
        "1w",
        "2026-11-01",
        "2026-11-01T14:00:00Z",
        "soon",
        "",
        "-5d",
        "1e308h",
        "0m",
        "9999999999999999999d",
        "0001-01-01",
        "9999-12-31T23:59:59Z",
    ]
)
parts = st.lists(
    st.one_of(
        st.fixed_dictionaries({"type": st.just("text"), "text": texts}),
        st.fixed_dictionaries(
            {"type": st.just("image_url"), "image_url": st.fixed_dictionaries({"url": words})}
        ),
    ),
    min_size=1,
    max_size=3,
)
contents = st.one_of(texts, texts, parts)
tool_calls = st.lists(
    st.fixed_dictionaries(
        {
            "id": words,
            "type": st.just("function"),
            "function": st.fixed_dictionaries({"name": words, "arguments": words}),
        }
    ),
    max_size=2,
)


@st.composite
def chats(draw: st.DrawFn) -> list[dict[str, Any]]:
    """A plausible OpenAI request: optional system prompt, turns, tool results, a user last."""
    messages: list[dict[str, Any]] = []
    if draw(st.booleans()):
        messages.append(
            {"role": draw(st.sampled_from(["system", "developer"])), "content": draw(contents)}
        )
    for _ in range(draw(st.integers(0, 3))):
        messages.append({"role": "user", "content": draw(contents)})
        reply: dict[str, Any] = {"role": "assistant", "content": draw(contents)}
        messages.append(reply)
        if draw(st.booleans()):
            reply["tool_calls"] = draw(tool_calls)
            messages.append(
                {"role": "tool", "tool_call_id": draw(words), "content": draw(contents)}
            )
    user = {"role": "user", "content": draw(contents)}
    if draw(st.booleans()):
        user["name"] = draw(words)
    messages.append(user)
    return messages


responses = st.fixed_dictionaries(
    {"role": st.just("assistant"), "content": contents}, optional={"tool_calls": tool_calls}
)
recall_args = st.fixed_dictionaries(
    {"query": texts},
    optional={
        "top_k": st.one_of(st.integers(1, 20), st.just("5"), st.just(5.0)),
        "after": times,
        "before": times,
    },
)

Fields = dict[str, st.SearchStrategy[Any]]
# method -> (required params, optional params) with plausible values; a mutation then
# breaks at most one thing, so most calls get past the first check.
METHODS: dict[str, tuple[Fields, Fields]] = {
    "daemon.status": ({}, {}),
    "clients.list": ({}, {}),
    "clients.reset": ({"client_id": good_clients}, {}),
    "memory.record_exchange": (
        {
            "client_id": good_clients,
            "conversation_id": st.one_of(words, ids),
            "user": texts,
            "assistant": texts,
        },
        {
            "timestamp": timestamps,
            "exchange_id": st.one_of(st.sampled_from(["e1", "e2"]), words, ids),
        },
    ),
    "memory.record_chat": (
        {"client_id": good_clients, "messages": chats(), "response": responses},
        {"timestamp": timestamps},
    ),
    "memory.import_exchanges": (
        {
            "client_id": good_clients,
            "conversation_id": st.one_of(words, ids),
            "exchanges": st.lists(
                st.fixed_dictionaries(
                    {
                        "user": texts,
                        "assistant": texts,
                        "timestamp": timestamps,
                        "exchange_id": st.one_of(words, ids),
                    },
                    optional={"conversation": st.integers(-3, 10), "exchange": st.integers(-3, 10)},
                ),
                min_size=0,
                max_size=3,
            ),
        },
        {"session_id": ids, "title": texts},
    ),
    "memory.redact": (
        {"client_id": good_clients},
        {
            # Fuzzed texts hold no secret, so a real run changes nothing and rebuilds nothing.
            "dry_run": st.sampled_from([True, False, "yes", 1]),
            "files": st.lists(st.one_of(words, st.just("sessions/../x.md")), max_size=2),
            "rebuild": st.sampled_from([False, "no", 0]),
        },
    ),
    "sessions.list": ({"client_id": good_clients}, {}),
    "sessions.close": ({"client_id": good_clients}, {}),
    "sessions.recompact": ({"client_id": good_clients}, {"session_id": ids}),
    "memory.recall": (
        {"client_id": good_clients, "query": texts},
        {
            "top_k": st.one_of(st.integers(-5, 10**12), st.just("5"), st.just(5.0)),
            "after": times,
            "before": times,
        },
    ),
    "memory.forget": (
        {"client_id": good_clients},
        {
            # Validation only: a selector that matched would rebuild the index (seconds
            # each), so times and queries are ones that can never match a fuzzed exchange.
            "session_id": ids,
            "conversation_id": st.one_of(st.integers(-3, 10), st.sampled_from(["", "never-seen"])),
            "after": st.sampled_from(["9999-12-31T23:59:59Z", "soon", "", "-5d", "1e308h"]),
            "before": st.sampled_from(["0001-01-01", "soon", "", "9999999999999999999d"]),
            "query": st.sampled_from(["", "   ", 5, None]),
            "all": st.sampled_from([False, "true", 1]),
        },
    ),
    "memory.export": (
        {"client_id": good_clients},
        {
            "after": times,
            "before": times,
            "cursor": ids,
            "limit": st.one_of(st.integers(-5, 5000), st.just("5")),
        },
    ),
    "browse.conversations": ({"client_id": good_clients}, {"after": times, "before": times}),
    "browse.conversation": (
        {"client_id": good_clients, "session_id": ids, "conversation": st.integers(-3, 10)},
        {
            "offset": st.one_of(st.integers(-5, 10**12), st.just("0")),
            "limit": st.one_of(st.integers(-5, 5000), st.just(5.0)),
            "around": st.integers(-3, 10),
            "text_offset": st.integers(-5, 10**13),
            "text_limit": st.one_of(st.integers(-5, 10**7), st.just("20")),
        },
    ),
    "memory.forget_preview": (
        {"client_id": good_clients},
        {
            "session_id": ids,
            "conversation_id": st.one_of(st.integers(-3, 10), st.sampled_from(["", "never-seen"])),
            "after": st.sampled_from(["9999-12-31T23:59:59Z", "soon", "", "-5d", "1e308h"]),
            "before": st.sampled_from(["0001-01-01", "soon", "", "9999999999999999999d"]),
            "query": st.sampled_from(["", "   ", 5, None, "spare key"]),
            "all": st.sampled_from([False, "true", 1, True]),
        },
    ),
    "memory.tools": ({"client_id": good_clients}, {}),
    "memory.call_tool": (
        {
            "client_id": good_clients,
            "name": st.sampled_from(["MemoryRecall", "MemoryRecall", "memoryrecall", ""]),
            "arguments": recall_args,
        },
        {},
    ),
}
ID_PARAMS = ("client_id", "conversation_id", "session_id", "exchange_id")
MUTATIONS = [
    "as_is",
    "as_is",
    "as_is",
    "junk",
    "junk",
    "trick_id",
    "drop",
    "extra",
    "not_an_object",
]


@st.composite
def params_for(draw: st.DrawFn, method: str) -> Any:
    """A plausible call, then at most one thing broken: a junk value (wrong type, huge,
    deep), a path-trick id, a missing or an unknown param, or params that are no object."""
    required, optional = METHODS[method]
    params = draw(st.fixed_dictionaries(required, optional=optional))
    how = draw(st.sampled_from(MUTATIONS), label="mutation")
    names = sorted({*required, *optional})
    if how == "junk" and names:
        params[draw(st.sampled_from(names))] = draw(junk)
    elif how == "trick_id" and (targets := [n for n in names if n in ID_PARAMS]):
        params[draw(st.sampled_from(targets))] = draw(st.sampled_from(TRICK_IDS))
    elif how == "drop" and params:
        del params[draw(st.sampled_from(sorted(params)))]
    elif how == "extra":
        params[draw(any_text)] = draw(json_values)
    elif how == "not_an_object":
        return draw(st.one_of(st.lists(json_values, max_size=3), scalars))
    return params


# --- the daemon ------------------------------------------------------------------------------


class Fuzzed:
    """The module's daemon, plus what is on disk around it before the fuzzing starts."""

    def __init__(self, proc: DaemonProcess, tmp: Path) -> None:
        self.proc = proc
        self.tmp = tmp
        self.memory = tmp / "memory"
        self.pid = proc.proc.pid if proc.proc else None
        self.outside = self.tree_outside_memory()
        self.ids = itertools.count(1)

    def tree_outside_memory(self) -> set[str]:
        out = set()
        for path in self.tmp.rglob("*"):
            if path == self.memory or self.memory in path.parents or path.name == "memd.log":
                continue
            out.add(str(path.relative_to(self.tmp)))
        return out

    def send(self, payload: bytes, timeout: float = 60.0) -> dict[str, Any]:
        """One line in, one parsed response out, on a fresh connection."""
        with MemdClient(self.proc.socket, timeout=timeout) as client:
            client.send_line(payload)
            line = client.read_line()
        line.decode("ascii")  # responses are ASCII JSON
        return json.loads(line)


@pytest.fixture(scope="module")
def fuzzed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fuzzed]:
    tmp = tmp_path_factory.mktemp("fuzz-methods")
    path = write_config(
        tmp / "config.toml",
        base_config(
            tmp,
            clients=CLIENTS,
            # a forced recompaction must not reach out of the machine: nothing listens on :9
            compaction={"base_url": "http://127.0.0.1:9/v1", "api_key": "none"},
        ),
    )
    proc = DaemonProcess(path, env={"XDG_RUNTIME_DIR": str(tmp / "xdg")}).start()
    try:
        fuzz = Fuzzed(proc, tmp)
        yield fuzz
        # After every test of this file that ran on this worker, whatever their order:
        # pytest-xdist's worksteal may run test_zz_... before others, on another worker.
        survived_and_clean(fuzz)
    finally:
        proc.stop()


def check_response(response: Any, request_id: Any) -> dict[str, Any]:
    assert isinstance(response, dict), response
    assert response.get("jsonrpc") == "2.0", response
    assert ("result" in response) != ("error" in response), response
    if "error" in response:
        error = response["error"]
        code = error["code"]
        assert isinstance(code, int) and not isinstance(code, bool), error
        assert isinstance(error["message"], str), error
        assert code != -32603, f"internal error (an unhandled exception): {error}"
        if code == -32700:
            assert response["id"] is None
            return response
    assert response["id"] == request_id, (response.get("id"), request_id)
    return response


def _request(fuzz: Fuzzed, method: str, params: Any) -> tuple[bytes, int]:
    """The request line: ASCII JSON (lone surrogates become \\ud800 escapes), with every
    Deep value spliced in as raw text."""
    request_id = next(fuzz.ids)
    message = {"jsonrpc": "2.0", "id": request_id, "method": method, "params": params}
    deeps: dict[str, Deep] = {}

    def placeholder(value: Any) -> str:
        if not isinstance(value, Deep):
            raise TypeError(type(value).__name__)
        key = f"@@deep{len(deeps)}@@"
        deeps[key] = value
        return key

    line = json.dumps(message, default=placeholder)
    for key, value in deeps.items():
        line = line.replace(f'"{key}"', value.text(), 1)
    return line.encode(), request_id


# --- tests -----------------------------------------------------------------------------------


def test_every_method_is_fuzzed() -> None:
    """A method added to the API without a strategy here fails this test."""
    assert set(METHODS) == set(build_registry(None).names())  # type: ignore[arg-type]


@pytest.mark.parametrize("method", sorted(METHODS))
@FUZZ
@given(data=st.data())
def test_params(fuzzed: Fuzzed, method: str, data: st.DataObject) -> None:
    params = data.draw(params_for(method), label="params")
    line, request_id = _request(fuzzed, method, params)
    if len(line) > 8 * 1024 * 1024:
        return  # the line limit has its own test
    response = check_response(fuzzed.send(line), request_id)
    event("result" if "result" in response else f"error {response['error']['code']}")


INVALID_UTF8 = [
    b"\xff",
    b"\xfe\xff",
    b"\xc0\xaf",
    b"\xe0\x80\xaf",
    b"\xed\xa0\x80",
    b"\xf4\x90\x80\x80",
    b"\x80",
    b"caf\xe9",
    b"\xf0\x9f\x98",
]


@pytest.mark.parametrize("method", sorted(METHODS))
@FUZZ
@given(
    bad=st.sampled_from(INVALID_UTF8),
    field=st.sampled_from(["client_id", "user", "query", "method", "id"]),
)
def test_invalid_utf8_on_the_socket(fuzzed: Fuzzed, method: str, bad: bytes, field: str) -> None:
    """Raw bytes that are not UTF-8, inside a string of an otherwise good request."""
    request_id = next(fuzzed.ids)
    params = {"client_id": "gw", "user": "u", "query": "q"}
    line = json.dumps(
        {"jsonrpc": "2.0", "id": str(request_id), "method": method, "params": params}
    ).encode()
    target = {
        "client_id": b'"gw"',
        "user": b'"u"',
        "query": b'"q"',
        "method": f'"{method}"'.encode(),
        "id": f'"{request_id}"'.encode(),
    }[field]
    line = line.replace(target, target[:-1] + bad + b'"', 1)
    response = check_response(fuzzed.send(line), None)
    assert response["error"]["code"] == -32700


def test_line_over_the_limit_is_refused_and_the_daemon_goes_on(fuzzed: Fuzzed) -> None:
    big = json.dumps(
        {
            "jsonrpc": "2.0",
            "id": 1,
            "method": "memory.record_exchange",
            "params": {
                "client_id": "agent",
                "conversation_id": "big",
                "user": "x",
                "assistant": "y" * (8 * 1024 * 1024),
            },
        }
    ).encode()
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as raw:
        raw.settimeout(60)
        raw.connect(str(fuzzed.proc.socket))
        with contextlib.suppress(OSError):  # closed on us after the answer: fine
            raw.sendall(big + b"\n")
        reply = raw.makefile("rb").readline()
    error = check_response(json.loads(reply), None)["error"]
    assert (error["code"], error["data"]["kind"]) == (-32008, "payload_too_large")


def test_zz_daemon_survived_and_wrote_only_inside_memory_dir(fuzzed: Fuzzed) -> None:
    """The same daemon still serves, and the disk is clean.

    Named to run last, but under `-n 3 --dist worksteal` a file's tests may be split
    across workers and this one may run first; the module fixture's teardown makes the
    same check after all of the file's tests on each worker."""
    survived_and_clean(fuzzed)


def survived_and_clean(fuzzed: Fuzzed) -> None:
    """The daemon started for the module still answers and records; nothing was written
    outside memory_dir (nor where a path trick could lead); inside it only memd's names."""
    still_serves(fuzzed)
    wrote_only_inside_memory_dir(fuzzed)


def still_serves(fuzzed: Fuzzed) -> None:
    """The same process answers daemon.status and records an exchange."""
    status = fuzzed.send(
        json.dumps({"jsonrpc": "2.0", "id": next(fuzzed.ids), "method": "daemon.status"}).encode()
    )
    assert status["result"]["pid"] == fuzzed.pid
    assert fuzzed.proc.proc is not None and fuzzed.proc.proc.poll() is None
    ok = fuzzed.send(
        json.dumps(
            {
                "jsonrpc": "2.0",
                "id": next(fuzzed.ids),
                "method": "memory.record_exchange",
                "params": {
                    "client_id": "agent",
                    "conversation_id": "final",
                    "user": "still here?",
                    "assistant": "yes",
                },
            }
        ).encode()
    )
    assert ok["result"]["conversation"] >= 1


def wrote_only_inside_memory_dir(fuzzed: Fuzzed) -> None:
    """Nothing new beside memory_dir, no escaped name anywhere, only memd's names inside."""
    # Nothing new outside memory_dir inside the test folder ...
    # (the zygote's, the shared index server's and the embedder's sockets sit in the
    # runtime dir, named after memory_dir's hash)
    zygote = {
        p
        for p in fuzzed.tree_outside_memory()
        if re.fullmatch(r"xdg(/memd-\d+(/(zygote|index-shared|embedder)-[0-9a-f]{16}\.sock)?)?", p)
    }
    assert fuzzed.tree_outside_memory() - zygote <= fuzzed.outside | {
        "run",
        "run/memd.sock",
        "run/memd.sock.lock",
    }
    # ... nor anywhere a path trick could have led.
    places = [fuzzed.tmp, *fuzzed.tmp.parents, Path("/tmp"), Path.home()]
    escaped = [
        str(p / name) for p in places if p.is_dir() for name in os.listdir(p) if ESCAPE in name
    ]
    assert not escaped, escaped
    # Inside memory_dir: only enabled clients' folders, only memd's own names.
    enabled = {
        c
        for c, cfg in CLIENTS.items()
        if cfg.get("memory_enabled") and cfg["mode"] in ("both", "mcp_via_llm")
    }
    # (and memd's own .memd: the zygote's pidfile, log and HOME)
    assert {p.name for p in fuzzed.memory.iterdir()} <= enabled | {".memd"}
    for client in enabled:
        root = fuzzed.memory / client
        assert {p.name for p in root.iterdir()} <= {
            "sessions",
            "archive",
            ".memsearch",
            ".memsearch.toml",
            ".memd",
        }
        for path in (root / "sessions").rglob("*"):
            stem = re.sub(r"-summary$", "", path.stem)
            assert path.suffix == ".md" and SESSION_ID_RE.match(stem), path
        for path in root.rglob("*"):
            assert ESCAPE not in path.name, path
