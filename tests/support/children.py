"""Test-started processes: `Child` (its own process group, SIGINT then SIGKILL), a
bounded `wait_for`, and the bodies of conftest's `children` and `short_tmp` fixtures, for
the tests that run index servers, watchers and Milvus Lite servers by hand."""

from __future__ import annotations

import os
import signal
import subprocess
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from tests.support import faults


def wait_for(predicate: Callable[[], Any], timeout: float = 90.0, what: str = "condition") -> Any:
    """Poll until predicate() is truthy; a bounded wait, not a speed assertion
    (`tests.support.faults.wait_for` with this module's longer default and argument order)."""
    return faults.wait_for(predicate, timeout, what=what)


class Child:
    """A test-started process in its own group; stop() is SIGINT, wait, SIGKILL, wait."""

    def __init__(
        self,
        argv: list[str] | tuple[str, ...],
        log_path: Path,
        env: dict[str, str] | None = None,
        cwd: Path | None = None,
    ) -> None:
        self.log_path = log_path
        with open(log_path, "ab") as fh:
            self.proc = subprocess.Popen(
                list(argv),
                env=env,
                cwd=cwd,
                stdin=subprocess.DEVNULL,
                stdout=fh,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    @property
    def pid(self) -> int:
        return self.proc.pid

    def output(self) -> str:
        return self.log_path.read_text(encoding="utf-8", errors="replace")

    def signal(self, sig: int) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, sig)

    def wait(self, timeout: float = 15.0) -> int:
        return self.proc.wait(timeout)

    def stop(self, timeout: float = 15.0) -> int | None:
        if self.proc.poll() is not None:
            return self.proc.returncode
        with _suppress_lookup():
            os.killpg(self.proc.pid, signal.SIGINT)
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            with _suppress_lookup():
                os.killpg(self.proc.pid, signal.SIGKILL)
            return self.proc.wait(timeout)


class _suppress_lookup:
    def __enter__(self) -> None:
        return None

    def __exit__(self, exc_type: Any, *_: Any) -> bool:
        return exc_type is ProcessLookupError


def stopping_children() -> Iterator[list[Child]]:
    """Body of conftest's `children` fixture: every Child appended is stopped at the end,
    last started first."""
    started: list[Child] = []
    yield started
    for child in reversed(started):
        child.stop()


def short_dir() -> Iterator[Path]:
    """Body of conftest's `short_tmp` fixture: sun_path is 107 bytes, pytest's tmp_path
    can be longer."""

    with tempfile.TemporaryDirectory(prefix="memd-t-") as tmp:
        yield Path(tmp)
