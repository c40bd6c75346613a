"""pandas and requests as pymilvus sees them in memd: stand-ins that import the real
module on first use.

pymilvus 3.0.2 imports pandas at module level (`pymilvus/orm/{schema,types,prepare,
collection,partition}.py`: `import pandas as pd`, `from pandas.api.types import ...`),
and `import pymilvus` imports `orm`. It uses pandas only when handed a DataFrame (insert,
upsert, `construct_from_dataframe`) or in five type helpers of its ORM and expression
templates; memd does neither. Measured (docs/performance.md, "What the imports cost"):
pandas adds 49 MB RSS, 32 MB of Python objects and 400 modules to the zygote.

pymilvus also imports requests at module level (`pymilvus/client/global_topology.py`,
for a Zilliz Cloud cluster's topology; measured: +7.4 MB RSS, 5.6 MB of Python objects,
155 modules with urllib3, charset_normalizer, idna): its stand-in is a plain one (any
name read imports the real requests; pymilvus reads them only to fetch a topology, or in
an `except` clause once something raised).

`importlib.util.LazyLoader` cannot defer them (Python 3.11): its module loads on the first
attribute read of any kind, and the import system reads `__spec__` of a module it finds in
`sys.modules`, so pymilvus's own `import pandas as pd` loads it (measured: pandas' native
modules are in right after it); `from pandas.api.types import x` reads `__path__` and `x`.

So `install()` has pymilvus imported with stand-ins for `pandas`, `pandas.api` and
`pandas.api.types` in `sys.modules` (a finder wraps the import of `pymilvus` only), and
takes them out again once it is imported. pymilvus keeps the stand-ins:

- `pd.DataFrame` is a class no object is an instance of while the real pandas is not
  imported (no DataFrame exists before it is), and the real class once it is, so
  pymilvus's `isinstance(data, pd.DataFrame)` and its annotations never import it;
- the type helpers it imports by name (`is_list_like`, `is_scalar`, `infer_dtype`,
  `is_array_like`, `is_float`) import the real pandas when called;
- any other name read from a stand-in imports the real pandas and is its.

Everyone else imports the real pandas as usual: the stand-ins are not in `sys.modules`
once pymilvus is imported. pyarrow (Milvus Lite's, pymilvus's) would import it itself the
first time `pa.array` gets a list; `keep_out_of_pyarrow()`, called by the engine's roles,
has pyarrow make that one try while pandas cannot be imported, and a stand-in that loads
the real pandas tells pyarrow again. Left alone: pyarrow's C++ conversions look at
`sys.modules` and use pandas only if it is there.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import sys
import threading
import types
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

STANDIN_NAMES = ("pandas", "pandas.api", "pandas.api.types", "requests")
# What pymilvus imports by name from pandas.api.types (pymilvus/orm/{types,schema}.py).
TYPE_HELPERS = ("infer_dtype", "is_array_like", "is_float", "is_list_like", "is_scalar")
# Dunders that mean a use (a version check, a star import); others are probes
# (`inspect.getmodule` reads every module's `__file__`) and must not import anything.
USE_DUNDERS = frozenset({"__version__", "__all__"})

_lock = threading.RLock()


def real(name: str = "pandas") -> types.ModuleType | None:
    """The real top-level package of `name` if someone imported it, else None."""
    module = sys.modules.get(name.partition(".")[0])
    return None if module is None or isinstance(module, StandIn) else module


class DataFrame:
    """pandas.DataFrame while pandas is not imported: nothing is an instance of it, and
    calling it makes a real DataFrame."""

    def __new__(cls, *args: Any, **kwargs: Any) -> Any:
        return load().DataFrame(*args, **kwargs)


class StandIn(types.ModuleType):
    """A module as pymilvus holds it: each name read is the real module's."""

    def __getattr__(self, name: str) -> Any:
        imported = real(self.__name__) is not None
        if name.startswith("__") and name not in USE_DUNDERS and not imported:
            raise AttributeError(name)
        if name == "DataFrame" and self.__name__ == "pandas" and not imported:
            return DataFrame
        return getattr(load(self.__name__), name)


def _helper(name: str) -> Callable[..., Any]:
    def call(*args: Any, **kwargs: Any) -> Any:
        return getattr(load("pandas.api.types"), name)(*args, **kwargs)

    call.__name__ = call.__qualname__ = name
    call.__doc__ = f"pandas.api.types.{name}, imported on first call (memd's stand-in)."
    return call


