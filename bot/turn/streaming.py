"""One model call of a turn, streamed: the text as it comes, cancel at fixed points.

Cancel is checked every `CANCEL_EVERY_CHUNKS` chunks and, out of band, while waiting
for the next one; a cancelled call returns None. Each call is told to the watchers
(`ModelCalled`: latency, tokens, cost, success).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from bot.core.errors import ModelError
from bot.core.history import Msg
from bot.core.watch import ModelCalled, Watch
from bot.llm import Completion, Delta, ModelClient, Restart
from bot.llm.failover import Unavailable
from bot.store import Usage
from bot.turn.prompt import Request

CANCEL_EVERY_CHUNKS = 8


@dataclass(slots=True)
class Scratch:
    """Per-drive display state: what has streamed, not what decides anything."""

    started: float
    text: str = ""
    answer: str = ""
    partial: Msg | None = None
    """A cancelled stream's text, stored as the turn ends."""
    final: tuple[Msg, tuple[int, Usage | None]] | None = None
    """The model's answer (a step without tool calls), stored as the turn ends."""
    model: str = ""
    """The model that answered the last call."""
    unavailable: list[Unavailable] = field(default_factory=list)
    """Models skipped or failed before another answered, this turn."""


async def complete(model: ModelClient, request: Request, tools: list[dict[str, Any]],
                   cancel: asyncio.Event, scratch: Scratch,
                   streamed: Callable[[], Awaitable[None]], watch: Watch,
                   name: str) -> Completion | None:
    """The model's completion of `request`, or None when cancelled first; `streamed` is
    awaited after each piece of text."""
    started = time.monotonic()
    task = asyncio.ensure_future(_consume(model, request, tools, scratch, cancel, streamed))
    waiter = asyncio.ensure_future(cancel.wait())
    try:
        await asyncio.wait({task, waiter}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        waiter.cancel()
    if not task.done():
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        return None
    try:
        completion = task.result()
    except ModelError:
        await watch.see(ModelCalled(name, time.monotonic() - started, 0, 0, 0.0, False))
        raise
    if completion is not None:
        scratch.model = completion.model or name
        scratch.unavailable += completion.unavailable
        await watch.see(ModelCalled(scratch.model, time.monotonic() - started,
                                    completion.prompt_tokens or 0,
                                    completion.completion_tokens or 0,
                                    completion.cost or 0.0, True,
                                    completion.cache_read, completion.cache_write))
    return completion


async def _consume(model: ModelClient, request: Request, tools: list[dict[str, Any]],
                   scratch: Scratch, cancel: asyncio.Event,
                   streamed: Callable[[], Awaitable[None]]) -> Completion | None:
    chunks = 0
    stream = model.stream(request.messages, tools)
    async with contextlib.aclosing(stream):
        async for item in stream:
            match item:
                case Delta(text):
                    chunks += 1
                    if chunks % CANCEL_EVERY_CHUNKS == 0 and cancel.is_set():
                        return None
                    if text:
                        scratch.text += text
                        await streamed()
                case Restart():
                    scratch.text = ""
                case Completion():
                    return item
    raise ModelError("the model stream ended without a completion")
