"""The OpenAI Responses API on `memd proxy`, end to end: the official `openai` SDK
(`client.responses`) -> the proxy in a real `memd run` -> a fake Responses API on
127.0.0.1 (tests/support/fake_apis.py), which keeps responses by id as the real one does.

Each test uses its own conversation text; the test that restarts memd runs last.
"""

from __future__ import annotations

import asyncio
import json
import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest

from tests.support.fake_apis import FakeApis
from tests.support.proxy_apis import UPSTREAM_KEY, ApisEnv, apis_env
from tests.test_proxy import wait_for

pytestmark = pytest.mark.slow
MEMORY_TOOL = "MemoryRecall"
WEATHER = {
    "type": "function",
    "name": "get_weather",
    "description": "Weather for a city",
    "parameters": {"type": "object", "properties": {"x": {"type": "integer"}}},
}


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ApisEnv]:
    with apis_env(tmp_path_factory.mktemp("proxy-responses")) as env:
        yield env


@pytest.fixture
def upstream(env: ApisEnv) -> Iterator[FakeApis]:
    yield env.upstream
    env.upstream.set_mode("ok")


def sent(env: ApisEnv) -> list[dict[str, Any]]:
    return env.upstream.requests_to("/v1/responses")


def conversations(env: ApisEnv, client: str) -> int:
    sessions = env.call("sessions.list", client_id=client)["sessions"]
    return sum(s["conversations"] for s in sessions)


def test_two_turns_are_one_conversation_and_a_third_recalls_the_first(env: ApisEnv) -> None:
    sdk = env.sdk("alice")
    before = env.status()["recorded"]
    first = sdk.responses.create(
        model="m", instructions="Be brief.", input="My shed code is FACT-SHED-6161, remember."
    )
    assert first.output_text == "Echo: My shed code is FACT-SHED-6161, remember."
    turn2: list[Any] = [
        {"role": "user", "content": "My shed code is FACT-SHED-6161, remember."},
        *[item.model_dump(exclude_none=True) for item in first.output],
        {"role": "user", "content": [{"type": "input_text", "text": "And my kite is red."}]},
    ]
    stream = sdk.responses.create(model="m", instructions="Be brief.", input=turn2, stream=True)
    kinds = [event.type for event in stream]
    assert kinds[0] == "response.created" and kinds[-1] == "response.completed"
    assert "response.output_text.delta" in kinds
    env.wait_recorded(before + 2)
    assert conversations(env, "alice") == 1
    transcript = env.transcripts("alice")
    assert "FACT-SHED-6161" in transcript and "kite is red" in transcript

    wait_for(lambda: "FACT-SHED-6161" in env.recalled("alice", "shed code"), "the index")
    seen = len(sent(env))
    third = sdk.responses.create(model="m", input="RECALL: shed code")
    assert [item.type for item in third.output] == ["message"]
    assert third.output_text.startswith("From memory:") and "FACT-SHED-6161" in third.output_text
    asked, answered = sent(env)[seen:]
    assert MEMORY_TOOL in [t["name"] for t in asked["body"]["tools"]]
    outputs = [i for i in answered["body"]["input"] if i.get("type") == "function_call_output"]
    assert len(outputs) == 1 and "FACT-SHED-6161" in outputs[0]["output"]

    async def streamed() -> tuple[list[str], Any]:
        async with env.async_sdk("alice") as client:
            stream = await client.responses.create(
                model="m", input="RECALL: shed code please", stream=True
            )
            events = [event async for event in stream]
        return [e.type for e in events], events[-1].response

    kinds, final = asyncio.run(streamed())
    assert not any("function_call" in k for k in kinds)
    assert kinds.count("response.created") == 1 and kinds[-1] == "response.completed"
    assert [item.type for item in final.output] == ["message"]
    assert "FACT-SHED-6161" in final.output_text
    env.wait_recorded(before + 4)
    transcript = env.transcripts("alice")
    assert "RECALL: shed code please" in transcript and MEMORY_TOOL not in transcript


