"""Private members of memsearch and Milvus Lite that memd reads but does not patch.

Named here, so that the engine package stays the only code that knows them (and an
upgrade has one place to look, docs/engine.md). Importing this module patches nothing;
the query path may use it.
"""

from __future__ import annotations

import re
from typing import Any


def heading_pattern() -> re.Pattern[str]:
    """memsearch's chunker's heading rule (`memsearch.chunker._HEADING_RE`): a chunk's
    section is found by the same rule that cut it."""
    from memsearch.chunker import _HEADING_RE

    pattern: re.Pattern[str] = _HEADING_RE
    return pattern


def primary_key_field(collection: Any) -> str:
    """The primary key's field name of a Milvus Lite collection, read as Lite's own gRPC
    servicer reads it (`Collection._pk_name`)."""
    return str(collection._pk_name)
