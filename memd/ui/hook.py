"""The memory browser's hook in `memd run`, which loads the browser only when it is on.

`UiService` is what the daemon holds (memd.proxy.hook.FrontEndHook: start, apply,
status, close). With `[ui] enabled` it listens (memd.ui.listener); the browser itself
(memd.ui.service: aiohttp, Jinja2) loads at the first connection.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from memd.config import Config
from memd.proxy.hook import FrontEndHook

if TYPE_CHECKING:
    from memd.ui.listener import LazyBrowser


class UiService(FrontEndHook["LazyBrowser"]):
    """The daemon's hook: the browser when `[ui] enabled`, else nothing."""

    name = "ui"
    server_module = "memd.ui.listener"  # light: the browser loads at first use

    def _enabled(self, config: Config) -> bool:
        return config.ui.enabled

    def _listen(self, config: Config) -> str:
        return config.ui.listen

    def _server(self, config: Config) -> LazyBrowser:
        from memd.ui.listener import LazyBrowser

        return LazyBrowser(config)

    async def apply(self, config: Config) -> None:
        """A reload: restart when `[ui]` or where memd lives changed; else nothing to do."""
        old, self.config = self.config, config
        if old is not None and (old.ui, old.socket, old.memory_dir) == (
            config.ui,
            config.socket,
            config.memory_dir,
        ):
            return
        await self.restart(config)
