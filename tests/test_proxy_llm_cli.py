"""A third-party app through the proxy, end to end: Simon Willison's `llm` command line
tool (from PyPI, not written here), configured with OpenAI-compatible models whose base
URL is the proxy, one on the Responses API and one on Chat Completions, against the fake
upstream. Recorded as one conversation per `llm` conversation, and recalled later.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.proxy_apis import ApisEnv, apis_env
from tests.test_proxy import wait_for

pytestmark = pytest.mark.slow
LLM = shutil.which("llm", path=str(Path(sys.executable).parent))


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ApisEnv]:
    with apis_env(tmp_path_factory.mktemp("proxy-llm")) as env:
        yield env


def llm(env: ApisEnv, home: Path, *args: str) -> str:
    assert LLM is not None, "the dev extra installs `llm`"
    models = [
        {"model_id": "memd-resp", "model_name": "fake", "api_base": env.url, "responses": True},
        {"model_id": "memd-chat", "model_name": "fake", "api_base": env.url},
    ]
    for model in models:
        model["api_key_name"] = "memd"
    (home / "extra-openai-models.yaml").write_text(json.dumps(models))  # YAML reads JSON
    done = subprocess.run(
        [LLM, *args, "--key", env.keys["alice"]],
        capture_output=True,
        text=True,
        timeout=300,  # `llm` imports every OpenAI type: ~20 s on 2 busy cores
        env={**os.environ, "LLM_USER_PATH": str(home)},
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


@pytest.mark.parametrize("model", ["memd-resp", "memd-chat"])
def test_llm_chats_through_the_proxy_and_recalls(env: ApisEnv, tmp_path: Path, model: str) -> None:
    fact = f"FACT-LLM-{model.upper()}-7373"
    before = env.status()["recorded"]
    first = llm(env, tmp_path, "-m", model, f"My bike lock code is {fact}.")
    assert first == f"Echo: My bike lock code is {fact}."
    llm(env, tmp_path, "-c", "My scarf is green.")  # continues: resends the history
    env.wait_recorded(before + 2)
    transcript = env.transcripts("alice")
    assert transcript.count(f"**User:** My bike lock code is {fact}.") == 1
    assert "scarf is green" in transcript

    wait_for(lambda: fact in env.recalled("alice", "bike lock"), "the index")
    answer = llm(env, tmp_path, "-m", model, "RECALL: bike lock code")
    assert answer.startswith("From memory:") and fact in answer
