"""The Anthropic Messages API on `memd proxy`, end to end: the official `anthropic` SDK ->
the proxy in a real `memd run` -> a fake Messages API on 127.0.0.1 (tests/support/fake_apis.py).

Each test uses its own conversation text, so recordings of one never match another's.
"""

from __future__ import annotations

import asyncio
import base64
import json
from collections.abc import Iterator
from typing import Any

import anthropic
import pytest

from tests.support.fake_apis import FakeApis
from tests.support.proxy_apis import ANTHROPIC_KEY, ApisEnv, apis_env
from tests.test_proxy import wait_for

pytestmark = pytest.mark.slow
MEMORY_TOOL = "MemoryRecall"
WEATHER = {
    "name": "get_weather",
    "description": "Weather for a city",
    "input_schema": {"type": "object", "properties": {"x": {"type": "integer"}}},
}


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ApisEnv]:
    with apis_env(tmp_path_factory.mktemp("proxy-anthropic")) as env:
        yield env


@pytest.fixture
def upstream(env: ApisEnv) -> Iterator[FakeApis]:
    yield env.upstream
    env.upstream.set_mode("ok")


def sent(env: ApisEnv) -> list[dict[str, Any]]:
    return env.upstream.requests_to("/v1/messages")


def text(message: Any) -> str:
    return "".join(b.text for b in message.content if b.type == "text")


def test_two_turns_are_one_conversation_and_a_third_recalls_the_first(env: ApisEnv) -> None:
    claude = env.claude("alice")
    before = env.status()["recorded"]
    turn1: list[Any] = [{"role": "user", "content": "My gate code is FACT-GATE-5151, remember."}]
    first = claude.messages.create(
        model="claude-x", max_tokens=100, system="Be brief.", messages=turn1
    )
    assert text(first) == "Echo: My gate code is FACT-GATE-5151, remember."
    turn2 = [
        *turn1,
        {"role": "assistant", "content": [b.model_dump() for b in first.content]},
        {"role": "user", "content": "And my boat is called Nimbus."},
    ]
    with claude.messages.stream(
        model="claude-x", max_tokens=100, system="Be brief.", messages=turn2
    ) as stream:
        streamed = "".join(stream.text_stream)
    assert streamed == "Echo: And my boat is called Nimbus."
    env.wait_recorded(before + 2)
    sessions = env.call("sessions.list", client_id="alice")["sessions"]
    assert sum(s["conversations"] for s in sessions) == 1
    transcript = env.transcripts("alice")
    assert "FACT-GATE-5151" in transcript and "boat is called Nimbus" in transcript

    wait_for(lambda: "FACT-GATE-5151" in env.recalled("alice", "gate code"), "the index")
    seen = len(sent(env))
    third = claude.messages.create(
        model="claude-x",
        max_tokens=100,
        messages=[{"role": "user", "content": "RECALL: gate code"}],
    )
    assert [b.type for b in third.content] == ["text"] and third.stop_reason == "end_turn"
    assert text(third).startswith("From memory:") and "FACT-GATE-5151" in text(third)
    asked, answered = sent(env)[seen:]
    assert MEMORY_TOOL in [t["name"] for t in asked["body"]["tools"]]
    assert asked["body"]["system"]  # the tool's instructions
    results = [
        b
        for m in answered["body"]["messages"]
        if isinstance(m["content"], list)
        for b in m["content"]
        if b.get("type") == "tool_result"
    ]
    assert len(results) == 1 and "FACT-GATE-5151" in results[0]["content"]

    async def streamed_recall() -> tuple[list[str], str]:
        async with (
            env.async_claude("alice") as client,
            client.messages.stream(
                model="claude-x",
                max_tokens=100,
                messages=[{"role": "user", "content": "RECALL: gate code please"}],
            ) as stream,
        ):
            kinds = [event.type async for event in stream]
            final = await stream.get_final_message()
        assert all(b.type == "text" for b in final.content)
        return kinds, text(final)

    kinds, answer = asyncio.run(streamed_recall())
    assert kinds[0] == "message_start" and kinds[-1] == "message_stop"
    assert answer.startswith("From memory:") and "FACT-GATE-5151" in answer
    env.wait_recorded(before + 4)
    transcript = env.transcripts("alice")
    assert "RECALL: gate code please" in transcript
    assert MEMORY_TOOL not in transcript  # the proxy's own calls are never recorded


