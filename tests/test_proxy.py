"""`memd proxy` end to end: the official openai SDK -> the proxy in a real `memd run` -> a fake
OpenAI-compatible upstream on 127.0.0.1 (tests/support/fake_openai.py).

One daemon and one upstream serve the module (a daemon costs seconds on 2 cores). Each
test uses its own conversation text, so recordings of one test never match another's;
tests that change the upstream's mode put it back.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import openai
import pytest

from memd.cli.client import MemdClient, RemoteError
from tests.support.daemon import REPO, DaemonProcess, base_config, write_config
from tests.support.fake_openai import MEMORY_TOOL, FakeUpstream

pytestmark = pytest.mark.slow

DEADLINE = 60.0
UPSTREAM_KEY = "upstream-secret-key"
CLIENTS: dict[str, dict[str, Any]] = {
    "alice": {"memory_enabled": True, "mode": "both"},
    "carol": {"memory_enabled": True, "mode": "both", "inject_recall": False},
    "off": {"memory_enabled": False, "mode": "both"},
}
APP_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Weather for a city",
        "parameters": {"type": "object", "properties": {"x": {"type": "integer"}}},
    },
}


def wait_for(predicate: Callable[[], Any], what: str, timeout: float = DEADLINE) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


class Env:
    """The module's daemon, upstream, proxy URL and keys."""

    def __init__(self, proc: DaemonProcess, upstream: FakeUpstream) -> None:
        self.proc = proc
        self.upstream = upstream
        self.url: str = self.status()["url"]
        self.keys = {cid: self.cli("proxy", "key", cid).stdout.strip() for cid in CLIENTS}

    def cli(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "memd.cli", *args, "--config", str(self.proc.config_path)],
            capture_output=True,
            text=True,
            env=self.proc.env,
            cwd=str(REPO),
            timeout=60,
            check=True,
        )

    def call(self, method: str, **params: Any) -> Any:
        with MemdClient(self.proc.socket, timeout=30) as client:
            return client.call(method, params)

    def status(self) -> dict[str, Any]:
        return self.call("daemon.status")["proxy"]

    def sdk(self, client_id: str, **kw: Any) -> openai.OpenAI:
        return openai.OpenAI(base_url=self.url, api_key=self.keys[client_id], max_retries=0, **kw)

    def async_sdk(self, client_id: str, **kw: Any) -> openai.AsyncOpenAI:
        return openai.AsyncOpenAI(
            base_url=self.url, api_key=self.keys[client_id], max_retries=0, **kw
        )

    def wait_recorded(self, count: int) -> None:
        wait_for(
            lambda: self.status()["recorded"] + self.status()["record_failures"] >= count,
            f"{count} records",
        )

    def transcripts(self, client_id: str) -> str:
        sessions = Path(self.proc.config_path.parent / "memory" / client_id / "sessions")
        return "".join(p.read_text() for p in sorted(sessions.glob("*.md")))

    def post(self, body: dict[str, Any], headers: dict[str, str]) -> tuple[int, dict[str, Any]]:
        """A raw HTTP call, for what the SDK cannot send (no key, a malformed header)."""
        request = urllib.request.Request(
            f"{self.url}/chat/completions",
            method="POST",
            data=json.dumps(body).encode(),
            headers={"Content-Type": "application/json", **headers},
        )
        try:
            with urllib.request.urlopen(request, timeout=30) as answer:
                return answer.status, json.loads(answer.read())
        except urllib.error.HTTPError as exc:
            return exc.code, json.loads(exc.read())


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Env]:
    tmp = tmp_path_factory.mktemp("proxy")
    with FakeUpstream() as upstream:
        config = base_config(
            tmp,
            clients=CLIENTS,
            proxy={
                "listen": "127.0.0.1:0",
                "upstream_base_url": upstream.base_url,
                "upstream_api_key": "env:FAKE_UPSTREAM_KEY",
                "read_timeout_seconds": 3,
            },
        )
        proc = DaemonProcess(
            write_config(tmp / "config.toml", config), env={"FAKE_UPSTREAM_KEY": UPSTREAM_KEY}
        )
        try:
            proc.start()
            yield Env(proc, upstream)
        finally:
            proc.stop()


@pytest.fixture
def upstream(env: Env) -> Iterator[FakeUpstream]:
    yield env.upstream
    env.upstream.set_mode("ok")


def user(text: str) -> dict[str, str]:
    return {"role": "user", "content": text}


# --- recording and recall -------------------------------------------------------------


