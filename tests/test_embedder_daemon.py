"""The embedder child in the real daemon: the model lives there and not in memd, recall
finds a paraphrase through it, a kill -9 of it is survived, a bad request is answered.
Real memsearch, real Milvus Lite, the real model."""

from __future__ import annotations

import json
import math
import os
import signal
import socket
from pathlib import Path
from typing import Any

import psutil
import pytest

from memd.indexing.index_requests import unpack_vector
from tests.support.faults import call, child_status, pipeline_running, recall_finds, wait_for

pytestmark = [pytest.mark.slow]

CLIENTS = {"ann": {"memory_enabled": True, "mode": "mcp_via_llm"}}
EMBEDDER = "memd.indexing.children.embedder"
# What only the model's process may map: onnxruntime, tokenizers, google.protobuf, numpy
# (memd's recall splits transcripts without it: ~12 MB of memd's PSS, issue 29).
MODEL_LIBS = ("/onnxruntime/", "/tokenizers/", "/google/_upb/", "/google/protobuf/", "/numpy/")
# Native modules of the OpenAI SDK's stack (pydantic, its JSON parser): a process that
# imported `openai` maps them; the SDK itself is pure Python, absent from the maps.
SDK_LIBS = ("/pydantic_core/", "/jiter/")
# A fact and a question sharing no content word: only the dense half finds it.
FACT = ("I'm allergic to peanuts and shellfish.", "Noted, no peanuts or shellfish.")
ASKED = "what foods can't I eat?"


def _embedder(sock: Path) -> dict[str, Any]:
    return call(sock, "daemon.status").get("embedder") or {}


def _ready(sock: Path) -> bool:
    return pipeline_running(sock, "ann") and _embedder(sock).get("state") == "RUNNING"


def _model_libs(pid: int) -> set[str]:
    text = Path(f"/proc/{pid}/maps").read_text(errors="replace")
    return {lib for lib in MODEL_LIBS if lib in text}


def _record(sock: Path, user: str, assistant: str) -> None:
    params = {"client_id": "ann", "conversation_id": "e", "user": user, "assistant": assistant}
    call(sock, "memory.record_exchange", params)


def _recall(sock: Path, query: str) -> list[dict[str, Any]]:
    params = {"client_id": "ann", "query": query, "top_k": 5}
    return list(call(sock, "memory.recall", params)["results"])


def _socket_of(pid: int) -> Path:
    argv = psutil.Process(pid).cmdline()
    return Path(argv[argv.index("--socket") + 1])


def _exchange(path: Path, lines: list[bytes]) -> list[dict[str, Any]]:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
        conn.settimeout(60)
        conn.connect(str(path))
        reader = conn.makefile("rb")
        out = []
        for line in lines:
            conn.sendall(line)
            out.append(json.loads(reader.readline()))
        return out


def test_the_model_lives_in_the_embedder_and_recall_finds_a_paraphrase_through_it(
    config_file, daemon_factory
) -> None:
    memd = daemon_factory(config_file(clients=CLIENTS))
    sock = memd.socket
    wait_for(lambda: _ready(sock), 180, 0.3, "pipeline and embedder RUNNING")
    child = _embedder(sock)
    assert child["name"] == "_shared/embedder"
    proc = psutil.Process(child["pid"])
    assert proc.ppid() == memd.proc.pid and EMBEDDER in " ".join(proc.cmdline())
    _record(sock, *FACT)
    wait_for(lambda: recall_finds(sock, "ann", ASKED, "shellfish"), 90, 0.3, "paraphrase found")
    assert {"/onnxruntime/", "/tokenizers/"} <= _model_libs(child["pid"])
    # after a recall and a watcher's indexing, memd itself has loaded none of it
    assert _model_libs(memd.proc.pid) == set()
    status = call(sock, "daemon.status")
    assert status["embedder"]["state"] == "RUNNING" and status["zygote"]["forked"] >= 3
    assert _zygote_threads(memd.config_path.parent / "memory") == [1]  # still forks safely


def _sdk_libs(pid: int) -> set[str]:
    text = Path(f"/proc/{pid}/maps").read_text(errors="replace")
    return {lib for lib in SDK_LIBS if lib in text}


def test_a_watcher_forked_from_the_zygote_indexes_without_the_openai_sdk(
    config_file, daemon_factory
) -> None:
    """Watchers embed over the embedder's socket (memsearch's `memd` provider): neither
    the zygote nor a watcher it forked loads the SDK, and a record becomes recallable."""
    memd = daemon_factory(config_file(clients=CLIENTS))
    sock = memd.socket
    wait_for(lambda: _ready(sock), 180, 0.3, "pipeline and embedder RUNNING")
    zygote = call(sock, "daemon.status")["zygote"]
    assert zygote["process"]["state"] == "RUNNING"
    # A watcher started now is forked (the first may have been spawned before the zygote
    # was ready): kill it and let supervision fork its replacement.
    old = child_status(sock, "ann", "watcher")["pid"]
    os.kill(old, signal.SIGKILL)
    wait_for(
        lambda: (
            child_status(sock, "ann", "watcher").get("pid") not in (None, old)
            and pipeline_running(sock, "ann")
        ),
        60,
        0.1,
        "watcher replaced",
    )
    after = call(sock, "daemon.status")["zygote"]
    assert after["forked"] > zygote["forked"] and after["plain"] == zygote["plain"]
    watcher = child_status(sock, "ann", "watcher")["pid"]
    _record(sock, *FACT)
    wait_for(lambda: recall_finds(sock, "ann", ASKED, "shellfish"), 90, 0.3, "paraphrase found")
    assert child_status(sock, "ann", "watcher")["pid"] == watcher  # it indexed the record
    assert _sdk_libs(watcher) == set()
    assert _sdk_libs(zygote["process"]["pid"]) == set()