def test_blocks_of_every_kind_pass_and_only_text_is_recorded(env: ApisEnv) -> None:
    before = env.status()["recorded"]
    seen = len(sent(env))
    payload = base64.b64encode(b"\x89PNG-FACT-PIXELS-not-text" * 20).decode()
    content = [
        {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": payload}},
        {"type": "text", "text": "THINK: what is FACT-PICTURE-303?"},
    ]
    with env.claude("carol").messages.stream(
        model="claude-x",
        max_tokens=100,
        system=[{"type": "text", "text": "You look at pictures."}],
        messages=[{"role": "user", "content": content}],
    ) as stream:
        final = stream.get_final_message()
    assert [b.type for b in final.content] == ["thinking", "text"]
    assert final.content[0].signature == "sig-1"
    (forwarded,) = sent(env)[seen:]
    assert forwarded["body"]["messages"][0]["content"][0]["source"]["data"] == payload
    env.wait_recorded(before + 1)
    transcript = env.transcripts("carol")
    assert "FACT-PICTURE-303" in transcript and "You look at pictures." in transcript
    assert "[image]" in transcript and "[thinking]" in transcript
    assert payload[:40] not in transcript and "hmm hmm" not in transcript


def test_app_tools_and_tool_results_pass_through(env: ApisEnv) -> None:
    before = env.status()["recorded"]
    claude = env.claude("alice")
    ask: list[Any] = [{"role": "user", "content": "APPTOOL: get_weather FACT-WEATHER-9"}]
    with claude.messages.stream(
        model="claude-x", max_tokens=100, tools=[WEATHER], messages=ask
    ) as stream:
        called = stream.get_final_message()
    (use,) = called.content
    assert use.type == "tool_use" and use.name == "get_weather FACT-WEATHER-9"
    assert use.input == {"x": 1} and called.stop_reason == "tool_use"
    follow = [
        *ask,
        {"role": "assistant", "content": [use.model_dump()]},
        {
            "role": "user",
            "content": [{"type": "tool_result", "tool_use_id": use.id, "content": "sunny, 21C"}],
        },
    ]
    answer = claude.messages.create(
        model="claude-x", max_tokens=100, tools=[WEATHER], messages=follow
    )
    assert text(answer) == "Tool said: sunny, 21C"
    env.wait_recorded(before + 2)
    transcript = env.transcripts("alice")
    assert "Tool call" in transcript and "sunny, 21C" in transcript
    assert transcript.count("**User:** APPTOOL: get_weather FACT-WEATHER-9") == 1


def test_memory_and_app_calls_in_one_reply(env: ApisEnv) -> None:
    """The memory call is answered first; the app gets only the call the model makes anew."""
    before = env.status()["recorded"]
    for stream in (False, True):
        seen = len(sent(env))
        ask = [{"role": "user", "content": f"BOTH: get_weather_{int(stream)}"}]
        claude = env.claude("alice")
        if stream:
            with claude.messages.stream(
                model="m", max_tokens=50, tools=[WEATHER], messages=ask
            ) as s:
                reply = s.get_final_message()
        else:
            reply = claude.messages.create(model="m", max_tokens=50, tools=[WEATHER], messages=ask)
        assert [(b.type, b.name) for b in reply.content] == [
            ("tool_use", f"get_weather_{int(stream)}")
        ]
        assert reply.stop_reason == "tool_use"
        _asked, answered = sent(env)[seen:]
        uses = [
            b["name"]
            for m in answered["body"]["messages"]
            if isinstance(m["content"], list)
            for b in m["content"]
            if b.get("type") == "tool_use"
        ]
        assert uses == [MEMORY_TOOL]  # the app's call of that reply is not sent back
    env.wait_recorded(before + 2)  # nothing of this test is left to land in the next


def test_requests_without_a_valid_key_are_refused(env: ApisEnv) -> None:
    before_up, before_rec = len(env.upstream.requests), env.status()["recorded"]
    body = {"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": "FACT-NOKEY"}]}
    secret = env.keys["alice"].rsplit("~", 1)[1]
    for path in ("/v1/messages", "/v1/messages/count_tokens"):
        for headers in (
            {},
            {"x-api-key": ""},
            {"x-api-key": "sk-not-a-memd-key"},
            {"x-api-key": f"sk-memd~carol~{secret}"},  # alice's secret under carol's name
            {"Authorization": "Basic abc"},
            {"Authorization": f"Bearer {env.keys['alice']} extra"},
        ):
            status, answer = env.raw_json(path, body, headers)
            assert status == 401, headers
            assert answer["type"] == "error" and answer["error"]["type"] == "authentication_error"
    with pytest.raises(anthropic.AuthenticationError):
        anthropic.Anthropic(base_url=env.root, api_key="sk-wrong", max_retries=0).messages.create(
            model="m", max_tokens=5, messages=[{"role": "user", "content": "x"}]
        )
    assert len(env.upstream.requests) == before_up
    assert env.status()["recorded"] == before_rec
    bearer = {"Authorization": f"Bearer {env.keys['off']}", "anthropic-version": "2023-06-01"}
    assert env.raw_json("/v1/messages", body, bearer)[0] == 200


