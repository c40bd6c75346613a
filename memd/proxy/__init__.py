"""`memd proxy`: an OpenAI- and Anthropic-compatible gateway on loopback, built on memd's
socket API only.

Apps point their OpenAI or Anthropic base URL here (Chat Completions, Responses,
Messages) and send a memd-issued key; the proxy forwards to the configured upstream,
records each completed exchange through `memory.record_chat` (one shape for every API),
and runs the `_memory` recall tool in the loop through `memory.tools` and
`memory.call_tool`. It imports no memd service (import-linter checks it): only config,
errors, logs and layout. The server (aiohttp) loads only when it is used.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from memd import lazy_face

if TYPE_CHECKING:
    from memd.proxy.cli import add_parsers
    from memd.proxy.hook import ProxyService
    from memd.proxy.service import ProxyServer
else:
    __getattr__ = lazy_face(__name__, __file__)
