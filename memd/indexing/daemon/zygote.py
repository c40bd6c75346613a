"""The zygote for indexing's children: what it preloads, where it lives, its status.

The zygote (memd.supervision.zygote) forks the watchers, index servers and catch-up
children from one process that imported their heavy modules once; `Pipelines` starts it
first, so it imports while the rest of memd starts.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import Any

from memd.indexing.children import CATCH_UP, WATCHER
from memd.indexing.children import MODULES as ZYGOTE_MODULES
from memd.indexing.daemon.settings import runtime_dir
from memd.supervision import Supervisor
from memd.supervision.states import ProcessStates
from memd.supervision.zygote import later_done
from memd.supervision.zygote_spawner import ZYGOTE_NAME, ZygoteSpawner, zygote_spec

# What the zygote imports before it serves: what an index server imports at start (so
# recall can answer as soon as the zygote is up), then the forkable modules' own preloads.
ZYGOTE_PRELOAD = (
    "memd.heap",
    "memd.logs",
    "pymilvus",
    "pymilvus.grpc_gen.milvus_pb2_grpc",
    "milvus_lite.db",
    "milvus_lite.adapter.grpc.servicer",
    "grpc",
    "grpc._channel",
    "grpc.experimental",
)
# What it imports once it serves, between requests (about half of the preload's time):
# what a watcher and a catch-up child import at start and soon after (memsearch's openai
# provider imports the SDK on first use: ~700 modules, pydantic and its HTTP stack).
# Watchers are started only once these are in (`full_preload`), to share their pages.
ZYGOTE_LATER = (
    "memsearch.cli",
    "memsearch.core",
    "memsearch.watcher",
    "memsearch.embeddings.openai",
    "openai",
    "openai.resources.embeddings",
    "openai.types.create_embedding_response",
    "anyio._backends._asyncio",
    "truststore",
    WATCHER,
    CATCH_UP,
)
LATER_WAIT = 60.0  # seconds a watcher waits for the later imports at most, then starts

__all__ = [
    "ZYGOTE_LATER",
    "ZYGOTE_MODULES",
    "ZYGOTE_NAME",
    "ZYGOTE_PRELOAD",
    "full_preload",
    "start_zygote",
    "zygote_status",
]


def start_zygote(
    supervisor: Supervisor, spawner: ZygoteSpawner, memory_dir: Path, wanted: bool
) -> Path | None:
    """`<memory_dir>/.memd/` holds its pidfile, log and empty HOME; its socket sits
    in the runtime dir (a Unix socket path must stay short). Returns the socket, None
    when there is no zygote."""
    digest = hashlib.sha256(os.fsencode(memory_dir.absolute())).hexdigest()[:16]
    sock = runtime_dir() / f"zygote-{digest}.sock"
    if not spawner.use(sock, enabled=wanted):
        return None
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
            later=ZYGOTE_LATER,
            home=home,
        )
    )
    return sock


def full_preload(supervisor: Supervisor, sock: Path) -> bool:
    """A watcher's gate: the zygote imported its later modules too, or it will not fork
    (not RUNNING: a plain spawn), or it took longer than LATER_WAIT since it came up."""
    status = supervisor.child_status(ZYGOTE_NAME)
    if status is None or status.state != ProcessStates.RUNNING:
        return True
    return later_done(sock).exists() or (status.uptime or 0.0) > LATER_WAIT


def zygote_status(supervisor: Supervisor, spawner: ZygoteSpawner | None) -> dict[str, Any] | None:
    """daemon.status's `zygote`: the child's status plus how children were started."""
    if spawner is None:
        return None
    out: dict[str, Any] = spawner.status()
    if ZYGOTE_NAME in supervisor:
        out["process"] = supervisor.status()[ZYGOTE_NAME].to_dict()
    return out
