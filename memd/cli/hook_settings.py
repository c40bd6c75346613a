"""Claude Code's settings file: memd's hook entries merged in and taken out again.

The file is JSON: `{"hooks": {"Stop": [{"matcher": "", "hooks": [{"type": "command",
"command": "...", "timeout": 30}]}], ...}, ...}`. memd adds one group to each of EVENTS
and recognises its own entries by MARKER in the command, so `install` run twice changes
nothing, `uninstall` removes only those entries (and the groups and events they leave
empty), and every other key and hook of the file is kept as it was. A file that is not
valid JSON is refused, not overwritten. The file is replaced atomically.
"""

from __future__ import annotations

import json
import os
import shlex
import sys
from pathlib import Path
from typing import Any

EVENTS = ("Stop", "SessionEnd")
MARKER = "memd.cli.hook_run"
TIMEOUT = 30  # seconds; the hook itself gives up on memd well before


class SettingsError(Exception):
    """The settings file cannot be read or written as JSON; nothing was changed."""


def settings_path(scope: str) -> Path:
    root = Path.home() if scope == "user" else Path.cwd()
    return root / ".claude" / "settings.json"


def hook_command(client: str, config: str | None) -> str:
    """The command line Claude Code runs: this Python and memd, wherever they are installed."""
    parts = [sys.executable, "-m", "memd.cli.hook_run", "--client", client]
    if config:
        parts += ["--config", str(Path(config).resolve())]
    return " ".join(shlex.quote(p) for p in parts)


def install(path: Path, command: str) -> bool:
    """Add memd's hook to every event of EVENTS; False if exactly that was there already."""
    settings = _load(path)
    hooks = settings.setdefault("hooks", {})
    if not isinstance(hooks, dict):
        raise SettingsError(f"{path}: `hooks` is not an object")
    ours = {"type": "command", "command": command, "timeout": TIMEOUT}
    before = json.dumps(settings, sort_keys=True)
    _remove_ours(hooks)
    for event in EVENTS:
        groups = hooks.setdefault(event, [])
        if not isinstance(groups, list):
            raise SettingsError(f"{path}: `hooks.{event}` is not a list")
        groups.append({"hooks": [ours]})
    if json.dumps(settings, sort_keys=True) == before:
        return False
    _save(path, settings)
    return True


def uninstall(path: Path) -> int:
    """Remove memd's entries; how many there were."""
    if not path.exists():
        return 0
    settings = _load(path)
    hooks = settings.get("hooks")
    if not isinstance(hooks, dict):
        return 0
    removed = _remove_ours(hooks)
    if not hooks:
        del settings["hooks"]
    if removed:
        _save(path, settings)
    return removed


def _remove_ours(hooks: dict[str, Any]) -> int:
    removed = 0
    for event in list(hooks):
        groups = hooks[event]
        if not isinstance(groups, list):
            continue
        for group in groups:
            inner = group.get("hooks") if isinstance(group, dict) else None
            if isinstance(inner, list):
                kept = [h for h in inner if not _ours(h)]
                removed += len(inner) - len(kept)
                group["hooks"] = kept
        hooks[event] = [g for g in groups if not (isinstance(g, dict) and g.get("hooks") == [])]
        if not hooks[event]:
            del hooks[event]
    return removed


def _ours(hook: Any) -> bool:
    return isinstance(hook, dict) and MARKER in str(hook.get("command", ""))


def _load(path: Path) -> dict[str, Any]:
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return {}
    except OSError as exc:
        raise SettingsError(f"cannot read {path}: {exc.strerror or exc}") from None
    try:
        settings = json.loads(text) if text.strip() else {}
    except ValueError as exc:
        raise SettingsError(f"{path} is not valid JSON ({exc}); not changed") from None
    if not isinstance(settings, dict):
        raise SettingsError(f"{path} is not a JSON object; not changed")
    return settings


def _save(path: Path, settings: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".memd.tmp")
    tmp.write_text(json.dumps(settings, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    if path.exists():
        os.chmod(tmp, path.stat().st_mode & 0o777)
    os.replace(tmp, path)
