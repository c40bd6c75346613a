"""pandas stays out of memd's processes: pymilvus imports it at module level, memd gives it
a stand-in that loads the real one only on use (memd.standins).
Real daemon, real memsearch watch, real Milvus Lite, the real model."""

from __future__ import annotations

from pathlib import Path

import psutil
import pytest

from tests.support.faults import call, pipeline_running, recall_finds, wait_for

pytestmark = [pytest.mark.slow]

CLIENTS = {"ann": {"memory_enabled": True, "mode": "mcp_via_llm"}}
PANDAS_LIBS = "/pandas/_libs/"  # pandas' extension modules: mapped once it is imported
GRPC = "/grpc/_cython/"  # what pymilvus imports: a process that imported it maps gRPC


def _maps(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/maps").read_text(errors="replace")
    except OSError:
        return ""  # exited meanwhile


def _tree(pid: int) -> list[psutil.Process]:
    root = psutil.Process(pid)
    return [root, *root.children(recursive=True)]


def _record_and_recall(sock: Path) -> None:
    params = {
        "client_id": "ann",
        "conversation_id": "p",
        "user": "My cat is called Tiramisu.",
        "assistant": "Tiramisu the cat, noted.",
    }
    call(sock, "memory.record_exchange", params)
    wait_for(lambda: recall_finds(sock, "ann", "Tiramisu", "Tiramisu"), 90, 0.3, "recalled")


def _ready(sock: Path) -> bool:
    embedder = call(sock, "daemon.status").get("embedder") or {}
    return pipeline_running(sock, "ann") and embedder.get("state") == "RUNNING"


def _pandas_mapped(memd_pid: int) -> dict[str, list[str]]:
    """Every process of memd's tree: pid and command -> mapped pandas libraries (none)."""
    out = {}
    for proc in _tree(memd_pid):
        maps = _maps(proc.pid)
        if PANDAS_LIBS in maps:
            out[f"{proc.pid} {' '.join(proc.cmdline()[:4])}"] = [
                line.split()[-1] for line in maps.splitlines() if PANDAS_LIBS in line
            ][:3]
    return out


@pytest.mark.parametrize("zygote", [True, False], ids=["forked", "spawned"])
def test_no_memd_process_loads_pandas_while_a_client_records_and_recalls(
    config_file, daemon_factory, zygote: bool
) -> None:
    memd = daemon_factory(config_file(clients=CLIENTS, supervision={"zygote": zygote}))
    sock = memd.socket
    wait_for(lambda: _ready(sock), 180, 0.3, "pipeline and embedder RUNNING")
    _record_and_recall(sock)
    procs = _tree(memd.proc.pid)
    # the processes that run pymilvus are there: the check below looks at them
    assert sum(GRPC in _maps(p.pid) for p in procs) >= 2
    assert _pandas_mapped(memd.proc.pid) == {}
