"""The compaction tests' fixtures: the fake LLM and a client folder.

A test module loads them with `pytest_plugins = ("tests.support.compaction_fixtures",)`
(and does not import this module itself, so pytest can load it as a plugin).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from memd.layout import ClientLayout
from tests.support.fake_llm import FakeLLM


@pytest.fixture
def fake() -> Iterator[FakeLLM]:
    with FakeLLM() as server:
        server.retry_after_ms = 5  # the SDK's own quick retries, kept quick
        yield server


@pytest.fixture
def layout(tmp_path: Path) -> ClientLayout:
    lay = ClientLayout(tmp_path / "memory", "laptop")
    lay.ensure()
    return lay
