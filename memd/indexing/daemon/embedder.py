"""memd's side of the embedder child: its spec, the watchers' way to it, recall's client.

The bundled models live in one supervised child, `_shared/embedder`
(`memd.indexing.children.embedder`, forked from the zygote like the index servers, or
spawned when the zygote is off), not in memd: ~80 MB of memd's PSS were onnxruntime,
tokenizers, google.protobuf and the ORT session (issue 29). `EmbeddingService` adds the
child when the first client that uses an embedded model starts and removes it when none
does (an external provider, openai or ollama, never starts it), names its socket to the
watchers and catch-up children (memsearch's `memd` provider,
`memd.indexing.engine.embedder_provider`: no OpenAI SDK in them, nor in the zygote) and
hands recall an `EmbedderClient` of its own. (The OpenAI-compatible HTTP endpoint the
watchers used before, `embed_server`, is gone: nothing started it any more.)

A watcher requires the child RUNNING before it (re)starts (its initial scan embeds at
once); a running watcher outlives the child's restart: its calls wait a few seconds for
the child, then fail the file (logged), and catch-up runs after the restart (the child's
pid is part of each client's catch-up key in `Pipelines`), so what failed meanwhile is
indexed then.
"""

from __future__ import annotations

import functools
import signal
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import structlog

from memd.config import Config
from memd.indexing import children
from memd.indexing.children import index_ready
from memd.indexing.daemon.plan import server_env
from memd.indexing.daemon.settings import runtime_socket
from memd.indexing.query.embedder_client import EmbedderClient
from memd.indexing.targets import Endpoint, effective_model, uses_embedded_model
from memd.supervision import ChildSpec, Supervisor

log = structlog.get_logger()

EMBEDDER_NAME = "_shared/embedder"  # a client id starts with a letter or digit: no clash
FATAL_RETRY_AFTER = 600.0  # as a client's children: embedding never stops for good


def socket_path(memory_dir: Path) -> Path:
    """In the runtime dir, as the zygote's: a Unix socket path must stay short."""
    return runtime_socket("embedder", memory_dir)


def is_embedder(argv: Sequence[str]) -> bool:
    """Whether `argv` is an embedder as memd starts it (interpreter and module)."""
    return list(argv[:3]) == [sys.executable, "-m", children.EMBEDDER]


def embedder_spec(memory_dir: Path, model: str) -> ChildSpec:
    """The child: ready once its socket answers (it binds after loading `model`)."""
    state = memory_dir / ".memd"
    sock = socket_path(memory_dir)
    return ChildSpec(
        name=EMBEDDER_NAME,
        argv=(sys.executable, "-m", children.EMBEDDER, "--socket", str(sock), "--model", model),
        env=server_env(),
        cwd=state,
        log_path=state / "logs" / "embedder.log",
        pidfile=state / "embedder.pid",
        startsecs=0.0,
        stop_signal=signal.SIGINT,
        stop_timeout=5.0,
        ready=functools.partial(index_ready, sock, timeout=0.2),
        fatal_retry_after=FATAL_RETRY_AFTER,
        restart_at_once=True,
    )


class EmbeddingService:
    """The embedder child, the watchers' way to it, and recall's client of it."""

    def __init__(self, supervisor: Supervisor, prefers: Callable[[], tuple[str, ...]]) -> None:
        self.supervisor = supervisor
        self._prefers = prefers
        self._query: EmbedderClient | None = None

    @property
    def requires(self) -> tuple[str, ...]:
        """What a watcher must find RUNNING before it (re)starts."""
        return (EMBEDDER_NAME,) if EMBEDDER_NAME in self.supervisor else ()

    @property
    def query_client(self) -> EmbedderClient | None:
        """Recall's client (no waiting: recall searches by keywords while it restarts)."""
        return self._query

    async def endpoint(self, config: Config) -> Endpoint | None:
        """The watchers' way to the child (its socket, for memsearch's `memd` provider),
        the child started first; None for an external provider."""
        if not uses_embedded_model(config.embedding):
            return None
        model = effective_model(config.embedding)
        if EMBEDDER_NAME not in self.supervisor:
            self.supervisor.add(embedder_spec(config.memory_dir, model), prefers=self._prefers())
            log.info("embedder.added", model=model)
        sock = socket_path(config.memory_dir)
        if self._query is None:
            self._query = EmbedderClient(sock, urgent=True)  # a user waits for a query
        return Endpoint(model, str(sock))

    async def stop(self) -> None:
        """No client embeds with a bundled model any more: stop the child."""
        if EMBEDDER_NAME in self.supervisor:
            await self.supervisor.remove(EMBEDDER_NAME)
        if self._query is not None:
            self._query.close()
        self._query = None

    def status(self) -> dict[str, Any] | None:
        """daemon.status's `embedder`: the child's status, None when it is not run."""
        child = self.supervisor.child_status(EMBEDDER_NAME)
        return child.to_dict() if child is not None else None