def test_memory_off_is_forwarded_byte_for_byte_and_never_recorded(env: ApisEnv) -> None:
    before = env.status()
    seen = len(env.upstream.requests)
    raw = (
        b'{"model":"m",  "max_tokens":9,"system":"Be brief.",\n'
        b'"messages":[{"role":"user","content":"FACT-OFF-88"}]}'
    )
    headers = {
        "x-api-key": env.keys["off"],
        "anthropic-version": "2023-06-01",
        "anthropic-beta": "fake-beta-2025",
    }
    status, _headers, answer = env.raw("/v1/messages", raw, headers)
    assert status == 200 and json.loads(answer)["content"][0]["text"] == "Echo: FACT-OFF-88"
    count = env.raw("/v1/messages/count_tokens", raw, headers)
    assert count[0] == 200 and json.loads(count[2])["input_tokens"] > 0
    for request in env.upstream.requests[seen:]:
        assert request["raw"] == raw
        assert request["headers"]["x-api-key"] == ANTHROPIC_KEY
        assert request["headers"]["anthropic-version"] == "2023-06-01"
        assert request["headers"]["anthropic-beta"] == "fake-beta-2025"
        assert env.keys["off"] not in json.dumps(request["headers"])
    assert [r["path"] for r in env.upstream.requests[seen:]] == [
        "/v1/messages",
        "/v1/messages/count_tokens",
    ]
    after = env.status()
    assert after["recorded"] == before["recorded"]
    assert after["forwarded_without_memory"] == before["forwarded_without_memory"] + 1


def test_upstream_errors_and_a_dropped_stream(env: ApisEnv, upstream: FakeApis) -> None:
    before = env.status()["recorded"]
    ask = [{"role": "user", "content": "FACT-ANTHROPIC-ERR"}]
    upstream.set_mode("error", status=500)
    for client_id in ("alice", "carol", "off"):
        with pytest.raises(anthropic.InternalServerError) as err:
            env.claude(client_id).messages.create(model="m", max_tokens=5, messages=ask)
        assert err.value.status_code == 500
        assert err.value.response.headers["x-fake"] == "yes"
        assert "fake failure 500" in str(err.value)
    upstream.set_mode("error", status=429)
    claude = env.claude("alice")
    with (
        pytest.raises(anthropic.RateLimitError),
        claude.messages.stream(model="m", max_tokens=5, messages=ask) as s,
    ):
        s.get_final_message()
    upstream.set_mode("drop")
    for client_id in ("alice", "carol", "off"):
        claude = env.claude(client_id)
        with (
            pytest.raises((anthropic.APIError, anthropic.APIConnectionError)),
            claude.messages.stream(model="m", max_tokens=5, messages=ask) as s,
        ):
            s.get_final_message()
    upstream.set_mode("ok")
    env.claude("alice").messages.create(
        model="m", max_tokens=5, messages=[{"role": "user", "content": "FACT-ANTHROPIC-AFTER"}]
    )
    env.wait_recorded(before + 1)
    assert env.status()["recorded"] == before + 1
    assert "FACT-ANTHROPIC-ERR" not in env.transcripts("alice") + env.transcripts("carol")