def test_two_turns_are_one_conversation_and_a_third_recalls_the_first(env: Env) -> None:
    sdk = env.sdk("alice")
    before = env.status()["recorded"]
    turn1 = [user("My locker code is FACT-LOCKER-4242, remember it.")]
    first = sdk.chat.completions.create(model="m", messages=turn1)
    answer1 = first.choices[0].message.content
    assert answer1 == "Echo: My locker code is FACT-LOCKER-4242, remember it."
    turn2 = [*turn1, {"role": "assistant", "content": answer1}, user("And my bike is teal.")]
    sdk.chat.completions.create(model="m", messages=turn2)
    env.wait_recorded(before + 2)
    sessions = env.call("sessions.list", client_id="alice")["sessions"]
    assert [s["conversations"] for s in sessions] == [1]
    text = env.transcripts("alice")
    assert "FACT-LOCKER-4242" in text and "bike is teal" in text

    wait_for(lambda: "FACT-LOCKER-4242" in _recall(env, "locker code"), "the index")
    seen = len(env.upstream.chat_requests())
    third = sdk.chat.completions.create(model="m", messages=[user("RECALL: locker code")])
    message = third.choices[0].message
    assert message.tool_calls is None and third.choices[0].finish_reason == "stop"
    assert message.content.startswith("From memory:") and "FACT-LOCKER-4242" in message.content
    asked, answered = env.upstream.chat_requests()[seen:]
    assert MEMORY_TOOL in _tool_names(asked["body"])
    assert asked["body"]["messages"][0]["role"] == "system"
    assert not any(m["role"] == "tool" for m in asked["body"]["messages"])
    results = [m for m in answered["body"]["messages"] if m["role"] == "tool"]
    assert len(results) == 1 and "FACT-LOCKER-4242" in results[0]["content"]

    async def streamed() -> tuple[str, list[Any]]:
        async with env.async_sdk("alice") as client:
            stream = await client.chat.completions.create(
                model="m", messages=[user("RECALL: locker code please")], stream=True
            )
            parts, calls = [], []
            async for chunk in stream:
                for choice in chunk.choices:
                    parts.append(choice.delta.content or "")
                    calls.extend(choice.delta.tool_calls or ())
            return "".join(parts), calls

    content, calls = asyncio.run(streamed())
    assert calls == [] and content.startswith("From memory:") and "FACT-LOCKER-4242" in content
    env.wait_recorded(before + 4)
    assert "RECALL: locker code please" in env.transcripts("alice")


def _recall(env: Env, query: str) -> str:
    try:
        return env.call("memory.recall", client_id="alice", query=query)["text"]
    except RemoteError:
        return ""


def _tool_names(body: dict[str, Any]) -> list[str]:
    return [t["function"]["name"] for t in body.get("tools") or ()]


def test_streamed_app_tool_call_passes_through_and_is_recorded(env: Env) -> None:
    """carol has inject_recall off: no tool added, bytes relayed, reply still recorded."""
    before = env.status()["recorded"]
    seen = len(env.upstream.chat_requests())
    stream = env.sdk("carol").chat.completions.create(
        model="m",
        messages=[user("APPTOOL: get_weather")],
        tools=[APP_TOOL],
        stream=True,
        extra_body={"custom_field": {"kept": True}},
        extra_headers={"X-App": "demo"},
    )
    calls: dict[int, dict[str, str]] = {}
    for chunk in stream:
        for part in chunk.choices[0].delta.tool_calls or ():
            call = calls.setdefault(part.index, {"name": "", "arguments": ""})
            call["name"] += part.function.name or ""
            call["arguments"] += part.function.arguments or ""
    assert calls == {0: {"name": "get_weather", "arguments": '{"x": 1}'}}
    (sent,) = env.upstream.chat_requests()[seen:]
    assert _tool_names(sent["body"]) == ["get_weather"]
    assert sent["body"]["custom_field"] == {"kept": True}
    assert sent["headers"]["authorization"] == f"Bearer {UPSTREAM_KEY}"
    assert sent["headers"]["x-app"] == "demo"
    assert env.keys["carol"] not in json.dumps(sent)
    env.wait_recorded(before + 1)
    assert "get_weather" in env.transcripts("carol")


