"""memd: persistent conversation memory for LLM clients."""

from __future__ import annotations

import ast
import importlib
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

__version__ = "0.1.0"


def public_face(package: str, exports: Mapping[str, Sequence[str]]) -> Callable[[str], Any]:
    """A package's `__getattr__` (PEP 562) that imports a public name's module on first use.

    `lazy_face` builds it from a face's TYPE_CHECKING block; importing the package itself
    stays free. That matters for the children: `python -m memd.indexing.children.index_server`
    must not load the embedding model or the search client just because they share a
    package, and `memd mcp` describes the recall tool without importing pymilvus.
    """
    where = {name: module for module, names in exports.items() for name in names}

    def __getattr__(name: str) -> Any:
        module = where.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        return getattr(importlib.import_module(f"{package}.{module}"), name)

    return __getattr__


def lazy_face(package: str, init_file: str) -> Callable[[str], Any]:
    """A package face's lazy `__getattr__` (PEP 562), `__all__` included, read from the
    face's `if TYPE_CHECKING:` block, so each public name is written once.

    The face's `from memd.<package>.<module> import name` lines under TYPE_CHECKING are
    what mypy reads (a lazy `__getattr__` alone would make every name `Any` to it, and a
    misspelt import pass) and what import-linter follows; this reads the same lines, as
    `lazy_loader.attach_stub` reads a `.pyi`. It reads them (ast) when the face is first
    asked for a name, not at import: importing a face stays free (1 ms for the largest
    face under load, so 16 ms for all fourteen had they been read eagerly). A line of
    another shape in that block is a mistake in the face and raises ImportError.
    """
    found: list[Callable[[str], Any]] = []
    names: list[str] = []

    def __getattr__(name: str) -> Any:
        if not found:
            exports = _face_exports(package, init_file)
            names.extend(sorted(n for module in exports.values() for n in module))
            found.append(public_face(package, exports))
        if name == "__all__":
            return list(names)
        return found[0](name)

    return __getattr__


def _face_exports(package: str, init_file: str) -> dict[str, list[str]]:
    """module -> names, from the face's TYPE_CHECKING imports (see lazy_face)."""
    exports: dict[str, list[str]] = {}
    tree = ast.parse(Path(init_file).read_text(encoding="utf-8"), init_file)
    blocks = [n for n in tree.body if isinstance(n, ast.If) and _is_type_checking(n.test)]
    if len(blocks) != 1:
        raise ImportError(f"{package}: a face needs exactly one `if TYPE_CHECKING:` block")
    for node in blocks[0].body:
        if not (
            isinstance(node, ast.ImportFrom)
            and node.level == 0
            and (node.module or "").rpartition(".")[0] == package
            and not any(alias.asname for alias in node.names)
        ):
            raise ImportError(
                f"{package}: line {node.lineno} of its face is not "
                f"`from {package}.<module> import <names>`"
            )
        module = (node.module or "").rpartition(".")[2]
        exports.setdefault(module, []).extend(alias.name for alias in node.names)
    return exports


def _is_type_checking(test: ast.expr) -> bool:
    return isinstance(test, ast.Name) and test.id == "TYPE_CHECKING"


def _structlog_without_rich() -> None:
    """Import structlog with `rich` hidden, once, before any memd module imports it.

    `structlog.dev` imports rich (and pygments through it) when it is installed, only to
    draw tracebacks in colour; memd formats exceptions itself (`format_exc_info` in
    memd.logs) and never uses it. In a virtualenv with rich (the dev extras bring it,
    for import-linter) that cost memd ~3 MB of PSS and the zygote ~2.4 (bench/scale.py,
    issue 29), and log lines looked different with and without it. Afterwards
    `import rich` works as usual.
    """
    if "structlog" in sys.modules or "rich" in sys.modules:
        return
    sys.modules["rich"] = None  # type: ignore[assignment]  # makes `import rich` fail
    try:
        import structlog  # noqa: F401
    except ImportError:
        pass  # reported where it is used
    finally:
        del sys.modules["rich"]


_structlog_without_rich()
