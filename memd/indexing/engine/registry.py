"""The one record of what memd replaced inside memsearch and Milvus Lite, in this process.

Every patch goes through `Registry.replace`: it reads the target first (a target that is
gone, because an upgrade moved or renamed it, fails here with its name, not later as a
wrong result), remembers the original, and sets memd's function. `self_check` then proves
that each target still holds what memd installed last (a patch over a patch, as the
collection-wide BM25 wraps the cached-visibility search, must have wrapped exactly that
one), and `reset` puts every original back, newest first, for tests.

One registry per process (`REGISTRY`): the children install their role's patches once at
start (`memd.indexing.engine.roles`); nothing else keeps a flag of its own.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from typing import Any


class PatchError(RuntimeError):
    """A patch target is missing, or after install it does not hold memd's function."""


def target_name(owner: Any, attribute: str) -> str:
    """`package.module.Class.attribute`, for errors and the registry's listing."""
    module = owner.__name__ if isinstance(owner, type(threading)) else owner.__module__
    if isinstance(owner, type):
        return f"{module}.{owner.__qualname__}.{attribute}"
    return f"{module}.{attribute}"


@dataclass(frozen=True)
class Patch:
    """One attribute memd replaced: where, what was there, what memd put."""

    group: str  # the named patch it belongs to, e.g. "lite.global_bm25"
    owner: Any  # the class or module holding the attribute
    attribute: str
    original: Any
    installed: Any
    inherited: bool  # the original came from a base class: undoing deletes ours

    @property
    def target(self) -> str:
        return target_name(self.owner, self.attribute)


class Registry:
    """What this process applied, in order; thread-safe, resettable."""

    def __init__(self) -> None:
        self._lock = threading.RLock()
        self._patches: list[Patch] = []
        self._groups: dict[str, Hashable] = {}  # group -> the key it was applied with
        self.roles: set[str] = set()  # the roles prepared (versions checked, self-checked)

    def original(self, owner: Any, attribute: str) -> Any:
        """What `owner.attribute` holds now; PatchError naming it when it is gone."""
        try:
            return getattr(owner, attribute)
        except AttributeError:
            raise PatchError(
                f"{target_name(owner, attribute)} is gone: the installed version moved what "
                "memd patches (see docs/engine.md, 'Upgrading memsearch or Milvus Lite')"
            ) from None

    def replace(self, group: str, owner: Any, attribute: str, new: Any) -> Any:
        """Set `owner.attribute` to `new`, recorded under `group`; returns the original."""
        with self._lock:
            original = self.original(owner, attribute)
            inherited = isinstance(owner, type) and attribute not in vars(owner)
            self._patches.append(Patch(group, owner, attribute, original, new, inherited))
            setattr(owner, attribute, new)
            return original

    def apply(self, group: str, install: Callable[[Registry], None], key: Hashable = None) -> None:
        """Run `install` unless `group` is applied with the same `key` already; applied
        with another key (the index lock of another file), it is undone first."""
        with self._lock:
            if group in self._groups:
                if self._groups[group] == key:
                    return
                self._undo(lambda p: p.group == group)
                del self._groups[group]
            try:
                install(self)
            except BaseException:
                self._undo(lambda p: p.group == group)  # never half a group
                raise
            self._groups[group] = key

    def applied(self) -> tuple[str, ...]:
        """The groups applied, in the order they were."""
        with self._lock:
            return tuple(self._groups)

    def patches(self) -> tuple[Patch, ...]:
        with self._lock:
            return tuple(self._patches)

    def self_check(self) -> None:
        """PatchError unless every target holds memd's last function for it, and every
        patch over a patch wrapped the one before it."""
        with self._lock:
            last: dict[tuple[int, str], Patch] = {}
            for patch in self._patches:
                key = (id(patch.owner), patch.attribute)
                before = last.get(key)
                if before is not None and patch.original is not before.installed:
                    raise PatchError(f"{patch.group}: {patch.target} did not wrap {before.group}")
                last[key] = patch
            for patch in last.values():
                if getattr(patch.owner, patch.attribute, None) is not patch.installed:
                    raise PatchError(
                        f"{patch.group}: {patch.target} does not hold memd's function "
                        "(something else replaced it, or the code calls another name)"
                    )

    def reset(self) -> None:
        """Put every original back, newest first; nothing is applied afterwards."""
        with self._lock:
            self._undo(lambda p: True)
            self._groups.clear()
            self.roles.clear()

    def _undo(self, which: Callable[[Patch], bool]) -> None:
        keep = []
        for patch in reversed(self._patches):
            if not which(patch):
                keep.append(patch)
                continue
            if patch.inherited:
                delattr(patch.owner, patch.attribute)
            else:
                setattr(patch.owner, patch.attribute, patch.original)
        self._patches = keep[::-1]


REGISTRY = Registry()
