"""Private members of Milvus Lite that memd reads but does not patch.

Named here, so that the engine package stays the only code that knows them (and an
upgrade has one place to look, docs/engine.md). Importing this module patches nothing;
the query path may use it.
"""

from __future__ import annotations

from typing import Any


def primary_key_field(collection: Any) -> str:
    """The primary key's field name of a Milvus Lite collection, read as Lite's own gRPC
    servicer reads it (`Collection._pk_name`)."""
    return str(collection._pk_name)
