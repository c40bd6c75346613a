"""pymilvus's wait for a new index, asking before it sleeps.

`GrpcHandler.wait_for_creating_index` (what `create_index`, and so `create_collection`
with index params, calls) asks AllocTimestamp, then sleeps 0.5 s before its first look at
the index state. Milvus Lite builds indexes synchronously and always answers `Finished`
(its servicer's DescribeIndex), and does not implement AllocTimestamp (a traceback in the
index server's log each time). memsearch creates a collection with two indexes, so every
new client's first watcher start, and the watcher restarted by a rebuild
(`memory.forget`), spent 1 s asleep before it could scan (issue 29: time to RUNNING).

memd's version looks first and sleeps 0.5 s only between looks that find the index
unfinished, with pymilvus's timeout rule; it passes no timestamp (the one Lite would have
given is 0, the same as none).
"""

from __future__ import annotations

import time
from typing import Any

from memd.indexing.engine.registry import Registry

GROUP = "pymilvus.index_wait"
LOOK_EVERY = 0.5  # pymilvus's own interval between looks


def install(registry: Registry) -> None:
    """Make pymilvus look at a new index's state before sleeping."""
    from pymilvus.client.grpc_handler import GrpcHandler
    from pymilvus.client.types import IndexState
    from pymilvus.exceptions import MilvusException

    registry.original(GrpcHandler, "wait_for_creating_index")

    def wait_for_creating_index(
        self: Any,
        collection_name: str,
        index_name: str,
        timeout: float | None = None,
        context: Any = None,
        **kwargs: Any,
    ) -> tuple[bool, str]:
        """(built, fail reason) of the index, looked at every 0.5 s until decided."""
        start = time.monotonic()
        while True:
            state, fail_reason = self.get_index_state(
                collection_name, index_name, timeout=timeout, context=context, **kwargs
            )
            if state == IndexState.Finished:
                return True, fail_reason
            if state == IndexState.Failed:
                return False, fail_reason
            if isinstance(timeout, int) and time.monotonic() - start > timeout:
                what = f"collection {collection_name} create index {index_name}"
                raise MilvusException(message=f"{what} timeout in {timeout}s")
            time.sleep(LOOK_EVERY)

    registry.replace(GROUP, GrpcHandler, "wait_for_creating_index", wait_for_creating_index)
