"""Tandem with one platform, started as `tandem run` starts it, for the benchmarks."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

from bot.app import Dispatch, build
from bot.config import Config
from bot.hub import Hub
from bot.llm import ModelClient, warm


@asynccontextmanager
async def running(config: Config, model: ModelClient,
                  create: Callable[[Config, Hub, Dispatch], Any]) -> AsyncIterator[Hub]:
    """The hub and the platform `create` makes, started and recovered, the heap frozen
    (`warm`, as `tandem run` does once it is ready); all stopped on the way out."""
    hub, dispatch = build(config, model=model)
    await hub.d.store.open()
    adapter = create(config, hub, dispatch)
    try:
        await adapter.start()
        await hub.recover()
        warm()
        yield hub
        await hub.idle()
    finally:
        await adapter.stop()
        await hub.close()
        await hub.d.store.close()
