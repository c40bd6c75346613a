"""`memd redact` through a real `memd run` (issue #26, item 6).

Secrets recorded while scrubbing was off sit verbatim in a live transcript, in a
compacted session's raw transcript in `archive/`, and in the index. After scrubbing is
turned on, `memd redact --dry-run` lists them by kind and where and changes no byte;
`memd redact --yes` then leaves none of them in any file under the memory folder, the
index included, and recall shows the markers.
"""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from memd.cli.client import RemoteError
from tests.secret_corpus import embed, secrets
from tests.support.daemon import DaemonProcess, base_config, write_config
from tests.support.fake_llm import FakeLLM

pytestmark = pytest.mark.slow

CLIENT = "old"


@pytest.fixture
def fake() -> Iterator[FakeLLM]:
    with FakeLLM() as server:
        yield server


def traces(root: Path, needles: list[str]) -> list[str]:
    hits = []
    for path in root.rglob("*"):
        if path.is_file() and not path.is_symlink():
            data = path.read_bytes()
            hits += [f"{path.relative_to(root)}: {n[:20]}" for n in needles if n.encode() in data]
    return hits


def snapshot(root: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(root)): p.read_bytes()
        for sub in ("sessions", "archive")
        for p in (root / sub).rglob("*")
        if p.is_file()
    }


def wait_for(predicate: Any, what: str, memd: DaemonProcess, timeout: float = 150.0) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if result := predicate():
            return result
        time.sleep(0.3)
    raise AssertionError(f"timed out waiting for {what}\n{memd.log()[-4000:]}")


def recall(memd: DaemonProcess, query: str) -> str:
    try:
        out = memd.call("memory.recall", {"client_id": CLIENT, "query": query, "top_k": 20})
    except RemoteError as exc:
        if exc.kind != "index_unavailable":
            raise
        return ""
    return "\n".join(r["content"] for r in out["results"])


def memd_cli(config: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "memd.cli", *args, "--config", str(config)],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
        stdin=subprocess.DEVNULL,
    )


def test_redact_dry_run_changes_nothing_and_redact_leaves_nothing(
    tmp_path: Path, daemon_factory, fake: FakeLLM
) -> None:
    settings: dict[str, Any] = {
        "privacy": {"redact_secrets": False},
        "compaction": {
            "enabled": True,
            "llm_provider": "openai",
            "llm_model": "fake",
            "base_url": fake.base_url,
        },
        "clients": {CLIENT: {"memory_enabled": True, "mode": "mcp_via_llm"}},
    }
    config = write_config(tmp_path / "config.toml", base_config(tmp_path, **settings))
    memd = daemon_factory(config)
    root = tmp_path / "memory" / CLIENT
    corpus = secrets(seed=5)
    values = [v for _k, v, _w in corpus]

    def record(i: int, kind: str, written: str) -> dict[str, Any]:
        return memd.call(
            "memory.record_exchange",
            {
                "client_id": CLIENT,
                "conversation_id": f"c{i}",
                "user": f"greenhouse step {i}: " + embed(kind, written, i),
                "assistant": "Noted for the greenhouse.",
            },
        )

    half = len(corpus) // 2
    first = record(0, *corpus[0][::2])["session_id"]
    for i, (kind, _v, written) in enumerate(corpus[1:half], 1):
        record(i, kind, written)
    memd.call("sessions.close", {"client_id": CLIENT})
    wait_for(lambda: (root / "archive" / f"{first}.md").exists(), "the compaction", memd)
    for i, (kind, _v, written) in enumerate(corpus[half:], half):
        assert record(i, kind, written)["redacted"] == 0
    wait_for(lambda: values[-1] in recall(memd, "greenhouse step"), "indexing", memd)
    assert traces(root, values)  # stored verbatim, as asked

    settings["privacy"] = {"redact_secrets": True}
    write_config(config, base_config(tmp_path, **settings))
    wait_for(
        lambda: memd.call(
            "memory.record_exchange",
            {
                "client_id": CLIENT,
                "conversation_id": "probe",
                "user": corpus[0][2],
                "assistant": "k",
            },
        )["redacted"],
        "the config reload",
        memd,
    )

    before = snapshot(root)
    dry = memd_cli(config, "redact", CLIENT, "--dry-run")
    assert dry.returncode == 0, dry.stderr
    assert "would replace" in dry.stdout and "archive:" in dry.stdout
    assert "transcripts:" in dry.stdout and "github-token" in dry.stdout
    assert not any(v in dry.stdout for v in values)
    assert snapshot(root) == before

    refused = memd_cli(config, "redact", CLIENT)
    assert refused.returncode == 2 and "--yes" in refused.stderr
    assert snapshot(root) == before

    done = memd_cli(config, "redact", CLIENT, "--yes")
    assert done.returncode == 0, done.stderr + memd.log()[-3000:]
    assert "replaced" in done.stdout and "index rebuilt" in done.stdout
    assert traces(root, values) == []
    wait_for(lambda: "[redacted:" in recall(memd, "greenhouse step"), "markers in recall", memd)
    again = memd_cli(config, "redact", CLIENT, "--dry-run")
    assert "no secrets found" in again.stdout