def test_app_function_tools_pass_through_and_continue_by_id(env: ApisEnv) -> None:
    before, convs = env.status()["recorded"], conversations(env, "carol")
    sdk = env.sdk("carol")
    stream = sdk.responses.create(
        model="m", input="APPTOOL: get_weather FACT-KITE-WIND", tools=[WEATHER], stream=True
    )
    final = next(e for e in stream if e.type == "response.completed").response
    (call,) = final.output
    assert call.type == "function_call" and call.name == "get_weather FACT-KITE-WIND"
    answer = sdk.responses.create(
        model="m",
        previous_response_id=final.id,
        input=[{"type": "function_call_output", "call_id": call.call_id, "output": "windy"}],
        tools=[WEATHER],
    )
    assert answer.output_text == "Tool said: windy"
    env.wait_recorded(before + 2)
    assert conversations(env, "carol") == convs + 1
    transcript = env.transcripts("carol")
    assert transcript.count("**User:** APPTOOL: get_weather FACT-KITE-WIND") == 1
    assert "Tool call" in transcript and "windy" in transcript


def test_memory_and_app_calls_in_one_reply(env: ApisEnv) -> None:
    """The memory call is answered first; the app gets only the call the model makes anew."""
    before = env.status()["recorded"]
    for stream in (False, True):
        seen = len(sent(env))
        name = f"get_weather_{int(stream)}"
        create = env.sdk("alice").responses.create
        if stream:
            events = list(create(model="m", input=f"BOTH: {name}", tools=[WEATHER], stream=True))
            assert [e.output_index for e in events if e.type == "response.output_item.added"] == [0]
            final = events[-1].response
        else:
            final = create(model="m", input=f"BOTH: {name}", tools=[WEATHER])
        assert [(i.type, i.name) for i in final.output] == [("function_call", name)]
        _asked, answered = sent(env)[seen:]
        calls = [i["name"] for i in answered["body"]["input"] if i.get("type") == "function_call"]
        assert calls == [MEMORY_TOOL]
    env.wait_recorded(before + 2)  # nothing of this test is left to land in the next


def test_store_false_is_recorded_but_kept_out_of_the_map(env: ApisEnv) -> None:
    before = env.status()["recorded"]
    answer = env.sdk("carol").responses.create(model="m", input="FACT-NOSTORE-12", store=False)
    env.wait_recorded(before + 1)
    assert "FACT-NOSTORE-12" in env.transcripts("carol")
    (forwarded,) = [r for r in sent(env) if "FACT-NOSTORE-12" in json.dumps(r["body"])]
    assert forwarded["body"]["store"] is False
    kept = env.sdk("carol").responses.create(model="m", input="FACT-STORED-12")
    env.wait_recorded(before + 2)
    db = sqlite3.connect(proxy_dir(env) / "responses.sqlite3")
    try:
        ids = {row[0] for row in db.execute("SELECT id FROM heads WHERE client = 'carol'")}
    finally:
        db.close()
    assert kept.id in ids and answer.id not in ids


def proxy_dir(env: ApisEnv) -> Path:
    return env.proc.config_path.parent / "memory" / ".proxy"


def test_requests_without_a_valid_key_are_refused(env: ApisEnv) -> None:
    before_up, before_rec = len(env.upstream.requests), env.status()["recorded"]
    body = {"model": "m", "input": "FACT-NOKEY-R"}
    secret = env.keys["alice"].rsplit("~", 1)[1]
    for headers in (
        {},
        {"Authorization": "Basic abc"},
        {"Authorization": "Bearer"},
        {"Authorization": f"Bearer {env.keys['alice']} extra"},
        {"Authorization": f"Bearer sk-memd~carol~{secret}"},
        {"Authorization": "Bearer sk-not-a-memd-key"},
    ):
        status, answer = env.raw_json("/v1/responses", body, headers)
        assert status == 401, headers
        assert answer["error"]["code"] == "invalid_api_key"
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=env.url, api_key="sk-wrong", max_retries=0).responses.create(
            model="m", input="x"
        )
    assert len(env.upstream.requests) == before_up
    assert env.status()["recorded"] == before_rec


