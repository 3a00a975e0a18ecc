"""Tools from Model Context Protocol servers (`mcp.servers.<name>` in the config).

`Servers.start` connects every enabled server in the background (start-up does not wait,
and the SDK itself is imported off the event loop), and each server's tools join the
registry as a group of their own (`bot.tools.Registry.set_group`), in a stable order.
They pass the same gate as Tandem's own tools: policy, cards, "always" rules, breakers,
cancel, redaction and the taint rule (`bot.tools.mcp.tools`).

Part of `bot.tools`: it may import the rest of `bot.tools` and the layers below it.
"""

from __future__ import annotations

import asyncio
import importlib
import logging

from bot.core.config import McpConfig
from bot.tools import Registry, Tool
from bot.tools.mcp.connection import Connection

log = logging.getLogger(__name__)

SDK_MODULES = ("mcp", "mcp.client.stdio", "mcp.client.streamable_http", "httpx2")
SETTLE_S = 0.5
"""The SDK takes about a second to import: the platforms' first polls go first."""


class Servers:
    def __init__(self, config: McpConfig, registry: Registry) -> None:
        self.registry = registry
        self.connections = {name: Connection(name, server, self._publish)
                            for name, server in sorted(config.servers.items())
                            if server.enabled}
        self._starting: asyncio.Task[None] | None = None

    def start(self) -> None:
        """Connect every server in the background."""
        if self.connections and self._starting is None:
            self._starting = asyncio.create_task(self._start(), name="mcp:start")

    async def _start(self) -> None:
        await asyncio.sleep(SETTLE_S)
        await asyncio.to_thread(_import_sdk)
        for connection in self.connections.values():
            connection.start()

    async def ready(self) -> bool:
        """Wait until every server has tried once; True when all are connected."""
        if self._starting is not None:
            await self._starting
        results = await asyncio.gather(*(c.ready() for c in self.connections.values()))
        return all(results)

    async def close(self) -> None:
        if self._starting is not None:
            self._starting.cancel()
            await asyncio.gather(self._starting, return_exceptions=True)
        await asyncio.gather(*(c.close() for c in self.connections.values()))

    def status(self) -> list[str]:
        """One line per server, for `/status`."""
        return [c.status() for c in self.connections.values()]

    def _publish(self, server: str, tools: list[Tool]) -> None:
        self.registry.set_group(f"mcp:{server}", tools)


def _import_sdk() -> None:
    for name in SDK_MODULES:
        importlib.import_module(name)


__all__ = ["Servers"]
