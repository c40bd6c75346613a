"""The proxy's parts without a daemon: `[proxy]` config, the key store, stream assembly,
and how the recall tool is added to a request."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from memd.config import ConfigError, parse_config, parse_listen
from memd.proxy.keys import KeyStore, parse_key
from memd.proxy.loop import MemoryTool, inject, refusal_reason, split_calls
from memd.proxy.stream import EventSplitter, ReplyAssembler, StreamError, parse_chunk

# --- config -----------------------------------------------------------------------------


def test_proxy_defaults_and_a_full_table(monkeypatch: pytest.MonkeyPatch) -> None:
    default = parse_config({})
    assert not default.proxy.enabled and default.proxy.address == ("127.0.0.1", 8765)
    monkeypatch.setenv("UPSTREAM_KEY", "sk-up")
    config = parse_config(
        {
            "proxy": {
                "listen": "[::1]:9000",
                "upstream_base_url": "http://127.0.0.1:11434/v1",
                "upstream_api_key": "env:UPSTREAM_KEY",
                "connect_timeout_seconds": 2,
                "read_timeout_seconds": 30,
                "max_tool_rounds": 2,
            },
            "clients": {"app": {"memory_enabled": True, "inject_recall": False}},
        }
    )
    assert config.proxy.enabled and config.proxy.address == ("::1", 9000)
    assert config.proxy.upstream_api_key == "sk-up"
    assert config.clients["app"].inject_recall is False
    assert parse_config({"clients": {"b": {}}}).clients["b"].inject_recall is True


@pytest.mark.parametrize(
    ("table", "message"),
    [
        ({"listen": "0.0.0.0:8765"}, "not a loopback address"),
        ({"listen": "192.168.1.2:8765"}, "allow_non_loopback"),
        ({"listen": "8765"}, "not host:port"),
        ({"listen": "127.0.0.1:70000"}, "not host:port"),
        ({"upstream_base_url": "api.openai.com"}, "http:// or https://"),
        ({"upstream_api_key": "env:MEMD_TEST_UNSET_VAR"}, "is not set"),
        ({"read_timeout_seconds": 0}, "positive"),
        ({"max_tool_rounds": 0}, "between 1 and 20"),
        ({"listen": 8765}, "must be a string"),
        ({"upstream": "x"}, "unknown key"),
    ],
)
def test_bad_proxy_settings_name_the_key(table: dict[str, object], message: str) -> None:
    os.environ.pop("MEMD_TEST_UNSET_VAR", None)
    with pytest.raises(ConfigError, match=message) as err:
        parse_config({"proxy": table})
    assert "proxy." in str(err.value)


def test_an_anthropic_upstream_alone_enables_the_proxy(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CLAUDE_UPSTREAM_KEY", "sk-ant-up")
    proxy = parse_config(
        {
            "proxy": {
                "anthropic_base_url": "https://api.anthropic.com",
                "anthropic_api_key": "env:CLAUDE_UPSTREAM_KEY",
            }
        }
    ).proxy
    assert proxy.enabled and proxy.anthropic_api_key == "sk-ant-up"
    with pytest.raises(ConfigError, match=r"proxy\.anthropic_base_url"):
        parse_config({"proxy": {"anthropic_base_url": "api.anthropic.com"}})
    with pytest.raises(ConfigError, match="MISSING_CLAUDE_KEY"):
        parse_config({"proxy": {"anthropic_api_key": "env:MISSING_CLAUDE_KEY"}})


def test_non_loopback_only_when_allowed() -> None:
    config = parse_config({"proxy": {"listen": "0.0.0.0:8765", "allow_non_loopback": True}})
    assert config.proxy.address == ("0.0.0.0", 8765)
    assert parse_listen("localhost:0") == ("localhost", 0)
    with pytest.raises(ConfigError, match="inject_recall: must be a boolean"):
        parse_config({"clients": {"a": {"inject_recall": "yes"}}})


# --- keys -------------------------------------------------------------------------------


def test_keys_are_private_named_and_rotated(tmp_path: Path) -> None:
    store = KeyStore(tmp_path)
    key, created = store.ensure("alice")
    assert created and parse_key(key) == "alice" and store.ensure("alice") == (key, False)
    assert store.client_for(key) == "alice"
    path = store.path("alice")
    assert path.stat().st_mode & 0o777 == 0o600 and path.parent.stat().st_mode & 0o777 == 0o700
    new = store.rotate("alice")
    assert store.client_for(key) is None and store.client_for(new) == "alice"
    secret = new.rsplit("~", 1)[1]
    store.ensure("bob")
    assert store.client_for(f"sk-memd~bob~{secret}") is None  # alice's secret, bob's name
    for bad in ("", "sk-memd~", "sk-memd~alice", "sk-memd~al/ice~x", "Bearer x", new + "~"):
        assert store.client_for(bad) is None


def test_a_key_file_others_can_read_is_not_trusted(tmp_path: Path) -> None:
    store = KeyStore(tmp_path)
    key, _ = store.ensure("alice")
    os.chmod(store.path("alice"), 0o644)
    assert store.client_for(key) is None
    os.chmod(store.path("alice"), 0o600)
    assert store.client_for(key) == "alice"


# --- streams ----------------------------------------------------------------------------


def _chunk(delta: dict[str, object], finish: str | None = None) -> dict[str, object]:
    return {"choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}


def test_a_streamed_reply_is_assembled_with_its_tool_calls() -> None:
    splitter, reply = EventSplitter(), ReplyAssembler()
    raw = (
        b'data: {"choices":[{"index":0,"delta":{"role":"assistant","content":"Hel"}}]}\r\n\r\n'
        b": keep-alive comment\n\n"
        b'data: {"choices":[{"index":0,"delta":{"content":"lo"}}]}\n\n'
        b'data: {"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"id":"c1",'
        b'"type":"function","function":{"name":"f","arguments":"{\\"a\\""}}]}}]}\n\n'
        b'data: {"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,'
        b'"function":{"arguments":":1}"}}]},"finish_reason":"tool_calls"}]}\n\n'
        b"data: [DONE]\n\n"
    )
    for i in range(0, len(raw), 7):  # split reads in awkward places
        for payload in splitter.feed(raw[i : i + 7]):
            reply.add(parse_chunk(payload))
    assert reply.done and reply.finish_reason == "tool_calls"
    assert reply.message() == {
        "role": "assistant",
        "content": "Hello",
        "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "f", "arguments": '{"a":1}'}}
        ],
    }


def test_an_event_that_is_not_json_is_a_stream_error() -> None:
    with pytest.raises(StreamError):
        parse_chunk("not json")


# --- the recall tool in a request -------------------------------------------------------

TOOL = MemoryTool.from_listing(
    {
        "memory_on": True,
        "instructions": "Use Recall.",
        "tools": [{"name": "Recall", "description": "d", "inputSchema": {"type": "object"}}],
    }
)


def test_the_tool_and_instructions_are_added_without_touching_the_rest() -> None:
    assert TOOL is not None
    body = {
        "model": "m",
        "custom": 1,
        "tools": [{"type": "function", "function": {"name": "app"}}],
        "messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"}],
    }
    out = inject(body, TOOL)
    assert [t["function"]["name"] for t in out["tools"]] == ["app", "Recall"]
    assert out["messages"][0]["content"] == "Be brief.\n\nUse Recall."
    assert out["custom"] == 1 and body["messages"][0]["content"] == "Be brief."
    bare = inject({"messages": [{"role": "user", "content": "hi"}]}, TOOL)
    assert bare["messages"][0] == {"role": "system", "content": "Use Recall."}


def test_requests_the_tool_cannot_join() -> None:
    assert TOOL is not None
    assert refusal_reason({"messages": [], "n": 2}, TOOL)
    assert refusal_reason({"messages": [], "functions": []}, TOOL)
    clash = {"messages": [], "tools": [{"type": "function", "function": {"name": "Recall"}}]}
    assert refusal_reason(clash, TOOL)
    assert refusal_reason({"messages": [], "n": 1}, TOOL) is None
    assert MemoryTool.from_listing({"memory_on": False, "tools": []}) is None


def test_calls_are_split_into_memory_and_app_calls() -> None:
    calls = [{"function": {"name": "Recall"}}, {"function": {"name": "app"}}, "junk"]
    memory, app = split_calls(calls, "Recall")
    assert memory == [calls[0]] and app == [calls[1], "junk"]


def test_upstream_urls_of_both_api_families() -> None:
    from memd.proxy.upstream import upstream_url

    assert upstream_url("https://api.openai.com/v1", "/v1/responses") == (
        "https://api.openai.com/v1/responses"
    )
    for base in ("https://api.anthropic.com", "https://api.anthropic.com/", "http://h:1/v1"):
        url = upstream_url(base, "/v1/messages", "beta=true", keep_v1=True)
        assert url.endswith("/v1/messages?beta=true") and "/v1/v1" not in url
