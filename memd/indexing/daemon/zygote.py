"""The zygote for indexing's children: what it preloads, where it lives, its status.

The zygote (memd.supervision.zygote) forks the watchers, index servers, catch-up
children and the embedder from one process that imported their heavy modules once;
`Pipelines` starts it first, so it imports while the rest of memd starts.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from memd.indexing.children import MODULES as ZYGOTE_MODULES
from memd.indexing.daemon.settings import runtime_socket
from memd.supervision import Supervisor
from memd.supervision.zygote_spawner import ZYGOTE_NAME, ZygoteSpawner, zygote_spec

# What the zygote imports first: everything a watcher and an index server import at
# start, and what they import lazily soon after. Not the OpenAI SDK (~700 modules,
# pydantic and its HTTP stack, ~30 MB PSS of the idle tree): memd's bundled models are
# reached over the embedder's socket (memsearch's `memd` provider); a client configured
# with a real `openai` provider imports the SDK after the fork.
ZYGOTE_PRELOAD = (
    # First: memd.indexing has pymilvus get a pandas that loads on first use (~30 MB).
    "memd.indexing",
    "memd.heap",
    "memd.logs",
    "memd.indexing.engine.embedder_provider",
    "memsearch.cli",
    "memsearch.core",
    "memsearch.watcher",
    "pymilvus",
    "pymilvus.grpc_gen.milvus_pb2_grpc",
    "milvus_lite.db",
    "milvus_lite.adapter.grpc.servicer",
    "grpc",
    "grpc._channel",
    "grpc.experimental",
    "truststore",
    # The embedder's tokenizer (importing it starts no thread). Not onnxruntime: loading
    # its native module starts a thread (measured, 1.32: one, parked on a futex), and the
    # zygote must have none when it forks; the embedder imports it after the fork (~40 ms).
    "tokenizers",
)

__all__ = ["ZYGOTE_MODULES", "ZYGOTE_NAME", "ZYGOTE_PRELOAD", "start_zygote", "zygote_status"]


def start_zygote(
    supervisor: Supervisor, spawner: ZygoteSpawner, memory_dir: Path, wanted: bool
) -> None:
    """`<memory_dir>/.memd/` holds its pidfile, log and empty HOME; its socket sits
    in the runtime dir (a Unix socket path must stay short)."""
    sock = runtime_socket("zygote", memory_dir)
    if not spawner.use(sock, enabled=wanted):
        return
    state = memory_dir / ".memd"
    home = state / "zygote-home"
    home.mkdir(mode=0o700, parents=True, exist_ok=True)
    supervisor.add(
        zygote_spec(
            sock,
            state / "logs" / "zygote.log",
            state / "zygote.pid",
            modules=ZYGOTE_MODULES,
            preload=ZYGOTE_PRELOAD,
            home=home,
        )
    )


def zygote_status(supervisor: Supervisor, spawner: ZygoteSpawner | None) -> dict[str, Any] | None:
    """daemon.status's `zygote`: the child's status plus how children were started."""
    if spawner is None:
        return None
    out: dict[str, Any] = spawner.status()
    if ZYGOTE_NAME in supervisor:
        out["process"] = supervisor.status()[ZYGOTE_NAME].to_dict()
    return out
