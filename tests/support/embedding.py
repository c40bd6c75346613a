"""One embedded model for a whole test run (memd's own code owns an Embedder each)."""

from __future__ import annotations

from memd.indexing.embedding import Embedder

EMBEDDER = Embedder()
embed = EMBEDDER.embed
embed_one = EMBEDDER.embed_one
