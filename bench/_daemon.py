"""Benchmark support: a throwaway memd on a temp folder (bench scripts are not tests)."""

from __future__ import annotations

import contextlib
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.support.daemon import DaemonProcess, base_config, write_config


@contextlib.contextmanager
def running_daemon(**config: Any) -> Iterator[DaemonProcess]:
    """Start memd with `config` (paths inside a temp folder) and stop it afterwards."""
    with tempfile.TemporaryDirectory(prefix="memd-bench-") as tmp:
        path = write_config(Path(tmp) / "config.toml", base_config(Path(tmp), **config))
        proc = DaemonProcess(path).start(timeout=120)
        try:
            yield proc
        finally:
            proc.stop()


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    k = min(len(ordered) - 1, max(0, round(q / 100 * (len(ordered) - 1))))
    return ordered[k]
