"""Where memd's config file is, and reading it: a missing file means the defaults.

`socket_for` finds the daemon's socket even in a file with an invalid edit, so the CLI
can still reach the daemon that kept the last good config and show the rejection.
"""

from __future__ import annotations

import contextlib
import os
import tomllib
from pathlib import Path
from typing import Any

from memd.config.model import Config, ConfigError
from memd.config.parse import parse_config


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
