"""Conversation text goes only where memd's config sends it (issue #14, finding 1).

The SDKs memd uses read their own environment variables (`OPENAI_API_KEY`,
`OPENAI_BASE_URL`, `ANTHROPIC_*`, `GEMINI_*`/`GOOGLE_*`) when a key or base URL is not
passed. Every test here sets those variables to point at a listening fake LLM and proves
that it receives nothing unless memd's own config names it.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from memd.cli.client import RemoteError
from memd.compaction import llm
from memd.config import ConfigError, parse_config
from tests.support.daemon import REPO
from tests.support.fake_llm import FakeLLM

CLIENT = "demo"
SECRET = "SECRET-PIN-7777"


@pytest.fixture
def fake() -> Iterator[FakeLLM]:
    with FakeLLM() as server:
        yield server


def sdk_env(fake: FakeLLM) -> dict[str, str]:
    """Every SDK variable a provider might fall back to, aimed at the fake server."""
    return {
        "OPENAI_API_KEY": "sk-from-the-environment",
        "OPENAI_BASE_URL": fake.base_url,
        "ANTHROPIC_API_KEY": "sk-ant-env",
        "ANTHROPIC_AUTH_TOKEN": "tok-env",
        "ANTHROPIC_BASE_URL": fake.root_url,
        "GEMINI_API_KEY": "gem-env",
        "GOOGLE_API_KEY": "goog-env",
        "GOOGLE_GEMINI_BASE_URL": fake.root_url,
    }


def memd_cli(config: Path, env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    import os

    return subprocess.run(
        [sys.executable, "-m", "memd.cli", *args, "--config", str(config)],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=str(REPO),
        env={**os.environ, **env},
    )


def settle(fake: FakeLLM, seconds: float = 3.0) -> None:
    """Give a wrongly queued compaction the time to reach the fake (it takes milliseconds)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and not fake.requests:
        time.sleep(0.05)


def test_recompact_with_compaction_disabled_is_refused_and_sends_nothing(
    tmp_path: Path, config_file, daemon_factory, fake: FakeLLM
) -> None:
    env = sdk_env(fake)
    config = config_file(clients={CLIENT: {"memory_enabled": True, "mode": "both"}})
    memd = daemon_factory(config, env=env)
    memd.call(
        "memory.record_exchange",
        {
            "client_id": CLIENT,
            "conversation_id": "c1",
            "user": f"My PIN is {SECRET}",
            "assistant": "noted",
        },
    )
    ended = memd.call("sessions.close", {"client_id": CLIENT})["sessions"]
    sid = ended[0]["session_id"]

    with pytest.raises(RemoteError) as err:
        memd.call("sessions.recompact", {"client_id": CLIENT, "session_id": sid})
    assert err.value.kind == "compaction_disabled"
    assert "[compaction]" in str(err.value)

    out = memd_cli(config, env, "sessions", "recompact", CLIENT)
    assert out.returncode != 0, out.stdout
    assert "compaction" in out.stderr and "disabled" in out.stderr, out.stderr

    settle(fake)
    assert fake.requests == []
    memory = tmp_path / "memory" / CLIENT
    assert (memory / "sessions" / f"{sid}.md").exists()
    assert not (memory / "sessions" / f"{sid}-summary.md").exists()
    assert not (memory / "archive" / f"{sid}.md").exists()


def test_enabled_compaction_must_name_provider_and_model() -> None:
    with pytest.raises(ConfigError, match=r"compaction\.llm_model"):
        parse_config({"compaction": {"enabled": True, "llm_provider": "openai"}})
    with pytest.raises(ConfigError, match=r"compaction\.llm_provider"):
        parse_config({"compaction": {"enabled": True, "llm_model": "gpt-5-mini"}})
    # disabled: nothing needs naming
    assert not parse_config({"compaction": {"enabled": False}}).compaction.enabled


@pytest.mark.parametrize("provider", ["openai", "anthropic"])
def test_llm_call_never_reads_sdk_environment(
    provider: str, fake: FakeLLM, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No key and no base URL in the config: the call fails at once, nothing is sent."""
    if provider == "anthropic":
        pytest.importorskip("anthropic")
    for name, value in sdk_env(fake).items():
        monkeypatch.setenv(name, value)
    settings = llm.LLMSettings(provider=provider, model="fake", timeout=10)
    with pytest.raises(llm.LLMError) as err:
        asyncio.run(llm.complete(settings, f"summarise: {SECRET}"))
    assert err.value.reason == "setup"
    assert "api_key" in str(err.value)
    assert fake.requests == []


@pytest.mark.parametrize("provider", ["openai", "anthropic"])
def test_configured_base_url_gets_the_configured_key_only(
    provider: str, fake: FakeLLM, monkeypatch: pytest.MonkeyPatch
) -> None:
    if provider == "anthropic":
        pytest.importorskip("anthropic")
    for name, value in sdk_env(fake).items():
        monkeypatch.setenv(name, value)
    base = fake.base_url if provider == "openai" else fake.root_url
    settings = llm.LLMSettings(provider=provider, model="fake", base_url=base, timeout=10)
    assert asyncio.run(llm.complete(settings, "hello"))
    [req] = fake.requests
    assert "env" not in req.authorization and "environment" not in req.authorization


def test_gemini_never_reads_sdk_environment(fake: FakeLLM, monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("google.genai")
    for name, value in sdk_env(fake).items():
        monkeypatch.setenv(name, value)
    settings = llm.LLMSettings(provider="gemini", model="fake", timeout=10)
    with pytest.raises(llm.LLMError) as err:
        asyncio.run(llm.complete(settings, f"summarise: {SECRET}"))
    assert err.value.reason == "setup"
    assert fake.requests == []


def test_keyed_embedding_provider_needs_a_configured_key() -> None:
    """Every chunk would go to the provider with whatever key the environment holds."""
    with pytest.raises(ConfigError, match=r"embedding\.api_key"):
        parse_config({"embedding": {"provider": "voyage"}})
    with pytest.raises(ConfigError, match=r"embedding\.api_key"):
        parse_config({"embedding": {"provider": "openai"}})
    # a local OpenAI-compatible server needs none; neither do the offline providers
    parse_config({"embedding": {"provider": "openai", "base_url": "http://127.0.0.1:9/v1"}})
    parse_config({"embedding": {"provider": "onnx"}})
    parse_config({})
