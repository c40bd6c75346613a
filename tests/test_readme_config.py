"""README's configuration block names every key of memd's config at its real default.

The defaults are declared once, in memd.config's dataclasses; the README repeats them for
people. An audit after the package move found them in step; this keeps them so when a
default or a key changes (tests/test_init_defaults.py does the same for `memd init`).
"""

from __future__ import annotations

import dataclasses
import tomllib
from pathlib import Path
from typing import Any

from memd.config import DEFAULT_MEMORY_DIR, ClientConfig, Config

README = Path(__file__).resolve().parents[1] / "README.md"


def _readme_config() -> dict[str, Any]:
    """The TOML block of README's "Configuration" section, its `<client_id>` named."""
    section = README.read_text(encoding="utf-8").split("\n## Configuration\n", 1)[1]
    block = section.split("```toml\n", 1)[1].split("```", 1)[0]
    return tomllib.loads(block.replace("<client_id>", "example"))


def _as_toml(value: object) -> object:
    return list(value) if isinstance(value, tuple) else value


def test_every_key_is_in_the_readme_at_its_default() -> None:
    data = _readme_config()
    defaults = Config()
    missing, wrong, unknown = [], [], []
    for top in dataclasses.fields(Config):
        value = getattr(defaults, top.name)
        if not dataclasses.is_dataclass(value):
            if top.name not in ("clients", "source", "memory_dir", "socket"):
                if top.name not in data:
                    missing.append(top.name)
                elif data[top.name] != value:
                    wrong.append(f"{top.name} = {data[top.name]!r}")
            continue
        table = data.get(top.name, {})
        names = {f.name for f in dataclasses.fields(value)}
        unknown += [f"[{top.name}] {k}" for k in table if k not in names]
        for key in dataclasses.fields(value):
            if key.name not in table:
                missing.append(f"[{top.name}] {key.name}")
            elif table[key.name] != _as_toml(getattr(value, key.name)):
                wrong.append(f"[{top.name}] {key.name} = {table[key.name]!r}")
    client = data["clients"]["example"]
    missing += [
        f"[clients] {f.name}" for f in dataclasses.fields(ClientConfig) if f.name not in client
    ]
    assert not missing and not wrong and not unknown, (missing, wrong, unknown)
    # the two paths are written as the user would: `~` and "" (the runtime dir's socket)
    assert data["memory_dir"] == DEFAULT_MEMORY_DIR and data["socket"] == ""