def test_memory_and_app_calls_in_one_reply(env: Env) -> None:
    """The memory call is answered first; the app gets only its own call back."""
    seen = len(env.upstream.chat_requests())
    reply = env.sdk("alice").chat.completions.create(
        model="m", messages=[user("BOTH: get_weather")], tools=[APP_TOOL]
    )
    choice = reply.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert [c.function.name for c in choice.message.tool_calls] == ["get_weather"]
    first, second = env.upstream.chat_requests()[seen:]
    assert _tool_names(first["body"]) == ["get_weather", MEMORY_TOOL]
    asked = [m for m in second["body"]["messages"] if m["role"] == "assistant"]
    assert [c["function"]["name"] for c in asked[-1]["tool_calls"]] == [MEMORY_TOOL]


def test_models_are_passed_through(env: Env) -> None:
    assert [m.id for m in env.sdk("off").models.list()] == ["fake-model"]


# --- identity ---------------------------------------------------------------------------


def test_requests_without_a_valid_key_are_refused(env: Env) -> None:
    before_up, before_rec = len(env.upstream.requests), env.status()["recorded"]
    body = {"model": "m", "messages": [user("FACT-UNAUTHORISED")]}
    alice_secret = env.keys["alice"].rsplit("~", 1)[1]
    forged = f"sk-memd~carol~{alice_secret}"  # alice's secret under carol's name
    for headers in (
        {},
        {"Authorization": "Basic abc"},
        {"Authorization": "Bearer"},
        {"Authorization": f"Bearer {env.keys['alice']} extra"},
        {"Authorization": f"Bearer {forged}"},
        {"Authorization": "Bearer sk-not-a-memd-key"},
    ):
        status, answer = env.post(body, headers)
        assert status == 401, headers
        assert answer["error"]["code"] == "invalid_api_key"
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=env.url, api_key="sk-wrong", max_retries=0).models.list()
    assert len(env.upstream.requests) == before_up
    assert env.status()["recorded"] == before_rec


def test_a_rotated_key_stops_working(env: Env) -> None:
    old = env.keys["off"]
    new = env.cli("proxy", "key", "off", "--rotate").stdout.strip()
    assert new != old and env.cli("proxy", "key", "off").stdout.strip() == new
    env.keys["off"] = new
    body = {"model": "m", "messages": [user("hello")]}
    assert env.post(body, {"Authorization": f"Bearer {old}"})[0] == 401
    assert env.post(body, {"Authorization": f"Bearer {new}"})[0] == 200
    key_file = env.proc.config_path.parent / "memory" / ".proxy" / "off.key"
    assert key_file.stat().st_mode & 0o777 == 0o600
    assert key_file.parent.stat().st_mode & 0o777 == 0o700


# --- memory off -------------------------------------------------------------------------


def test_memory_off_is_forwarded_unchanged_and_never_recorded(env: Env) -> None:
    before = env.status()
    seen = len(env.upstream.chat_requests())
    messages = [{"role": "system", "content": "Be brief."}, user("FACT-OFF-77 hello")]
    reply = env.sdk("off").chat.completions.create(model="m", messages=messages)
    assert reply.choices[0].message.content == "Echo: FACT-OFF-77 hello"
    chunks = list(env.sdk("off").chat.completions.create(model="m", messages=messages, stream=True))
    assert (
        "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        == "Echo: FACT-OFF-77 hello"
    )
    for sent in env.upstream.chat_requests()[seen:]:
        assert sent["body"]["messages"] == messages and "tools" not in sent["body"]
    after = env.status()
    assert after["recorded"] == before["recorded"]
    assert after["forwarded_without_memory"] == before["forwarded_without_memory"] + 2
    assert not (env.proc.config_path.parent / "memory" / "off" / "sessions").exists()


# --- upstream failures ------------------------------------------------------------------


def test_upstream_error_keeps_status_and_body(env: Env, upstream: FakeUpstream) -> None:
    before = env.status()["recorded"]
    upstream.set_mode("error", status=500)
    for client_id in ("alice", "off"):
        for stream in (False, True):
            with pytest.raises(openai.InternalServerError) as err:
                create = env.sdk(client_id).chat.completions.create
                result = create(model="m", messages=[user("FACT-ERR")], stream=stream)
                list(result) if stream else None
            assert err.value.status_code == 500
            assert err.value.body["message"] == "fake failure 500"
            assert err.value.response.headers["x-fake"] == "yes"
    upstream.set_mode("error", status=429)
    with pytest.raises(openai.RateLimitError):
        env.sdk("alice").chat.completions.create(model="m", messages=[user("FACT-ERR")])
    assert env.status()["recorded"] == before


