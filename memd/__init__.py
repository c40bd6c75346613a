"""memd: persistent conversation memory for LLM clients."""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping, Sequence
from typing import Any

__version__ = "0.1.0"


def public_face(package: str, exports: Mapping[str, Sequence[str]]) -> Callable[[str], Any]:
    """A package's `__getattr__` (PEP 562) that imports a public name's module on first use.

    Each subpackage names its public surface in `__all__`; importing the package itself
    stays free. That matters for the children: `python -m memd.indexing.children.index_server` must
    not load the embedding model or the search client just because they share a package,
    and `memd mcp` describes the recall tool without importing pymilvus.
    """
    where = {name: module for module, names in exports.items() for name in names}

    def __getattr__(name: str) -> Any:
        module = where.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        return getattr(importlib.import_module(f"{package}.{module}"), name)

    return __getattr__
