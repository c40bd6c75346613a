"""Progress of long CLI work: a bar on a terminal, one plain line per step otherwise.

For commands that make one daemon call per item (`sessions recompact`, `forget`,
`export`, …):

    with Progress(len(items), "recompacting") as progress:
        for item in items:
            ...
            progress.step(f"{item}: done")

On a terminal (stderr is a tty) the bar is tqdm's on stderr and each step's message is
printed above it; piped or redirected, each step is a line `[3/10] message` on stdout,
so logs and `grep` see the same text. `quiet=True` (for `--json`) keeps stdout for the
JSON and shows only the bar, if any.
"""

from __future__ import annotations

import sys
from types import TracebackType
from typing import TYPE_CHECKING, TextIO

if TYPE_CHECKING:
    from tqdm import tqdm


class Progress:
    """Counts `total` steps of one job; see the module docstring."""

    def __init__(
        self,
        total: int,
        label: str,
        *,
        quiet: bool = False,
        out: TextIO | None = None,
        bar_stream: TextIO | None = None,
    ) -> None:
        self.total = total
        self.done = 0
        self.quiet = quiet
        self.out = out or sys.stdout
        stream = bar_stream or sys.stderr
        self._bar: tqdm | None = None
        if total > 0 and _is_terminal(stream):
            from tqdm import tqdm  # here: `memd run` imports this module and never draws a bar

            self._bar = tqdm(
                total=total, desc=label, file=stream, unit="", leave=False, dynamic_ncols=True
            )

    def step(self, message: str = "") -> None:
        """One step finished; `message` says how it went."""
        self.done += 1
        if self._bar is not None:
            if message and not self.quiet:
                self._bar.write(message, file=self.out)
            self._bar.update(1)
        elif not self.quiet:
            print(f"[{self.done}/{self.total}] {message}".rstrip(), file=self.out, flush=True)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None

    def __enter__(self) -> Progress:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()


def _is_terminal(stream: TextIO) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False
