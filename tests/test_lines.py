"""memd.markdown.lines: recall's lazy line reader must agree with str.splitlines() exactly, or the
line numbers memsearch indexed would point at the wrong lines."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from memd.markdown.lines import FileLines, read_lines

# bytes that exercise the edges: newlines, the other line breaks, broken UTF-8
PIECES = [
    b"\n",
    b"\r",
    b"\r\n",
    b"\x0b",
    b"\x0c",
    b"\x1e",
    "\u2028".encode(),
    "\u2029".encode(),
    "\x85".encode(),
    b"\xe2\x80",
    b"\xff",
    "é".encode(),
    b"## heading",
    b"text ",
    b"",
]


def expected(data: bytes) -> list[str]:
    return data.decode("utf-8", "replace").splitlines()


@settings(max_examples=400, deadline=None)
@given(st.lists(st.one_of(st.sampled_from(PIECES), st.binary(max_size=8)), max_size=40))
def test_read_lines_equals_splitlines(
    tmp_path_factory: pytest.TempPathFactory, pieces: list[bytes]
) -> None:
    data = b"".join(pieces)
    path = tmp_path_factory.mktemp("lines") / "f.md"
    path.write_bytes(data)
    lines = read_lines(path)
    want = expected(data)
    assert len(lines) == len(want)
    assert [lines[i] for i in range(len(lines))] == want
    assert [lines[-i] for i in range(1, len(lines) + 1)] == [
        want[-i] for i in range(1, len(want) + 1)
    ]


@settings(max_examples=300, deadline=None)
@given(
    st.lists(st.sampled_from([b"\n", b"a", "é".encode(), b"\xff", b"## h", b" "]), max_size=40),
    st.integers(-45, 45),
    st.integers(-45, 45),
    st.sampled_from([None, 1, 2, -1]),
)
def test_slices_equal_list_slices(
    pieces: list[bytes], start: int, stop: int, step: int | None
) -> None:
    data = b"".join(pieces)
    lines = FileLines(data)  # "\n" is the only break here: the lazy path
    assert list(lines) == expected(data)
    assert lines[start:stop:step] == expected(data)[start:stop:step]


def test_out_of_range_index_raises(tmp_path: Path) -> None:
    lines = FileLines(b"one\ntwo\n")
    assert (len(lines), lines[1], lines[-2]) == (2, "two", "one")
    with pytest.raises(IndexError):
        lines[2]
    with pytest.raises(IndexError):
        lines[-3]


def test_transcript_takes_the_lazy_path(tmp_path: Path) -> None:
    """A transcript whose only line break is "\\n" (the usual case) is never split."""
    path = tmp_path / "t.md"
    path.write_bytes(("## 2026-11-30 10:00 · exchange 1 — café\n\n**User:** hi\n" * 3).encode())
    lines = read_lines(path)
    assert isinstance(lines, FileLines)
    assert lines[0].endswith("café") and len(lines) == 9
