"""A running turn's cancel signal: a person's ⏹ or `/stop`, or Tandem shutting down.

The runner looks at it at fixed checkpoints. A person's cancel ends the turn as
cancelled; a shutdown only stops the work under way, and a turn that is pausing for an
approval stays paused (it is shown again at the next start).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import TypeVar

T = TypeVar("T")


class CancelSignal(asyncio.Event):
    def __init__(self) -> None:
        super().__init__()
        self.shutdown = False
        """Set by a shutdown rather than by a person."""

    def stop_for_shutdown(self) -> None:
        self.shutdown = True
        self.set()

    @property
    def by_person(self) -> bool:
        return self.is_set() and not self.shutdown


async def unless_cancelled(work: Awaitable[T], cancel: asyncio.Event | None) -> T | None:
    """`work`'s result, or None when `cancel` is set first (the work is then cancelled)."""
    task = asyncio.ensure_future(work)
    if cancel is None:
        return await task
    waiter = asyncio.ensure_future(cancel.wait())
    try:
        await asyncio.wait({task, waiter}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        waiter.cancel()
        if not task.done():
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
    return None if task.cancelled() else task.result()
