"""Load and validate memd's TOML config into an immutable value.

Every key is optional; a missing file means defaults. Validation is strict on
purpose: an unknown key or a wrong type is an error that names the key and the
file, because a silently ignored typo in `memory_enabled` would either leak a
client's conversations to disk or lose them.
"""

from __future__ import annotations

import contextlib
import ipaddress
import os
import re
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from types import MappingProxyType
from typing import Any

MODES = ("mcp_via_llm", "both", "llm_only", "mcp_only")
MEMORY_MODES = ("mcp_via_llm", "both")
LLM_PROVIDERS = ("openai", "anthropic", "gemini")
# "wordllama" is memd's embedded offline model; the rest are memsearch's providers.
EMBEDDING_PROVIDERS = (
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
    provider: str = "wordllama"
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

    @property
    def enabled(self) -> bool:
        return bool(self.upstream_base_url)

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

    @property
    def max_buffered_bytes(self) -> int:
        return int(self.max_buffered_mib * 1024 * 1024)


@dataclass(frozen=True)
class SupervisionConfig:
    """How memd runs its children. zygote: fork them from one preloaded process
    (memd.supervision.zygote); false spawns each one plainly. Read at start only."""

    zygote: bool = True


@dataclass(frozen=True)
class RecallConfig:
    """How recall ranks and filters (defaults measured on LoCoMo's dev split, see
    docs/quality.md): `bm25_weight` weighs BM25 (normalised to the query's best match)
    against cosine similarity; results whose relevance is under `drop_below` are left out,
    and when none reaches `min_score` recall answers "No relevant memories found."."""

    bm25_weight: float = 0.7
    min_score: float = 0.5
    drop_below: float = 0.0


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
    limits: LimitsConfig = field(default_factory=LimitsConfig)
    supervision: SupervisionConfig = field(default_factory=SupervisionConfig)
    recall: RecallConfig = field(default_factory=RecallConfig)
    clients: Mapping[str, ClientConfig] = field(default_factory=lambda: MappingProxyType({}))
    source: Path | None = None

    def enabled_clients(self) -> dict[str, ClientConfig]:
        """Clients whose memory actually runs (enabled and in a supported mode)."""
        return {cid: c for cid, c in self.clients.items() if c.memory_on}


def default_config_path() -> Path:
    """`$MEMD_CONFIG`, else `~/.config/memd/config.toml` (XDG_CONFIG_HOME honoured)."""
    env = os.environ.get("MEMD_CONFIG")
    if env:
        return Path(env).expanduser()
    base = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(base) / "memd" / "config.toml"


def resolve_config_path(path: str | Path | None) -> Path:
    """The `--config` value wins, then `$MEMD_CONFIG`, then the XDG default."""
    return Path(path).expanduser() if path else default_config_path()


def default_socket_path(memory_dir: Path) -> Path:
    """`$XDG_RUNTIME_DIR/memd/memd.sock`, else `<memory_dir>/memd.sock`."""
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    if runtime:
        return Path(runtime) / "memd" / "memd.sock"
    return memory_dir / "memd.sock"


def load_config(path: str | Path | None) -> Config:
    """Read and validate the config at `path` (resolved as the CLI does).

    A missing file yields the defaults; anything else wrong raises ConfigError.
    """
    resolved = resolve_config_path(path)
    try:
        raw = resolved.read_bytes()
    except FileNotFoundError:
        return parse_config({}, source=None)
    except OSError as exc:
        raise ConfigError(f"{resolved}: cannot read config: {exc.strerror}") from exc
    try:
        data = tomllib.loads(raw.decode("utf-8"))
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{resolved}: config is not valid UTF-8") from exc
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{resolved}: invalid TOML: {exc}") from exc
    return parse_config(data, source=resolved)


def parse_config(data: Mapping[str, Any], source: Path | None = None) -> Config:
    """Validate an already-parsed TOML document into a Config."""
    where = str(source) if source else "<defaults>"
    return _Parser(where).config(data, source)


class _Parser:
    """Turns raw TOML tables into config dataclasses, naming `file: key` on error."""

    def __init__(self, where: str) -> None:
        self.where = where

    def fail(self, key: str, problem: str) -> ConfigError:
        return ConfigError(f"{self.where}: {key}: {problem}")

    def config(self, data: Mapping[str, Any], source: Path | None) -> Config:
        top = {
            "memory_dir": str,
            "socket": str,
            "recall_tool_name": str,
            "search_top_k": int,
            "session_inactivity_minutes": float,
            "max_session_minutes": float,
            "monitor_interval_seconds": float,
            "embedding": dict,
            "compaction": dict,
            "milvus": dict,
            "proxy": dict,
            "limits": dict,
            "supervision": dict,
            "recall": dict,
            "clients": dict,
        }
        self.check_keys("", data, top)
        memory_dir = Path(self.get(data, "memory_dir", str, DEFAULT_MEMORY_DIR) or ".")
        memory_dir = memory_dir.expanduser()
        if not memory_dir.is_absolute():
            base = source.parent if source else Path.cwd()
            memory_dir = (base / memory_dir).resolve()
        socket_raw = self.get(data, "socket", str, "")
        socket = Path(socket_raw).expanduser() if socket_raw else default_socket_path(memory_dir)
        tool = self.get(data, "recall_tool_name", str, "MemoryRecall")
        if not TOOL_NAME_RE.match(tool):
            raise self.fail("recall_tool_name", "must be a letter then letters, digits, _ or -")
        top_k = self.get(data, "search_top_k", int, 5)
        if not 1 <= top_k <= 100:
            raise self.fail("search_top_k", "must be between 1 and 100")
        return Config(
            memory_dir=memory_dir,
            socket=socket,
            recall_tool_name=tool,
            search_top_k=top_k,
            session_inactivity_minutes=self.duration(data, "session_inactivity_minutes", 180.0),
            max_session_minutes=self.duration(data, "max_session_minutes", 480.0),
            monitor_interval_seconds=self.duration(data, "monitor_interval_seconds", 60.0),
            embedding=self.embedding(data),
            compaction=self.compaction(data),
            milvus=self.section(data, "milvus", MilvusConfig),
            proxy=self.proxy(data),
            limits=self.limits(data),
            supervision=self.section(data, "supervision", SupervisionConfig),
            recall=self.recall(data),
            clients=MappingProxyType(self.clients(data.get("clients", {}))),
            source=source,
        )

    def check_keys(
        self, prefix: str, table: Mapping[str, Any], allowed: Mapping[str, type]
    ) -> None:
        for key in table:
            if key not in allowed:
                known = ", ".join(sorted(allowed))
                raise self.fail(f"{prefix}{key}", f"unknown key (known keys: {known})")

    def get(
        self, table: Mapping[str, Any], key: str, kind: type, default: Any, prefix: str = ""
    ) -> Any:
        if key not in table:
            return default
        value = table[key]
        name = f"{prefix}{key}"
        if kind is float:
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise self.fail(name, f"must be a number, got {_type_name(value)}")
            return float(value)
        if kind is int and isinstance(value, bool):
            raise self.fail(name, "must be an integer, got boolean")
        if not isinstance(value, kind):
            raise self.fail(name, f"must be {_kind_name(kind)}, got {_type_name(value)}")
        return value

    def duration(self, data: Mapping[str, Any], key: str, default: float) -> float:
        value = self.get(data, key, float, default)
        if not value > 0 or value != value or value == float("inf"):
            raise self.fail(key, "must be a positive, finite number")
        return value

    def section(self, data: Mapping[str, Any], name: str, cls: type) -> Any:
        table = self.get(data, name, dict, {})
        prefix = f"{name}."
        kinds = {f.name: type(f.default) for f in fields(cls)}
        self.check_keys(prefix, table, kinds)
        values = {key: self.get(table, key, kinds[key], getattr(cls, key), prefix) for key in kinds}
        if "api_key" in values:
            values["api_key"] = self.secret(values["api_key"], f"{prefix}api_key")
        if "token" in values:
            values["token"] = self.secret(values["token"], f"{prefix}token")
        return cls(**values)

    def embedding(self, data: Mapping[str, Any]) -> EmbeddingConfig:
        emb = self.section(data, "embedding", EmbeddingConfig)
        if emb.provider not in EMBEDDING_PROVIDERS:
            allowed = ", ".join(EMBEDDING_PROVIDERS)
            raise self.fail("embedding.provider", f"must be one of {allowed}")
        if (
            emb.provider in KEYED_EMBEDDING_PROVIDERS
            and not emb.api_key
            and not (emb.provider == "openai" and emb.base_url)
        ):
            # An SDK would take its key from the environment and send every chunk there.
            raise self.fail(
                "embedding.api_key",
                f"must be set for provider {emb.provider} "
                '(memd never reads SDK variables; write api_key = "env:VAR")',
            )
        return emb

    def recall(self, data: Mapping[str, Any]) -> RecallConfig:
        rec = self.section(data, "recall", RecallConfig)
        for key in ("bm25_weight", "min_score", "drop_below"):
            if not 0.0 <= getattr(rec, key) <= 1.0:
                raise self.fail(f"recall.{key}", "must be between 0 and 1")
        if rec.drop_below > rec.min_score:
            raise self.fail("recall.drop_below", "must not be above recall.min_score")
        return rec

    def compaction(self, data: Mapping[str, Any]) -> CompactionConfig:
        comp = self.section(data, "compaction", CompactionConfig)
        if comp.llm_provider not in LLM_PROVIDERS:
            allowed = ", ".join(LLM_PROVIDERS)
            raise self.fail("compaction.llm_provider", f"must be one of {allowed}")
        for key in ("max_input_tokens_per_day", "max_input_tokens_per_day_per_client"):
            if getattr(comp, key) < 0:
                raise self.fail(f"compaction.{key}", "must be 0 (no cap) or a positive integer")
        if comp.enabled:
            # Transcripts leave the machine only for an LLM the user named: no default
            # provider or model may pick one for them.
            table = data.get("compaction", {})
            for key in ("llm_provider", "llm_model"):
                if not table.get(key):
                    raise self.fail(
                        f"compaction.{key}",
                        "must be set when compaction is enabled (transcripts are sent there)",
                    )
        return comp

    def proxy(self, data: Mapping[str, Any]) -> ProxyConfig:
        table = self.get(data, "proxy", dict, {})
        prefix = "proxy."
        kinds = {f.name: type(f.default) for f in fields(ProxyConfig)}
        self.check_keys(prefix, table, kinds)
        values = {
            key: self.get(table, key, kinds[key], getattr(ProxyConfig, key), prefix)
            for key in kinds
        }
        values["upstream_api_key"] = self.secret(
            values["upstream_api_key"], "proxy.upstream_api_key"
        )
        try:
            host, _port = parse_listen(values["listen"])
        except ValueError as exc:
            raise self.fail("proxy.listen", str(exc)) from None
        if not values["allow_non_loopback"] and not _loopback(host):
            raise self.fail(
                "proxy.listen",
                f"{host} is not a loopback address; the proxy would be reachable from "
                "other machines (set allow_non_loopback = true if that is what you want)",
            )
        url = values["upstream_base_url"]
        if url and not re.match(r"^https?://[^/\s]+", url):
            raise self.fail(
                "proxy.upstream_base_url",
                "must be an http:// or https:// URL, e.g. https://api.openai.com/v1",
            )
        for key in ("connect_timeout_seconds", "read_timeout_seconds"):
            value = values[key]
            if not value > 0 or value == float("inf"):
                raise self.fail(f"proxy.{key}", "must be a positive, finite number")
        if not 1 <= values["max_tool_rounds"] <= 20:
            raise self.fail("proxy.max_tool_rounds", "must be between 1 and 20")
        return ProxyConfig(**values)

    def limits(self, data: Mapping[str, Any]) -> LimitsConfig:
        limits = self.section(data, "limits", LimitsConfig)
        if limits.max_connections < 1:
            raise self.fail("limits.max_connections", "must be at least 1")
        mib = limits.max_buffered_mib
        if not 0 < mib < float("inf"):
            raise self.fail("limits.max_buffered_mib", "must be a positive, finite number")
        if limits.recall_queue < 0:
            raise self.fail("limits.recall_queue", "must be 0 or more")
        return limits

    def secret(self, value: str, key: str) -> str:
        """`env:VAR` reads the variable so secrets stay out of the file."""
        if not value.startswith("env:"):
            return value
        var = value[4:]
        if not var:
            raise self.fail(key, "env: needs a variable name, e.g. env:OPENAI_API_KEY")
        resolved = os.environ.get(var)
        if resolved is None:
            raise self.fail(key, f"environment variable {var} is not set")
        return resolved

    def clients(self, table: Any) -> dict[str, ClientConfig]:
        if not isinstance(table, dict):
            raise self.fail("clients", f"must be a table, got {_type_name(table)}")
        out: dict[str, ClientConfig] = {}
        for cid, body in table.items():
            key = f"clients.{cid}"
            if not CLIENT_ID_RE.match(cid) or cid in (".", ".."):
                raise self.fail(
                    key,
                    "client id must be 1-64 of A-Z a-z 0-9 _ . - and start with a letter or digit",
                )
            if not isinstance(body, dict):
                raise self.fail(key, f"must be a table, got {_type_name(body)}")
            kinds = {"memory_enabled": bool, "mode": str, "inject_recall": bool}
            self.check_keys(f"{key}.", body, kinds)
            enabled = self.get(body, "memory_enabled", bool, None, f"{key}.")
            mode = self.get(body, "mode", str, "both", f"{key}.")
            if mode not in MODES:
                raise self.fail(f"{key}.mode", f"must be one of {', '.join(MODES)}, got {mode!r}")
            inject = self.get(body, "inject_recall", bool, True, f"{key}.")
            out[cid] = ClientConfig(memory_enabled=enabled, mode=mode, inject_recall=inject)
        return out


def parse_listen(value: str) -> tuple[str, int]:
    """`host:port` or `[v6]:port` -> (host, port); port 0 picks a free one."""
    host, sep, port = value.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ValueError(f"{value!r} is not host:port (e.g. 127.0.0.1:8765)")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    return host, int(port)


def _loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _type_name(value: Any) -> str:
    return {
        bool: "boolean",
        int: "integer",
        float: "number",
        str: "string",
        dict: "table",
        list: "array",
    }.get(type(value), type(value).__name__)


def _kind_name(kind: type) -> str:
    return {bool: "a boolean", int: "an integer", str: "a string", dict: "a table"}.get(
        kind, kind.__name__
    )


def socket_for(path: str | Path | None) -> tuple[Path, ConfigError | None]:
    """Where the daemon listens, even when the config has an invalid edit in it.

    The CLI must still reach a running daemon to show that the edit was rejected, so on
    a validation error fall back to just the `socket`/`memory_dir` keys (or defaults).
    """
    try:
        return load_config(path).socket, None
    except ConfigError as exc:
        error = exc
    data: dict[str, Any] = {}
    try:
        with contextlib.suppress(OSError, UnicodeDecodeError):
            text = resolve_config_path(path).read_text(encoding="utf-8")
            try:
                raw = tomllib.loads(text)
            except tomllib.TOMLDecodeError:  # invalid TOML: read the two keys line by line
                raw = _top_level_lines(text, ("memory_dir", "socket"))
            data = {k: raw[k] for k in ("memory_dir", "socket") if isinstance(raw.get(k), str)}
        return parse_config(data, source=resolve_config_path(path)).socket, error
    except ConfigError:
        return parse_config({}).socket, error


def _top_level_lines(text: str, keys: tuple[str, ...]) -> dict[str, Any]:
    """`key = value` lines before the first table, each parsed alone: the keys a daemon
    running on the last good config still uses, taken from a file that is not TOML."""
    found: dict[str, Any] = {}
    for line in text.splitlines():
        stripped = line.strip()
        if stripped.startswith("["):
            break
        name = stripped.split("=", 1)[0].strip()
        if name in keys:
            with contextlib.suppress(tomllib.TOMLDecodeError):
                found.update(tomllib.loads(stripped))
    return found