def standins() -> dict[str, StandIn]:
    """A fresh set of stand-ins, the type helpers set on `pandas.api.types`'s."""
    out = {name: StandIn(name, f"memd's stand-in for {name}") for name in STANDIN_NAMES}
    for helper in TYPE_HELPERS:
        setattr(out["pandas.api.types"], helper, _helper(helper))
    return out


@contextmanager
def in_sys_modules() -> Iterator[None]:
    """Inside, the stand-ins are what `import pandas` (`requests`) gives, unless the
    real one is imported already."""
    with _lock:
        added = {k: v for k, v in standins().items() if k.partition(".")[0] not in sys.modules}
        sys.modules.update(added)
        try:
            yield
        finally:
            for name, module in added.items():
                if sys.modules.get(name) is module:
                    del sys.modules[name]


def load(name: str = "pandas") -> Any:
    """The real module `name`, imported now if it is not yet."""
    return importlib.import_module(name)


class OnImport(importlib.abc.MetaPathFinder):
    """The next import of one top-level module, found as the path finder finds it, run
    through `run(execute)`; the module's loader is the path finder's as usual."""

    def __init__(self, name: str, run: Callable[[Callable[[], None]], None]) -> None:
        self.name, self.run = name, run

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: types.ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname != self.name:
            return None
        with _lock:
            if self in sys.meta_path:
                sys.meta_path.remove(self)  # once
        spec = importlib.machinery.PathFinder.find_spec(fullname, path, target)
        if spec is not None and spec.loader is not None:
            spec.loader = _Through(spec.loader, self.run)
        return spec


class _Through(importlib.abc.Loader):
    def __init__(self, loader: Any, run: Callable[[Callable[[], None]], None]) -> None:
        self.loader, self.run = loader, run

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType | None:
        module: types.ModuleType | None = self.loader.create_module(spec)
        return module

    def exec_module(self, module: types.ModuleType) -> None:
        module.__loader__ = self.loader
        if module.__spec__ is not None:
            module.__spec__.loader = self.loader
        self.run(lambda: self.loader.exec_module(module))


def _with_standins(execute: Callable[[], None]) -> None:
    with in_sys_modules():
        execute()


FINDER = OnImport("pymilvus", _with_standins)


def install() -> bool:
    """pymilvus, when it is imported, gets the stand-ins; False if it is imported already
    (with whatever pandas it found) or pandas is not installed."""
    with _lock:
        if FINDER in sys.meta_path:
            return True
        if "pymilvus" in sys.modules or importlib.machinery.PathFinder.find_spec("pandas") is None:
            return False
        sys.meta_path.insert(0, FINDER)
        return True


class _NoPandas(importlib.abc.MetaPathFinder):
    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: types.ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname == "pandas":
            raise ModuleNotFoundError("pandas is kept out of pyarrow", name=fullname)
        return None


def _then_tell_pyarrow(execute: Callable[[], None]) -> None:
    """pandas' import, then pyarrow's shim told: its pandas-only calls retry the import
    (outside the lock its first try holds), and reading `pd` is one."""
    execute()
    sys.modules["pyarrow.lib"]._pandas_api.pd  # noqa: B018


_NO_PANDAS = _NoPandas()
_PANDAS_IMPORT = OnImport("pandas", _then_tell_pyarrow)
_pyarrow_told_no = False


def keep_out_of_pyarrow() -> None:
    """Have pyarrow make its two tries at pandas now, while `import pandas` fails.

    Each is made once per process: its Python shim's (`pa.array` of a list asks whether
    the list is a pandas object) and its C++ conversion's (it keeps pandas' NA, NaT,
    Timestamp, Timedelta and DateOffset to recognise them in lists). Measured: the shared
    index server imported pandas through them on its first write. After this call pyarrow
    works as with no pandas installed; when the real pandas is imported later (by anyone),
    the shim is told, the C++ side is not: pandas' scalars inside Python lists are then
    converted as plain objects (no memd process makes any).
    """
    global _pyarrow_told_no
    with _lock:
        if _pyarrow_told_no or "pandas" in sys.modules:
            return
        import pyarrow

        sys.meta_path.insert(0, _NO_PANDAS)
        try:
            pyarrow.array([0])  # the C++ conversion's try, and the shim's
            pyarrow.lib._pandas_api.have_pandas  # noqa: B018  # the shim's, if not made
        finally:
            sys.meta_path.remove(_NO_PANDAS)
        sys.meta_path.insert(0, _PANDAS_IMPORT)
        _pyarrow_told_no = True
