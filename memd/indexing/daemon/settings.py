"""The pieces a client's index plan is made of: values, names, paths, the children's env.

`memd.indexing.daemon.plan` puts them together once per client and config (`ClientPlan`):

- `IndexSettings`, memd's values for memsearch's project-file keys (`.memsearch.toml`);
- `Command`, a program to run, and `IndexSpec`, the fingerprint of the embedding settings
  an index was built with, so a model change rebuilds the index from the markdown files
  instead of crash-looping on memsearch's dimension check;
- per-client names and paths: the collection, the Milvus Lite data, the index socket, the
  watcher's empty HOME;
- `watcher_env`: secrets in the environment (never in argv), HOME pointed at a memd-owned
  folder so the user's `~/.memsearch/config.toml` cannot leak in, no SDK variable of the
  user's (memd.sdk_env).
"""

from __future__ import annotations

import hashlib
import os
import re
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import structlog

from memd import trust
from memd.indexing import index_lock
from memd.indexing.targets import EMBEDDER_SOCKET_ENV, IndexTarget, WatcherEmbedding
from memd.layout import ClientLayout
from memd.sdk_env import is_sdk_variable

log = structlog.get_logger()

SOCKET_PATH_MAX = 100  # sun_path holds 107 bytes; keep a margin

# Where each memsearch provider reads its key when memsearch does not pass one on.
_KEY_ENV = {
    "openai": "OPENAI_API_KEY",
    "google": "GOOGLE_API_KEY",
    "voyage": "VOYAGE_API_KEY",
    "jina": "JINA_API_KEY",
    "mistral": "MISTRAL_API_KEY",
}
# Variables that would redirect a watcher away from what memd configured: memsearch's
# openai provider falls back to OPENAI_BASE_URL when no base URL is given.
_STRIPPED_ENV = ("MEMSEARCH_DIR", "OPENAI_BASE_URL", "OLLAMA_HOST", EMBEDDER_SOCKET_ENV)
TOKEN_ENV = "MEMD_MILVUS_TOKEN"


@dataclass(frozen=True)
class IndexSettings:
    """memd's values for memsearch's project-file keys.

    debounce_ms is short so that an exchange is searchable a second or so after it is
    written (the transcript writer appends a whole exchange at once and fsyncs it).
    """

    debounce_ms: int = 300
    max_chunk_size: int = 1500
    overlap_lines: int = 2
    batch_size: int = 0  # 0: the provider's default (memd's embedded models: 64)
    ignore_files: tuple[str, ...] = ()
    exclude: tuple[str, ...] = ()


@dataclass(frozen=True)
class Command:
    """A program to run: argv, its whole environment, and its working directory."""

    argv: tuple[str, ...]
    env: Mapping[str, str]
    cwd: Path


@dataclass(frozen=True)
class IndexSpec:
    """Fingerprint of what an index was built with; any change means rebuild.

    base_url is "" for an embedded model (memd serves it; its old endpoint's port
    changed every run).
    `analyzer` names the BM25 text analysis (memd.indexing.analysis): a spec recorded
    before it existed reads as "" and so rebuilds the index with the analyzer.
    `sessions` is the resolved folder the rows were indexed from: each row names its file
    by absolute path, so a memory_dir moved or restored elsewhere left rows that recall
    refused to read, beside the watcher's new ones; the index is rebuilt instead.
    """

    provider: str
    model: str
    dimension: int | None
    base_url: str
    target: str
    collection: str
    analyzer: str = ""
    sessions: str = ""


# -- names and paths ---------------------------------------------------------------------


def collection_name(client_id: str) -> str:
    """`memd_<client_id>` with anything Milvus refuses replaced by `_`.

    Milvus collection names are letters, digits and underscores. When replacing changed
    the id, a short hash keeps `a-b` and `a_b` apart.
    """
    safe = re.sub(r"[^A-Za-z0-9_]", "_", client_id)
    if safe != client_id:
        safe += "_" + hashlib.sha256(client_id.encode()).hexdigest()[:8]
    return f"memd_{safe}"


def milvus_data_dir(layout: ClientLayout) -> Path:
    """Milvus Lite data of the client; memsearch's `.index-state.json` sits beside it."""
    return layout.memsearch_dir / "milvus"


