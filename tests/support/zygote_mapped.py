"""Preloaded by a test zygote: maps the file named by MEMD_TEST_MAPPED read-only and
reads every page, as a big shared library's import does with its code; the mapping is
kept for the zygote's life, and never used again (tests/test_zygote.py)."""

from __future__ import annotations

import mmap
import os

PAGE = mmap.PAGESIZE

with open(os.environ["MEMD_TEST_MAPPED"], "rb") as _f:
    MAPPED = mmap.mmap(_f.fileno(), 0, access=mmap.ACCESS_READ)
TOUCHED = sum(MAPPED[i] for i in range(0, len(MAPPED), PAGE))
