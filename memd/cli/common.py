"""What every `memd` command shares: exit codes, usage errors, and config/socket discovery
that explains itself (which file, which socket, and why those)."""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import tomllib
from pathlib import Path
from typing import Any

from memd.cli.client import MemdClient
from memd.config import (
    Config,
    ConfigError,
    default_config_path,
    default_socket_path,
    load_config,
    parse_config,
    socket_for,
)

EXIT_OK, EXIT_ERROR, EXIT_USAGE, EXIT_UNAVAILABLE = 0, 1, 2, 3


class UsageError(Exception):
    """Arguments that parse but make no sense together (exit 2)."""


def config_source(arg: str | Path | None) -> tuple[Path, str]:
    """The config path the CLI uses and where it came from: `--config`, `$MEMD_CONFIG`
    or the default."""
    if arg:
        return Path(arg).expanduser(), "--config"
    if os.environ.get("MEMD_CONFIG"):
        return default_config_path(), "$MEMD_CONFIG"
    return default_config_path(), "default"


def check_config_exists(arg: str | Path | None) -> None:
    """A config named explicitly must exist: a typo must not silently run on defaults.

    Only the default path may be missing (then the defaults apply, as documented).
    """
    path, origin = config_source(arg)
    if origin != "default" and not path.exists():
        raise ConfigError(
            f"{path}: no such file (named by {origin}); `memd init --config {path}` writes one"
        )


def config_arg(args: argparse.Namespace) -> Path:
    return config_source(getattr(args, "config", None))[0]


def socket_origin(arg: str | Path | None) -> tuple[Path, str]:
    """Where the daemon's socket is expected, and why that path."""
    path, origin = config_source(arg)
    socket, error = socket_for(arg)
    config = _lenient(path, error)
    named = f"{path} ({origin})" if config.source else f"defaults (no file at {path})"
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    if socket != default_socket_path(config.memory_dir):
        return socket, f"the `socket` key in {named}"
    if runtime:
        return socket, f"$XDG_RUNTIME_DIR is {runtime}, so $XDG_RUNTIME_DIR/memd/memd.sock"
    return socket, (
        f"XDG_RUNTIME_DIR is unset, so <memory_dir>/memd.sock with memory_dir "
        f"{config.memory_dir} from {named}"
    )


def not_running_help(arg: str | Path | None, problem: str) -> str:
    """The error for a daemon that cannot be reached: what was tried, why, what to do."""
    socket, why = socket_origin(arg)
    return (
        f"{problem}\n"
        f"  tried:  {socket}\n"
        f"  why:    {why}\n"
        "  fix:    start it (`memd run`, or `memd service install`), or point at the "
        "running one: pass its config with --config (or $MEMD_CONFIG), set `socket` "
        "there, or use the XDG_RUNTIME_DIR it runs with; `memd path --socket` prints "
        "the path"
    )


def _lenient(path: Path, error: ConfigError | None) -> Config:
    """The config at `path`, or (when it has an invalid edit) just its two path keys."""
    if error is None:
        return load_config(path)
    data: dict[str, Any] = {}
    with contextlib.suppress(OSError, UnicodeDecodeError, tomllib.TOMLDecodeError):
        raw = tomllib.loads(path.read_text(encoding="utf-8"))
        data = {k: raw[k] for k in ("memory_dir", "socket") if isinstance(raw.get(k), str)}
    try:
        return parse_config(data, source=path)
    except ConfigError:
        return Config(source=path)


def load(args: argparse.Namespace) -> tuple[Path, Config]:
    """The config path in use and its validated contents."""
    path = config_arg(args)
    return path, load_config(path)


def call(
    args: argparse.Namespace,
    method: str,
    params: dict[str, Any] | None = None,
    timeout: float | None = 30.0,
) -> Any:
    """One request to the daemon named by the config in use (an invalid edit only warns:
    the daemon may still be running on the last good config)."""
    socket, error = socket_for(args.config)
    if error is not None:
        print(f"memd: warning: {error}", file=sys.stderr)
    with MemdClient(socket, timeout=timeout) as client:
        return client.call(method, params)


def table(header: list[str], rows: list[list[str]]) -> str:
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]
    lines = [
        "  ".join(str(v).ljust(w) for v, w in zip(r, widths, strict=True)).rstrip()
        for r in [header, *rows]
    ]
    return "\n".join(lines)


def duration(seconds: float) -> str:
    s = int(seconds)
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{s % 3600 // 60:02d}m"


def plural(count: int, word: str) -> str:
    return f"{count} {word}" if count == 1 else f"{count} {word}s"