def test_a_hung_upstream_times_out_and_an_app_that_gives_up_cancels_it(
    env: Env, upstream: FakeUpstream
) -> None:
    upstream.set_mode("hang")
    with pytest.raises(openai.APIStatusError) as err:  # the proxy's read timeout (3 s)
        env.sdk("alice").chat.completions.create(model="m", messages=[user("FACT-HANG")])
    assert err.value.status_code == 504
    assert err.value.body["code"] == "upstream_timeout"
    cancelled = upstream.cancelled
    with pytest.raises(openai.APITimeoutError):
        env.sdk("off", timeout=0.5).chat.completions.create(
            model="m", messages=[user("FACT-HANG")], stream=True
        )
    wait_for(
        lambda: upstream.cancelled > cancelled, "the upstream request to be cancelled", timeout=10
    )


def test_a_dropped_stream_reaches_the_app_and_is_not_recorded(
    env: Env, upstream: FakeUpstream
) -> None:
    before = env.status()["recorded"]
    upstream.set_mode("drop")
    for client_id in ("alice", "carol", "off"):
        with pytest.raises((openai.APIError, openai.APIConnectionError)):
            stream = env.sdk(client_id).chat.completions.create(
                model="m", messages=[user("FACT-DROPPED stream")], stream=True
            )
            for _ in stream:
                pass
    with pytest.raises((openai.APIStatusError, openai.APIConnectionError)):
        env.sdk("alice").chat.completions.create(model="m", messages=[user("FACT-DROPPED")])
    upstream.set_mode("ok")
    env.sdk("alice").chat.completions.create(model="m", messages=[user("FACT-AFTER-DROP")])
    env.wait_recorded(before + 1)
    assert env.status()["recorded"] == before + 1
    assert "FACT-DROPPED" not in env.transcripts("alice") + env.transcripts("carol")


def test_a_failed_record_never_breaks_the_chat(env: Env) -> None:
    """memd refuses the record (content of a type it cannot store); the app gets its answer."""
    before = env.status()
    status, answer = env.post(
        {"model": "m", "messages": [{"role": "user", "content": 42}]},
        {"Authorization": f"Bearer {env.keys['carol']}"},
    )
    assert status == 200 and answer["choices"][0]["message"]["content"] == "Echo: 42"
    wait_for(
        lambda: env.status()["record_failures"] > before["record_failures"],
        "the record failure to be counted",
    )
    assert "carol" in env.status()["last_record_error"]
    shown = env.cli("status").stdout
    assert "record failures" in shown and env.url in shown


def test_a_config_edit_applies_to_the_next_request(env: Env) -> None:
    """Turning carol's inject_recall on (then off again) needs no restart of anything."""

    def offered() -> bool:
        seen = len(env.upstream.chat_requests())
        env.sdk("carol").chat.completions.create(model="m", messages=[user("reload check")])
        return MEMORY_TOOL in _tool_names(env.upstream.chat_requests()[seen]["body"])

    config = _config_of(env)
    config["clients"]["carol"]["inject_recall"] = True
    write_config(env.proc.config_path, config)
    try:
        wait_for(offered, "the edit to apply")
    finally:
        config["clients"]["carol"]["inject_recall"] = False
        write_config(env.proc.config_path, config)
        wait_for(lambda: not offered(), "the edit to be undone")


def test_memd_proxy_runs_standalone(env: Env, tmp_path: Path) -> None:
    """`memd proxy` serves on its own address, against the running memd's socket."""
    config = json.loads(json.dumps(_config_of(env)))
    config["proxy"]["listen"] = "127.0.0.1:0"
    path = write_config(env.proc.config_path.with_name("standalone.toml"), config)
    proc = subprocess.Popen(
        [sys.executable, "-m", "memd.cli", "proxy", "--config", str(path)],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        env=env.proc.env,
        cwd=str(REPO),
    )
    try:
        line = proc.stdout.readline()  # type: ignore[union-attr]
        assert line.startswith("memd proxy listening on http://127.0.0.1:")
        url = line.split()[-1]
        client = openai.OpenAI(base_url=url, api_key=env.keys["off"], max_retries=0)
        reply = client.chat.completions.create(model="m", messages=[user("standalone")])
        assert reply.choices[0].message.content == "Echo: standalone"
    finally:
        proc.terminate()
        assert proc.wait(20) == 0


def _config_of(env: Env) -> dict[str, Any]:
    import tomllib

    return tomllib.loads(env.proc.config_path.read_text())
