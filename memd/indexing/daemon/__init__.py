"""Indexing's daemon side, run in memd: each client's plan, children, rebuilds, catch-up.

`Pipelines` supervises every client's index server and watcher (`pipeline`), from the
client's plan (`plan`) and the index servers chosen once from the config (`servers`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from memd import lazy_face

if TYPE_CHECKING:
    from memd.indexing.daemon.maintenance import (
        IndexBusyError,
        catch_up,
        needs_rebuild,
        prepare_index,
        read_spec,
        rebuild,
        watcher_ready,
        write_spec,
    )
    from memd.indexing.daemon.pipeline import Pipelines
    from memd.indexing.daemon.plan import (
        ClientPlan,
        index_server_command,
        index_spec,
        index_target,
        memsearch_toml,
        watcher_command,
    )
    from memd.indexing.daemon.servers import IndexServers
    from memd.indexing.daemon.settings import (
        collection_name,
        ensure_dirs,
        index_socket_path,
        milvus_data_dir,
        watcher_home,
    )
else:
    __getattr__ = lazy_face(__name__, __file__)
