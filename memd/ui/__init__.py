"""The memory browser: see, search, forget and export a client's memory in a browser.

Served by `memd run` on loopback (`[ui]`), built on memd's socket API only, like the
proxy (import-linter checks it): the pages read through `browse.*`, `memory.recall`,
`memory.forget_preview`, `memory.forget` and `memory.export`. Login is a single-use
token from `memd ui`, then an HttpOnly SameSite=Strict cookie; docs/ui.md has the
security model. aiohttp and Jinja2 load only when it is used.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from memd import lazy_face

if TYPE_CHECKING:
    from memd.ui.cli import add_parsers, services, status_line
    from memd.ui.hook import UiService
    from memd.ui.service import UiServer
else:
    __getattr__ = lazy_face(__name__, __file__)
