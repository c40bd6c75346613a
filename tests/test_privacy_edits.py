"""What counts as text removed from `sessions/` (memd.daemon.edits): the trigger of the
index rebuild that drops it physically. memd's own appends and moves never count."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from memd.daemon.edits import EditWatch
from memd.layout import ClientLayout


def test_appends_and_moves_by_memd_are_not_removals_but_edits_and_deletions_are(
    tmp_path: Path,
) -> None:
    layout = ClientLayout(tmp_path, "c1")
    layout.ensure()
    live = layout.sessions / "s1.md"
    live.write_text("# Conversation 1\n\nmy secret words\n")
    gone = layout.sessions / "s2.md"
    gone.write_text("to be deleted by a person\n")
    moved = layout.sessions / "s3.md"
    moved.write_text("compacted soon\n")
    watch = EditWatch()
    assert watch.removed(layout) == []  # the first round only looks
    with open(live, "a") as fh:
        fh.write("appended by memd\n")
    assert watch.removed(layout) == []
    subprocess.run(["sed", "-i", "s/secret/other/", str(live)], check=True)
    assert watch.removed(layout) == ["s1.md"]
    assert watch.removed(layout) == []  # seen once
    live.write_text("short")  # truncated in place
    assert watch.removed(layout) == ["s1.md"]
    os.replace(moved, layout.archive_file("s3"))  # what compaction does
    gone.unlink()  # what a person does
    assert watch.removed(layout) == ["s2.md"]
