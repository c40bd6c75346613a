"""Run the installed `memd` command as a user would, in a home folder of the test's own."""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

MEMD = Path(sys.executable).with_name("memd")  # the console script of this venv


@dataclass
class Result:
    code: int
    out: str
    err: str


class User:
    """A user with their own HOME (and so ~/.config, ~/.localrouter) under `root`."""

    def __init__(self, root: Path, runtime_dir: Path | None = None) -> None:
        self.home = root / "home"
        self.home.mkdir(mode=0o700, parents=True, exist_ok=True)
        self.env = {
            k: v
            for k, v in os.environ.items()
            if k not in ("MEMD_CONFIG", "XDG_CONFIG_HOME", "XDG_RUNTIME_DIR")
        }
        self.env["HOME"] = str(self.home)
        if runtime_dir is not None:
            runtime_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
            self.env["XDG_RUNTIME_DIR"] = str(runtime_dir)

    @property
    def default_config(self) -> Path:
        return self.home / ".config" / "memd" / "config.toml"

    def memd(
        self, *args: str, stdin: str | None = None, timeout: float = 60.0, **env: str
    ) -> Result:
        done = subprocess.run(
            [str(MEMD), *args],
            input=stdin,
            capture_output=True,
            text=True,
            env={**self.env, **env},
            cwd=self.home,
            timeout=timeout,
            check=False,
        )
        return Result(done.returncode, done.stdout, done.stderr)
