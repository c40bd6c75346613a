"""memd's config as immutable values: every key, its default (declared here only) and its type.

The dataclass fields are the one place a default is written: the loader
(`memd.config.parse`) reads each key's default and type from them.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType

MODES = ("mcp_via_llm", "both", "llm_only", "mcp_only")
MEMORY_MODES = ("mcp_via_llm", "both")
LLM_PROVIDERS = ("openai", "anthropic", "gemini")
# "minilm" (the default) and "wordllama" are memd's bundled offline models; the rest are
# memsearch's providers.
EMBEDDING_PROVIDERS = (
    "minilm",
    "wordllama",
    "openai",
    "google",
    "voyage",
    "jina",
    "mistral",
    "ollama",
    "local",
    "onnx",
)
# Providers whose SDK needs a key (openai only at its own endpoint).
KEYED_EMBEDDING_PROVIDERS = ("openai", "google", "voyage", "jina", "mistral")
# \Z, not $: "$" also matches before a trailing newline ("alice\n" would pass).
CLIENT_ID_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}\Z")
TOOL_NAME_RE = re.compile(r"[A-Za-z][A-Za-z0-9_-]{0,63}\Z")
DEFAULT_MEMORY_DIR = "~/.localrouter/memory"


class ConfigError(Exception):
    """A config file that cannot be used; the message names the file and key."""


@dataclass(frozen=True)
class EmbeddingConfig:
    provider: str = "minilm"
    model: str = ""
    base_url: str = ""
    api_key: str = ""  # already resolved from "env:VAR"


@dataclass(frozen=True)
class CompactionConfig:
    enabled: bool = False
    llm_provider: str = "openai"
    llm_model: str = ""
    base_url: str = ""
    api_key: str = ""  # already resolved from "env:VAR"
    # Daily caps on LLM input tokens (UTC days; 0 = none). At a cap, compactions wait for
    # the next day (state "deferred"). All clients together, and each client on its own.
    max_input_tokens_per_day: int = 2_000_000
    max_input_tokens_per_day_per_client: int = 1_000_000


@dataclass(frozen=True)
class MilvusConfig:
    uri: str = ""
    token: str = ""  # already resolved from "env:VAR"


@dataclass(frozen=True)
class ProxyConfig:
    """`[proxy]`: the OpenAI-compatible gateway; it runs when an upstream is named."""

    listen: str = "127.0.0.1:8765"
    upstream_base_url: str = ""
    upstream_api_key: str = ""  # already resolved from "env:VAR"
    connect_timeout_seconds: float = 10.0
    read_timeout_seconds: float = 600.0
    max_tool_rounds: int = 4
    allow_non_loopback: bool = False
    # The Anthropic Messages API's upstream (`https://api.anthropic.com`) and key.
    anthropic_base_url: str = ""
    anthropic_api_key: str = ""  # already resolved from "env:VAR"

    @property
    def enabled(self) -> bool:
        return bool(self.upstream_base_url or self.anthropic_base_url)

    @property
    def address(self) -> tuple[str, int]:
        """(host, port) of `listen`, already validated by the loader."""
        return parse_listen(self.listen)


@dataclass(frozen=True)
class UiConfig:
    """`[ui]`: the memory browser on loopback (memd.ui, docs/ui.md)."""

    enabled: bool = True
    listen: str = "127.0.0.1:8767"  # port 0: any free port (`memd ui` shows which)
    allow_non_loopback: bool = False
    max_connections: int = 64  # HTTP connections served at once; more wait for the OS
    header_timeout_seconds: float = 10.0  # a client that sends no whole request is cut

    @property
    def address(self) -> tuple[str, int]:
        """(host, port) of `listen`, already validated by the loader."""
        return parse_listen(self.listen)


@dataclass(frozen=True)
class LimitsConfig:
    """Bounds that keep one caller from stalling the others (docs/security.md).

    Past them new work is refused with a `busy` error (retry later) instead of queued.
    """

    max_connections: int = 256  # socket connections served at once
    max_buffered_mib: float = 256.0  # unfinished-line bytes held over all connections
    recall_queue: int = 16  # recalls of one client waiting behind its two running ones
    # Indexed characters (KiB of 1,024) of one exchange; the rest is kept, not indexed
    # (memd.markdown.overflow). 0: index everything.
    index_exchange_kib: int = 64

    @property
    def max_buffered_bytes(self) -> int:
        return int(self.max_buffered_mib * 1024 * 1024)

    @property
    def index_exchange_chars(self) -> int | None:
        return self.index_exchange_kib * 1024 if self.index_exchange_kib else None


@dataclass(frozen=True)
class SupervisionConfig:
    """How memd runs its children. zygote: fork them from one preloaded process
    (memd.supervision.zygote); false spawns each one plainly. shared_index_server: serve
    every client's index (its own database and socket, as before) from one process
    (memd.indexing.children.shared_index_server); false: one process per client, ~20 MB
    PSS and some idle CPU per client more, but a crash of one stops only its own client's
    index. On by default since fault tests showed the shared one isolates clients enough
    (docs/supervision.md). watcher_idle_minutes: a client's watcher is stopped (IDLE) after
    this long without a change to its sessions/ and started again on the next one
    (memd.indexing.daemon.watch_on_demand); 0: never. Read at start only."""

    zygote: bool = True
    shared_index_server: bool = True
    watcher_idle_minutes: float = 10.0


@dataclass(frozen=True)
class RecallConfig:
    """How recall ranks and filters (defaults measured on LoCoMo's dev split, see
    docs/quality.md): `bm25_weight` weighs BM25 (normalised to the query's best match)
    against cosine similarity, `inference_bm25_weight` (when lower) for a question that asks
    what would be or is likely; results whose relevance is under `drop_below` are left out,
    and when none reaches `min_score` recall answers "No relevant memories found.".
    With `follow_questions`, a result that ends by asking a question is followed by the
    user's next message (its answer); with `neighbours`, a matching exchange right before
    or after a result is shown inside it, clipped. While the results' text is under
    `context_chars` characters (0: off), the exchanges after and before the best results
    are added inside them (memd.recall.surround)."""

    bm25_weight: float = 0.7
    inference_bm25_weight: float = 0.4
    min_score: float = 0.055
    drop_below: float = 0.005
    follow_questions: bool = True
    neighbours: bool = True
    context_chars: int = 2400


@dataclass(frozen=True)
class PrivacyConfig:
    """Secret scrubbing on record (memd.redaction, docs/security.md). `redact_secrets`:
    recognised credentials become `[redacted: <kind>]` before anything is written;
    `<private>` spans are dropped either way. `allow`: built-in kinds not to redact.
    `patterns`: the user's own, each `{ kind = "employee-id", regex = "EMP-[0-9]{6}" }`."""

    redact_secrets: bool = True
    allow: tuple[str, ...] = ()
    patterns: tuple[Mapping[str, str], ...] = ()

    def pattern_pairs(self) -> list[tuple[str, str]]:
        return [(p["kind"], p["regex"]) for p in self.patterns]


@dataclass(frozen=True)
class ClientConfig:
    memory_enabled: bool | None = None  # None: unset, which means disabled
    mode: str = "both"
    inject_recall: bool = True  # the proxy adds the recall tool to this client's requests

    @property
    def memory_on(self) -> bool:
        """Memory runs only for an explicitly enabled client in a mode that can use it.

        An enabled client in llm_only/mcp_only mode is accepted by the loader (one
        misconfigured client must not take the daemon down) but never runs memory;
        requests for it are refused with an `unsupported_mode` error.
        """
        return self.memory_enabled is True and self.mode in MEMORY_MODES


@dataclass(frozen=True)
class Config:
    memory_dir: Path = field(default_factory=lambda: Path(DEFAULT_MEMORY_DIR).expanduser())
    socket: Path = field(default_factory=lambda: Path("memd.sock"))
    recall_tool_name: str = "MemoryRecall"
    search_top_k: int = 5
    session_inactivity_minutes: float = 180.0
    max_session_minutes: float = 480.0
    monitor_interval_seconds: float = 60.0
    embedding: EmbeddingConfig = field(default_factory=EmbeddingConfig)
    compaction: CompactionConfig = field(default_factory=CompactionConfig)
    milvus: MilvusConfig = field(default_factory=MilvusConfig)
    proxy: ProxyConfig = field(default_factory=ProxyConfig)
    ui: UiConfig = field(default_factory=UiConfig)
    limits: LimitsConfig = field(default_factory=LimitsConfig)
    supervision: SupervisionConfig = field(default_factory=SupervisionConfig)
    recall: RecallConfig = field(default_factory=RecallConfig)
    privacy: PrivacyConfig = field(default_factory=PrivacyConfig)
    clients: Mapping[str, ClientConfig] = field(default_factory=lambda: MappingProxyType({}))
    source: Path | None = None

    def enabled_clients(self) -> dict[str, ClientConfig]:
        """Clients whose memory actually runs (enabled and in a supported mode)."""
        return {cid: c for cid, c in self.clients.items() if c.memory_on}


def parse_listen(value: str) -> tuple[str, int]:
    """`host:port` or `[v6]:port` -> (host, port); port 0 picks a free one."""
    host, sep, port = value.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ValueError(f"{value!r} is not host:port (e.g. 127.0.0.1:8765)")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    return host, int(port)