def spec_path(layout: ClientLayout) -> Path:
    return layout.state_dir / "index-spec.json"


def watcher_home(layout: ClientLayout) -> Path:
    """HOME of the client's watcher: empty, so memsearch finds no user config there."""
    return layout.state_dir / "home"


def index_socket_path(layout: ClientLayout) -> Path:
    """`<state_dir>/index.sock`, or a short path under the runtime dir when that is too long.

    A Unix socket path must fit in 107 bytes; deep memory_dirs (and pytest's tmp_path)
    exceed it. The fallback is per user and per client root, so it is stable across runs.
    """
    preferred = layout.state_dir / "index.sock"
    if len(os.fsencode(preferred)) <= SOCKET_PATH_MAX:
        return preferred
    return runtime_socket("index", layout.root)


def runtime_socket(kind: str, folder: Path) -> Path:
    """`<runtime dir>/<kind>-<hash of folder>.sock`: a child's socket named after the
    folder it serves (a client's root, or memory_dir for the memd-wide children: the
    zygote, the shared index server, the embedder), short enough for a Unix socket."""
    digest = hashlib.sha256(os.fsencode(folder.absolute())).hexdigest()[:16]
    return runtime_dir() / f"{kind}-{digest}.sock"


def runtime_dir() -> Path:
    """Where the children's sockets go (a Unix socket path must stay short).

    Under memd's systemd unit the runtime dir is read-only but for the folder systemd
    made for it (`RuntimeDirectory=memd`, passed as $RUNTIME_DIRECTORY): the zygote, the
    shared index server and the embedder could not bind there and failed to start."""
    made = os.environ.get("RUNTIME_DIRECTORY", "").split(":")[0]
    if made:
        return Path(made)
    base = os.environ.get("XDG_RUNTIME_DIR") or tempfile.gettempdir()
    return Path(base) / f"memd-{os.getuid()}"


def watcher_env(
    layout: ClientLayout,
    emb: WatcherEmbedding,
    target: IndexTarget,
    *,
    base: Mapping[str, str] | None = None,
) -> dict[str, str]:
    """memd's environment with the watcher's HOME, key and endpoints set by memd.

    HOME moves to an empty memd-owned folder: memsearch resolves `~/.memsearch/config.toml`
    from HOME at import time. Model caches stay where they were (XDG_CACHE_HOME/HF_HOME
    pinned to the real ones) so local providers do not download per client.
    """
    env = dict(os.environ if base is None else base)
    real_cache = env.get("XDG_CACHE_HOME") or str(Path(env.get("HOME") or Path.home()) / ".cache")
    for name in [*_STRIPPED_ENV, *(n for n in env if is_sdk_variable(n))]:
        env.pop(name, None)
    env["HOME"] = str(watcher_home(layout))
    env["XDG_CACHE_HOME"] = real_cache
    env.setdefault("HF_HOME", str(Path(real_cache) / "huggingface"))
    env["MEMSEARCH_DIR"] = str(layout.memsearch_dir)  # memsearch writes .index-state.json there
    env[index_lock.ENV] = str(index_lock.lock_path(layout))  # one indexing run at a time
    env["PYTHONUNBUFFERED"] = "1"
    loopback = "127.0.0.1,localhost,::1"
    for name in ("NO_PROXY", "no_proxy"):
        env[name] = f"{env[name]},{loopback}" if env.get(name) else loopback
    key_env = _KEY_ENV.get(emb.provider)
    if emb.api_key and key_env:
        env[key_env] = emb.api_key
    elif emb.provider == "openai" and emb.base_url:
        env["OPENAI_API_KEY"] = "unused"  # the SDK refuses to start without one
    if emb.socket:
        env[EMBEDDER_SOCKET_ENV] = emb.socket  # memsearch's memd provider reads it
    if emb.provider == "ollama" and emb.base_url:
        env["OLLAMA_HOST"] = emb.base_url
    if target.token:
        env[TOKEN_ENV] = target.token
    return env


def ensure_dirs(layout: ClientLayout) -> None:
    """Folders the commands above expect (on top of `layout.ensure()`)."""
    layout.ensure()
    trust.ensure_dir(watcher_home(layout))
    sock_dir = index_socket_path(layout).parent
    sock_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    trust.check_dir(sock_dir)  # the short fallback under /tmp must be ours alone
