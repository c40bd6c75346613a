"""The engine versions memd's patches were written against, checked before any is applied.

memd replaces private functions of memsearch and Milvus Lite (and reads private
attributes of both, and of pymilvus's generated code). They are pinned exactly in
pyproject.toml; a different installed version would run with patches written for other
code: at best a crash loop at the first moved name, at worst silently different results.
So every child checks the installed versions (their dist-info, through
`importlib.metadata`) against `PINS` before it patches anything, and refuses to start
with one line that names the package, the version found and the one expected.

`PINS` must equal the pins in pyproject.toml (tests/test_engine.py holds them equal).
"""

from __future__ import annotations

import importlib.metadata

PINS: dict[str, str] = {
    "memsearch": "0.4.23",
    "pymilvus": "3.0.2",
    "milvus-lite": "3.2.2",
}

NOT_INSTALLED = "not installed"


class EngineMismatch(RuntimeError):
    """An installed engine package is not the version memd's patches were written for."""

    def __init__(self, package: str, found: str, expected: str) -> None:
        super().__init__(
            f"{package} {found} is installed, memd needs {package}=={expected} "
            "(pinned in pyproject.toml): its patches were not applied"
        )
        self.package, self.found, self.expected = package, found, expected


def installed_version(package: str) -> str:
    """The version in the package's installed metadata, or NOT_INSTALLED."""
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return NOT_INSTALLED


def check_versions(pins: dict[str, str] | None = None) -> None:
    """EngineMismatch for the first pinned package whose installed version differs."""
    for package, expected in (PINS if pins is None else pins).items():
        found = installed_version(package)
        if found != expected:
            raise EngineMismatch(package, found, expected)