def test_memory_off_is_forwarded_byte_for_byte_and_never_recorded(env: ApisEnv) -> None:
    before = env.status()
    seen = len(sent(env))
    raw = b'{"model":"m",  "instructions":"Be brief.",\n"input":"FACT-OFF-RESP"}'
    status, _headers, answer = env.raw(
        "/v1/responses", raw, {"Authorization": f"Bearer {env.keys['off']}"}
    )
    assert status == 200 and json.loads(answer)["output"][0]["content"][0]["text"] == (
        "Echo: FACT-OFF-RESP"
    )
    events = list(env.sdk("off").responses.create(model="m", input="FACT-OFF-RESP", stream=True))
    assert events[-1].response.output_text == "Echo: FACT-OFF-RESP"
    (plain, streamed) = sent(env)[seen:]
    assert plain["raw"] == raw and "tools" not in streamed["body"]
    assert plain["headers"]["authorization"] == f"Bearer {UPSTREAM_KEY}"
    after = env.status()
    assert after["recorded"] == before["recorded"]
    assert after["forwarded_without_memory"] == before["forwarded_without_memory"] + 2


def test_upstream_errors_and_a_dropped_stream(env: ApisEnv, upstream: FakeApis) -> None:
    before = env.status()["recorded"]
    upstream.set_mode("error", status=500)
    for client_id in ("alice", "carol", "off"):
        for stream in (False, True):
            with pytest.raises(openai.InternalServerError) as err:
                result = env.sdk(client_id).responses.create(
                    model="m", input="FACT-RESP-ERR", stream=stream
                )
                list(result) if stream else None
            assert err.value.status_code == 500
            assert err.value.response.headers["x-fake"] == "yes"
    upstream.set_mode("error", status=429)
    with pytest.raises(openai.RateLimitError):
        env.sdk("alice").responses.create(model="m", input="FACT-RESP-ERR")
    upstream.set_mode("drop")
    for client_id in ("alice", "carol", "off"):
        with pytest.raises((openai.APIError, openai.APIConnectionError)):
            list(env.sdk(client_id).responses.create(model="m", input="FACT-RESP-ERR", stream=True))
    upstream.set_mode("ok")
    env.sdk("alice").responses.create(model="m", input="FACT-RESP-AFTER")
    env.wait_recorded(before + 1)
    assert env.status()["recorded"] == before + 1
    assert "FACT-RESP-ERR" not in env.transcripts("alice") + env.transcripts("carol")


def test_previous_response_id_continues_the_conversation_across_a_restart(env: ApisEnv) -> None:
    """Turn 2 names turn 1 by id; memd (and the proxy in it) restarts; turn 3 names turn 2."""
    client = "carol"
    before, convs = env.status()["recorded"], conversations(env, client)
    sdk = env.sdk(client)
    first = sdk.responses.create(model="m", instructions="Be brief.", input="FACT-CHAIN-1 hello")

    async def continued() -> Any:  # the async client, not streamed
        async with env.async_sdk(client) as client_sdk:
            return await client_sdk.responses.create(
                model="m",
                instructions="Be brief.",
                previous_response_id=first.id,
                input="FACT-CHAIN-2",
            )

    second = asyncio.run(continued())
    assert second.output_text == "Echo: FACT-CHAIN-2"
    env.wait_recorded(before + 2)
    assert conversations(env, client) == convs + 1
    env.proc.stop()
    env.proc.start()
    env.url = env.status()["url"]

    async def third() -> str:
        async with env.async_sdk(client) as sdk:
            stream = await sdk.responses.create(
                model="m", previous_response_id=second.id, input="FACT-CHAIN-3", stream=True
            )
            return [e async for e in stream][-1].response.output_text

    assert asyncio.run(third()) == "Echo: FACT-CHAIN-3"
    wait_for(lambda: env.status()["recorded"] >= 1, "the third record")
    wait_for(lambda: "FACT-CHAIN-3" in env.transcripts(client), "the third turn's transcript")
    assert conversations(env, client) == convs + 1
    transcript = env.transcripts(client)
    assert transcript.count("**User:** FACT-CHAIN-1 hello") == 1
    assert transcript.count("**User:** FACT-CHAIN-2") == 1
    chain_file = proxy_dir(env) / "responses.sqlite3"
    assert chain_file.stat().st_mode & 0o777 == 0o600
