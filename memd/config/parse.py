"""Validate a parsed TOML document into a `Config`, naming `file: key` on every error.

Validation is strict on purpose: an unknown key or a wrong type is an error that names
the key and the file, because a silently ignored typo in `memory_enabled` would either
leak a client's conversations to disk or lose them. Each key's type and default come
from the dataclasses of `memd.config.model`; the tables' own rules are in
`memd.config.tables`.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import MISSING, fields
from pathlib import Path
from types import MappingProxyType
from typing import Any

from memd.config import tables
from memd.config.model import (
    CLIENT_ID_RE,
    DEFAULT_MEMORY_DIR,
    MODES,
    TOOL_NAME_RE,
    ClientConfig,
    CompactionConfig,
    Config,
    ConfigError,
    EmbeddingConfig,
    LimitsConfig,
    MilvusConfig,
    PrivacyConfig,
    ProxyConfig,
    RecallConfig,
    SupervisionConfig,
    UiConfig,
)

# The top-level tables and the dataclass each one is read into.
TABLES: dict[str, type] = {
    "embedding": EmbeddingConfig,
    "compaction": CompactionConfig,
    "milvus": MilvusConfig,
    "proxy": ProxyConfig,
    "ui": UiConfig,
    "limits": LimitsConfig,
    "supervision": SupervisionConfig,
    "recall": RecallConfig,
    "privacy": PrivacyConfig,
}
# Keys whose value may be `env:VAR`, read from the environment so secrets stay out of files.
SECRETS = ("api_key", "token", "upstream_api_key", "anthropic_api_key")
DURATIONS = ("session_inactivity_minutes", "max_session_minutes", "monitor_interval_seconds")


def parse_config(data: Mapping[str, Any], source: Path | None = None) -> Config:
    """Validate an already-parsed TOML document into a Config."""
    where = str(source) if source else "<defaults>"
    return Parser(where).config(data, source)


def default_of(cls: type, name: str) -> Any:
    """A dataclass field's default: the one place each config default is written."""
    spec = cls.__dataclass_fields__[name]  # type: ignore[attr-defined]
    return spec.default if spec.default is not MISSING else spec.default_factory()


def default_socket_path(memory_dir: Path) -> Path:
    """`$XDG_RUNTIME_DIR/memd/memd.sock`, else `<memory_dir>/memd.sock`."""
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    if runtime:
        return Path(runtime) / "memd" / "memd.sock"
    return memory_dir / "memd.sock"


class Parser:
    """Turns raw TOML tables into config dataclasses, naming `file: key` on error."""

    def __init__(self, where: str) -> None:
        self.where = where

    def fail(self, key: str, problem: str) -> ConfigError:
        return ConfigError(f"{self.where}: {key}: {problem}")

    def config(self, data: Mapping[str, Any], source: Path | None) -> Config:
        top: dict[str, type] = {
            "memory_dir": str,
            "socket": str,
            "recall_tool_name": str,
            "search_top_k": int,
            **dict.fromkeys(DURATIONS, float),
            **dict.fromkeys(TABLES, dict),
            "clients": dict,
        }
        self.check_keys("", data, top)
        memory_dir = self.memory_dir(data, source)
        socket_raw = self.get(data, "socket", str, "")
        socket = Path(socket_raw).expanduser() if socket_raw else default_socket_path(memory_dir)
        tool = self.get(data, "recall_tool_name", str, default_of(Config, "recall_tool_name"))
        if not TOOL_NAME_RE.match(tool):
            raise self.fail("recall_tool_name", "must be a letter then letters, digits, _ or -")
        top_k = self.get(data, "search_top_k", int, default_of(Config, "search_top_k"))
        if not 1 <= top_k <= 100:
            raise self.fail("search_top_k", "must be between 1 and 100")
        durations: dict[str, Any] = {
            key: self.duration(data, key, default_of(Config, key)) for key in DURATIONS
        }
        sections: dict[str, Any] = {
            name: tables.check(self, data, name, self.section(data, name)) for name in TABLES
        }
        return Config(
            memory_dir=memory_dir,
            socket=socket,
            recall_tool_name=tool,
            search_top_k=top_k,
            **durations,
            **sections,
            clients=MappingProxyType(self.clients(data.get("clients", {}))),
            source=source,
        )

    def memory_dir(self, data: Mapping[str, Any], source: Path | None) -> Path:
        """Relative paths are taken from the config file's folder (or the working one)."""
        memory_dir = Path(self.get(data, "memory_dir", str, DEFAULT_MEMORY_DIR) or ".").expanduser()
        if not memory_dir.is_absolute():
            base = source.parent if source else Path.cwd()
            memory_dir = (base / memory_dir).resolve()
        return memory_dir

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
        if kind is tuple:  # an array (its items are checked by the table's rule)
            if not isinstance(value, list):
                raise self.fail(name, f"must be an array, got {_type_name(value)}")
            return tuple(value)
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

    def section(self, data: Mapping[str, Any], name: str) -> Any:
        """Table `name` read into its dataclass: known keys, their types, `env:` secrets."""
        cls = TABLES[name]
        table = self.get(data, name, dict, {})
        prefix = f"{name}."
        kinds = {f.name: type(f.default) for f in fields(cls)}
        self.check_keys(prefix, table, kinds)
        values = {
            key: self.get(table, key, kinds[key], default_of(cls, key), prefix) for key in kinds
        }
        for key in SECRETS:
            if key in values:
                values[key] = self.secret(values[key], f"{prefix}{key}")
        return cls(**values)

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
        return {cid: self.client(cid, body) for cid, body in table.items()}

    def client(self, cid: str, body: Any) -> ClientConfig:
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
        values = {
            name: self.get(body, name, kind, default_of(ClientConfig, name), f"{key}.")
            for name, kind in kinds.items()
        }
        if values["mode"] not in MODES:
            raise self.fail(
                f"{key}.mode", f"must be one of {', '.join(MODES)}, got {values['mode']!r}"
            )
        return ClientConfig(**values)


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
