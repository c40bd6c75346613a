"""memd's contract with its engine: the only code that names a private member of memsearch,
pymilvus or Milvus Lite.

memd's speed and size come from reaching into its engine (docs/engine.md lists every
patch and why). All of that lives here, behind one call per process role:

- `prepare_index_server()`: the index server (one client's or the shared one);
- `prepare_watcher()`: the `memsearch watch` wrapper;
- `prepare_catch_up()`: the catch-up child (and `maintenance.catch_up` in-process).

Each checks the installed versions against `PINS` (the pins of pyproject.toml) and
raises `EngineMismatch` (package, found, expected) before patching anything; applies the
role's patches in a fixed order, recorded in the one `REGISTRY`; and proves each took
(`PatchError` when a target is gone or does not hold memd's function). The child
programs turn either error into one log line and an exit, which supervision shows as
FATAL. `REGISTRY.reset()` puts every original back (tests).

`reads` holds the private members memd only reads (no patch): the query path may use it.
`memd.standins` keeps pandas and requests, which pymilvus imports and memd never uses,
out of every process (installed by the `memd.indexing` face itself, before anything
imports pymilvus, and kept outside this package so that importing the face loads none of
it; each role's prepare also has pyarrow, through its private `_pandas_api`, give up on
pandas).
Nothing outside this package and the child programs imports the patch modules
(import-linter, pyproject.toml).
"""

from memd.indexing.engine.pins import PINS, EngineMismatch, check_versions, installed_version
from memd.indexing.engine.registry import REGISTRY, Patch, PatchError, Registry
from memd.indexing.engine.roles import (
    CATCH_UP,
    INDEX_SERVER,
    WATCHER,
    prepare_catch_up,
    prepare_index_server,
    prepare_watcher,
)

EngineError = (EngineMismatch, PatchError)  # what a role's prepare raises

__all__ = [
    "CATCH_UP",
    "INDEX_SERVER",
    "PINS",
    "REGISTRY",
    "WATCHER",
    "EngineError",
    "EngineMismatch",
    "Patch",
    "PatchError",
    "Registry",
    "check_versions",
    "installed_version",
    "prepare_catch_up",
    "prepare_index_server",
    "prepare_watcher",
]
