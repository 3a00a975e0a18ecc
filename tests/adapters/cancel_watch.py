"""What the core emitted to an adapter, and when each model stream stopped: a recorder
the ⏹ Cancel tests of both platforms share."""

from __future__ import annotations

import time
from typing import Any, Protocol

from bot.core.events import Event, TurnEnded, TurnStarted
from tests.fakes.model_server import FakeModelServer, Reply

SLOW = "word " * 400  # streamed in 400 chunks 20 ms apart: 8 s, unless cancelled


class Emitting(Protocol):
    async def emit(self, event: Event) -> None: ...


def slow_reply() -> Reply:
    return Reply(text=SLOW, chunk_size=5, chunk_delay=0.02)


class Watch:
    """What the core emitted to the adapter, and when each model stream stopped."""

    def __init__(self, adapter: Emitting, model: FakeModelServer) -> None:
        self.events: list[tuple[float, Event]] = []
        self.stream_ends: list[float] = []
        """When each streamed model answer stopped being written (done, or cut)."""
        emit = adapter.emit

        async def recording(event: Event) -> None:
            self.events.append((time.monotonic(), event))
            await emit(event)

        adapter.emit = recording  # type: ignore[method-assign]  # the dispatch's sink
        stream = model._stream

        async def timed(*args: Any, **kwargs: Any) -> Any:
            try:
                return await stream(*args, **kwargs)
            finally:  # also when the client hung up and aiohttp cancelled the handler
                self.stream_ends.append(time.monotonic())

        model._stream = timed  # type: ignore[method-assign]

    def started(self) -> list[tuple[float, TurnStarted]]:
        return [(t, e) for t, e in self.events if isinstance(e, TurnStarted)]

    def ended(self) -> list[tuple[float, TurnEnded]]:
        return [(t, e) for t, e in self.events if isinstance(e, TurnEnded)]
