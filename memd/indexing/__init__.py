"""Each client's index: its plan and children, the embedding models, recall's search.

Organised by where code runs (docs/architecture.md): `daemon` (memd's side: pipelines,
index servers, rebuilds, catch-up), `query` (recall's search, in memd), the child
programs, and the modules both sides share (`targets`, `embedding`, `chunking`,
`index_lock`). This face names what the rest of memd uses.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from memd import lazy_face
from memd.standins import install as _install_standins

# pymilvus is imported only by code in this package, in memd and in every child program
# (the zygote's preload too): from here on, it gets a pandas and a requests that load on
# first use (memd.standins; ~30 MB of the zygote and its forks, issue 29).
_install_standins()

if TYPE_CHECKING:
    from memd.indexing.daemon import (
        ClientPlan,
        IndexBusyError,
        Pipelines,
        catch_up,
        collection_name,
        ensure_dirs,
        index_server_command,
        index_socket_path,
        index_spec,
        index_target,
        memsearch_toml,
        milvus_data_dir,
        needs_rebuild,
        prepare_index,
        read_spec,
        rebuild,
        watcher_command,
        watcher_home,
        watcher_ready,
        write_spec,
    )
    from memd.indexing.query import (
        Hit,
        IndexSearcher,
        IndexUnavailableError,
        Section,
        expand_hit,
        in_range,
    )
    from memd.indexing.targets import IndexTarget
else:
    __getattr__ = lazy_face(__name__, __file__)
