"""Tandem with one platform, started as `tandem run` starts it, for the benchmarks."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from bot.core.config import Config
from bot.llm import ModelClient, warm
from bot.run.app import Dispatch, build
from bot.serve.hub import Hub


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


def run_config(tmp: str, telegram: Any, model: Any, **extra: Any) -> Path:
    """A config file for `tandem run` with Telegram against the fakes (`extra`: more
    top-level sections, e.g. `mcp`), in `tmp`."""
    repo = Path(__file__).resolve().parent.parent
    config = Path(tmp) / "config.yaml"
    config.write_text(json.dumps({
        "llm": {"model": "openai/fake", "api_base": model.api_base, "api_key": "x"},
        "store": {"path": f"{tmp}/t.db"}, "persona": {"dir": str(repo / "persona")},
        "workspace": {"dir": f"{tmp}/ws"},
        "telegram": {"enabled": True, "token": telegram.token,
                     "base_url": f"{telegram.url}/bot", "allowed_users": [42]},
        **extra}))
    return config
