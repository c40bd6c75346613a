"""Fixtures: a config in a temp folder and a real daemon started on it."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import settings

from tests.support.daemon import DaemonProcess, base_config, write_config

# CI runs the fuzzers on a fixed seed so that a landing never depends on luck; locally
# every run explores new inputs (and hypothesis replays the failures it found).
settings.register_profile("ci", derandomize=True, print_blob=True)
if os.environ.get("CI"):
    settings.load_profile("ci")


@pytest.fixture
def config_file(tmp_path: Path) -> Callable[..., Path]:
    """Write a test config; keyword args override the base (paths inside tmp_path)."""

    def make(**extra: Any) -> Path:
        return write_config(tmp_path / "config.toml", base_config(tmp_path, **extra))

    return make


@pytest.fixture
def daemon_factory(tmp_path: Path) -> Iterator[Callable[..., DaemonProcess]]:
    """Start real daemons; every one is stopped (SIGKILL if it hangs) at teardown."""
    started: list[DaemonProcess] = []

    def start(config_path: Path, wait: bool = True, **kw: Any) -> DaemonProcess:
        proc = DaemonProcess(config_path, **kw)
        started.append(proc)
        return proc.start(wait=wait)

    yield start
    for proc in started:
        proc.stop()
