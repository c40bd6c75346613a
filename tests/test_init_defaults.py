"""`memd init` writes every key at its default, as the README says (issue 24, item 13):
[proxy], [recall], [limits] and compaction's token caps were missing."""

from __future__ import annotations

import dataclasses
import re
import tomllib

from memd.cli.init import render
from memd.config import ClientConfig, Config

KEY = re.compile(r"^# (\[[a-z0-9_.]+\]|[a-z0-9_]+ = .*)$")


def _uncommented(text: str) -> dict:
    """The file with every commented `[table]` and `key = value` line switched on."""
    lines = []
    for line in text.splitlines():
        match = KEY.match(line.split("  #")[0].rstrip() if line.startswith("# ") else line)
        lines.append(match.group(1) if match else line)
    return tomllib.loads("\n".join(lines))


def _as_toml(value: object) -> object:
    """A default as TOML reads it back: tuples are arrays (lists)."""
    return list(value) if isinstance(value, tuple) else value


def test_every_key_is_written_at_its_default() -> None:
    data = _uncommented(render("alice", "both"))
    defaults = Config()
    missing, wrong = [], []
    for top in dataclasses.fields(Config):
        value = getattr(defaults, top.name)
        if dataclasses.is_dataclass(value):
            table = data.get(top.name, {})
            for key in dataclasses.fields(value):
                if key.name not in table:
                    missing.append(f"[{top.name}] {key.name}")
                elif table[key.name] != _as_toml(getattr(value, key.name)):
                    wrong.append(f"[{top.name}] {key.name} = {table[key.name]!r}")
        elif top.name not in ("clients", "source", "socket", "memory_dir") and top.name not in data:
            missing.append(top.name)
    client = data["clients"]["alice"]
    missing += [
        f"[clients.alice] {f.name}"
        for f in dataclasses.fields(ClientConfig)
        if f.name not in client
    ]
    assert not missing and not wrong, f"missing: {missing}; not the default: {wrong}"
