"""Secret scrubbing: credentials and `<private>` spans replaced by markers before storage."""

from __future__ import annotations

from typing import TYPE_CHECKING

from memd import lazy_face

if TYPE_CHECKING:
    from memd.redaction.patterns import KINDS
    from memd.redaction.residue import truncate_wal
    from memd.redaction.scrub import PRIVATE_MARKER, Scrubbed, Scrubber, marker
else:
    __getattr__ = lazy_face(__name__, __file__)
