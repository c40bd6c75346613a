"""Secret scrubbing: credentials and `<private>` spans replaced by markers before storage."""

from __future__ import annotations

from typing import TYPE_CHECKING

from memd import public_face

if TYPE_CHECKING:
    from memd.redaction.patterns import KINDS
    from memd.redaction.residue import truncate_wal
    from memd.redaction.scrub import PRIVATE_MARKER, Scrubbed, Scrubber, marker

__all__ = ["KINDS", "PRIVATE_MARKER", "Scrubbed", "Scrubber", "marker", "truncate_wal"]

__getattr__ = public_face(
    __name__,
    {
        "patterns": ("KINDS",),
        "residue": ("truncate_wal",),
        "scrub": ("PRIVATE_MARKER", "Scrubbed", "Scrubber", "marker"),
    },
)