def _zygote_threads(memory_dir: Path) -> list[int]:
    """The thread counts the zygote reported when ready (its preload starts no thread)."""
    log = (memory_dir / ".memd" / "logs" / "zygote.log").read_text()
    lines = [json.loads(line) for line in log.splitlines() if '"zygote_ready"' in line]
    return [line["threads"] for line in lines]


def test_kill_9_of_the_embedder_is_restarted_and_recall_and_indexing_work_again(
    config_file, daemon_factory
) -> None:
    memd = daemon_factory(config_file(clients=CLIENTS))
    sock = memd.socket
    wait_for(lambda: _ready(sock), 180, 0.3, "pipeline and embedder RUNNING")
    _record(sock, "Where is the spare key?", "The spare key is under the Wren-42 flowerpot.")
    wait_for(lambda: recall_finds(sock, "ann", "spare key", "Wren-42"), 90, 0.3, "indexed")
    old = _embedder(sock)["pid"]
    os.kill(old, signal.SIGKILL)
    # While it is down or restarting, recall still answers (by keywords alone if need be).
    assert any("Wren-42" in r["content"] for r in _recall(sock, "spare key Wren-42"))
    _record(sock, *FACT)  # recorded while the embedder restarts
    wait_for(
        lambda: (
            _embedder(sock).get("pid") not in (None, old)
            and _embedder(sock).get("state") == "RUNNING"
        ),
        60,
        0.1,
        "embedder restarted",
    )
    assert _embedder(sock)["restarts"] >= 1
    wait_for(lambda: recall_finds(sock, "ann", ASKED, "shellfish"), 90, 0.3, "paraphrase found")
    _record(sock, "Which gate do we board at?", "We board at gate Osprey-17.")
    wait_for(lambda: recall_finds(sock, "ann", "which gate", "Osprey-17"), 90, 0.3, "indexed")
    assert _model_libs(memd.proc.pid) == set()


def test_a_bad_request_on_the_embedder_socket_is_refused_and_it_keeps_serving(
    config_file, daemon_factory
) -> None:
    """With the zygote off, the embedder is spawned like the other children."""
    memd = daemon_factory(config_file(clients=CLIENTS, supervision={"zygote": False}))
    sock = memd.socket
    wait_for(lambda: _ready(sock), 180, 0.3, "pipeline and embedder RUNNING")
    assert call(sock, "daemon.status")["zygote"]["enabled"] is False
    pid = _embedder(sock)["pid"]
    path = _socket_of(pid)
    assert path.stat().st_mode & 0o777 == 0o600 and path.parent.stat().st_mode & 0o077 == 0
    good = {"op": "embed", "model": _model(pid), "texts": ["hello there", "x"]}
    replies = _exchange(
        path,
        [
            b"this is not json\n",
            json.dumps({"op": "embed", "model": "nope", "texts": ["a"]}).encode() + b"\n",
            json.dumps({"op": "embed", "texts": "not a list"}).encode() + b"\n",
            json.dumps({"op": "fly"}).encode() + b"\n",
            json.dumps(good).encode() + b"\n",
        ],
    )
    assert [r["ok"] for r in replies] == [False, False, False, False, True], replies
    assert replies[1]["error"]["type"] == "UnknownModel"
    vectors = [unpack_vector(v) for v in replies[4]["result"]]
    assert [len(v) for v in vectors] == [384, 384]
    assert all(math.isclose(math.fsum(x * x for x in v), 1.0, rel_tol=1e-3) for v in vectors)
    assert _embedder(sock)["pid"] == pid  # the same process kept serving
    _record(sock, *FACT)
    wait_for(lambda: recall_finds(sock, "ann", ASKED, "shellfish"), 90, 0.3, "paraphrase found")


def test_an_external_provider_starts_no_embedder(config_file, daemon_factory) -> None:
    """ollama on a port nothing listens on: the watcher's embedding fails, but memd has
    no embedder to start for it."""
    embedding = {"provider": "ollama", "base_url": "http://127.0.0.1:9"}
    memd = daemon_factory(config_file(clients=CLIENTS, embedding=embedding))
    sock = memd.socket
    wait_for(
        lambda: (call(sock, "daemon.status")["clients"]["ann"].get("watcher") or {}).get("state"),
        60,
        0.3,
        "the client's pipeline set up",
    )
    assert call(sock, "daemon.status")["embedder"] is None
    names = [" ".join(p.cmdline()) for p in psutil.Process(memd.proc.pid).children()]
    names = [n for n in names if "memd.supervision.zygote" not in n]  # it names every module
    assert not any(EMBEDDER in n for n in names), names


def _model(pid: int) -> str:
    argv = psutil.Process(pid).cmdline()
    return argv[argv.index("--model") + 1]
