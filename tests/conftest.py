"""Fixtures: a config in a temp folder and a real daemon started on it."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import settings

from tests.support.children import Child, short_dir, stopping_children
from tests.support.daemon import DaemonProcess, base_config, stop_all, write_config
from tests.support.embedder import EmbedderChild

# CI runs the fuzzers on a fixed seed so that a landing never depends on luck; locally
# every run explores new inputs (and hypothesis replays the failures it found).
settings.register_profile("ci", derandomize=True, print_blob=True)
if os.environ.get("CI"):
    settings.load_profile("ci")


@pytest.fixture(scope="session", autouse=True)
def _test_daemons_end_with_the_session() -> Iterator[None]:
    """Whatever a test left running stops here (a killed session: PR_SET_PDEATHSIG)."""
    yield
    stop_all()


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
        proc.end()


@pytest.fixture(scope="module")
def module_daemon(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Callable[..., tuple[DaemonProcess, Path]]]:
    """One real daemon per test module and config, for cases that only send requests.

    Parametrized cases that each check one refusal do not need a daemon of their own:
    starting one per case was most of their time. A case asks with the config it needs
    (keyword args as for `config_file`) and gets the daemon already running on it.
    """
    running: dict[str, tuple[DaemonProcess, Path]] = {}

    def get(**extra: Any) -> tuple[DaemonProcess, Path]:
        key = repr(sorted(extra.items()))
        if key not in running:
            tmp = tmp_path_factory.mktemp("shared")
            path = write_config(tmp / "config.toml", base_config(tmp, **extra))
            running[key] = (DaemonProcess(path).start(), tmp)
        return running[key]

    yield get
    for proc, _ in running.values():
        proc.end()


@pytest.fixture(scope="session")
def embedder() -> Iterator[EmbedderChild]:
    """The real embedder child (every bundled model), shared by the tests of a session that
    index with the embedded model: watchers reach it through memsearch's `memd` provider."""
    with EmbedderChild() as child:
        yield child


@pytest.fixture
def children() -> Iterator[list[Child]]:
    """Every Child (tests/support/children.py) a test appends is stopped at its end, last
    started first."""
    yield from stopping_children()


@pytest.fixture
def short_tmp() -> Iterator[Path]:
    """A short private folder for Unix sockets (sun_path holds 107 bytes; pytest's
    tmp_path can be longer)."""
    yield from short_dir()
