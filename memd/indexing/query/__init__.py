"""Recall's query path, run in memd: hybrid search of a client's index and its ranking.

`IndexSearcher` (`search`) embeds the query (`query_embedding`; a bundled model through
the embedder child, `embedder_client`), asks the index through `index_client`, fuses and
scores the two halves (`ranking`) and filters by time (`time_filter`). It never loads an
engine patch: those run in the children only.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from memd import lazy_face

if TYPE_CHECKING:
    from memd.indexing.query.expand import Section, expand_hit
    from memd.indexing.query.search import (
        Hit,
        IndexSearcher,
        IndexUnavailableError,
        in_range,
    )
else:
    __getattr__ = lazy_face(__name__, __file__)
