"""Lanes: one conversation's work in order, different conversations concurrently.

A lane is a queue drained by one task that exists only while there is work. Messages
that pile up behind a running turn are handed over together, as one batch. Cancel is
out of band: it sets the running turn's event at once, without queueing behind it,
and only for the turn its button belongs to. Work that must wait for the current
turn to end (a scheduled run while a human decides) is parked and comes back then.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import deque
from collections.abc import Awaitable, Callable
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, field
from typing import Generic, TypeVar

from bot.core.events import ConvKey, Edit, UserMessage
from bot.turn.cancel import CancelSignal

log = logging.getLogger(__name__)
W = TypeVar("W")


@dataclass(slots=True)
class _Lane(Generic[W]):
    inbox: deque[W] = field(default_factory=deque)
    parked: list[W] = field(default_factory=list)
    task: asyncio.Task[None] | None = None
    cancel: CancelSignal | None = None
    """Set while a turn runs; setting it cancels that turn."""
    turn: int | None = None
    """The number of the turn that runs now (None while one is being prepared)."""
    owner: str | None = None
    """Who asked for the turn being prepared (whose `/stop` counts before it begins)."""


class Lanes(Generic[W]):
    shared = False
    """True for lanes that span several workers (`bot.serve.cluster.lanes`)."""
    fresh = False
    """True where other processes change these conversations too: each item reads its
    conversation from the store, not from memory."""

    def __init__(self, handle: Callable[[ConvKey, list[W]], Awaitable[None]]) -> None:
        self._handle = handle
        self._lanes: dict[ConvKey, _Lane[W]] = {}
        self.closing = False

    def put(self, key: ConvKey, item: W) -> None:
        if self.closing:
            return
        lane = self._lanes.setdefault(key, _Lane())
        lane.inbox.append(item)
        if lane.task is None:
            lane.task = asyncio.get_running_loop().create_task(self._drain(key, lane))

    async def submit(self, key: ConvKey, item: W) -> None:
        """`put`, for callers that may wait until the item is queued."""
        self.put(key, item)

    def expire_at(self, item: W, at: float) -> None:
        """An approval's expiry that must outlive this process (the timers serve here)."""

    def take_messages(self, key: ConvKey) -> list[W]:
        """The messages (and edits of them) waiting at the front of the conversation's
        lane, taken out for its running turn (`busy: steer`). Lanes across workers keep
        none here: their messages wait for the next turn."""
        lane = self._lanes.get(key)
        taken: list[W] = []
        while lane is not None and lane.inbox and isinstance(lane.inbox[0], UserMessage | Edit):
            taken.append(lane.inbox.popleft())
        return taken

    def park(self, key: ConvKey, item: W) -> None:
        """Keep `item` until the conversation's current turn is over (`unpark`)."""
        self._lanes.setdefault(key, _Lane()).parked.append(item)

    def unpark(self, key: ConvKey) -> None:
        lane = self._lanes.get(key)
        if lane is not None and lane.parked:
            lane.inbox.extendleft(reversed(lane.parked))
            lane.parked.clear()

    async def _drain(self, key: ConvKey, lane: _Lane[W]) -> None:
        try:
            while lane.inbox:
                batch = [lane.inbox.popleft()]
                if isinstance(batch[0], UserMessage | Edit):  # an edit goes with its message
                    while lane.inbox and isinstance(lane.inbox[0], UserMessage | Edit):
                        batch.append(lane.inbox.popleft())
                await self._handle(key, batch)
        finally:
            lane.task = None
            if not lane.inbox and not lane.parked:
                self._lanes.pop(key, None)

    def hold(self, key: ConvKey,
             waiting: Callable[[], Awaitable[None]]) -> AbstractAsyncContextManager[object]:
        """Keep other processes off `key` while one item of it is handled (`waiting` is
        called first if that means waiting for one). In one process the lane is enough."""
        return contextlib.nullcontext()

    # -- the running turn -------------------------------------------------------------

    def begin(self, key: ConvKey, turn: int | None, owner: str | None = None) -> CancelSignal:
        """The cancel signal of the turn `turn`, or of one being prepared (None: its
        downloads, transcription, summary call). A turn that was being prepared keeps
        the signal, so a `/stop` sent meanwhile stops it."""
        lane = self._lanes.setdefault(key, _Lane())
        if lane.cancel is None:
            lane.cancel, lane.owner = CancelSignal(), owner
        lane.turn = turn
        return lane.cancel

    def end(self, key: ConvKey) -> None:
        lane = self._lanes.get(key)
        if lane is not None:
            lane.cancel = lane.turn = lane.owner = None

    def cancel(self, key: ConvKey, turn: int | None) -> bool:
        """Cancel the running turn (only `turn`, when given); False if none matched."""
        lane = self._lanes.get(key)
        if lane is None or lane.cancel is None or turn not in (None, lane.turn):
            return False
        lane.cancel.set()
        return True

    async def cancel_anywhere(self, key: ConvKey, turn: int | None) -> bool:
        """`cancel`, wherever the turn runs (in one process: here)."""
        return self.cancel(key, turn)

    async def queue_stats(self) -> tuple[int, int]:
        """(workers alive, items waiting or running) across the workers sharing the work."""
        return 1, sum(len(lane.inbox) + (lane.task is not None) for lane in self._lanes.values())

    def preparing(self, key: ConvKey) -> str | None:
        """Who asked for the turn being prepared here now (None: none is)."""
        lane = self._lanes.get(key)
        return lane.owner if lane is not None and lane.cancel is not None else None

    def running(self, key: ConvKey) -> bool:
        lane = self._lanes.get(key)
        return lane is not None and lane.cancel is not None

    def busy(self, key: ConvKey) -> bool:
        lane = self._lanes.get(key)
        return lane is not None and lane.task is not None

    # -- lifecycle --------------------------------------------------------------------

    async def idle(self) -> None:
        """Wait until no lane has work (tests and the scriptable console use this)."""
        while tasks := [lane.task for lane in self._lanes.values() if lane.task is not None]:
            await asyncio.wait(tasks)

    async def close(self) -> None:
        """Stop taking work; running turns are cancelled and waited for (10 s at most)."""
        self.closing = True
        tasks = []
        for lane in self._lanes.values():
            lane.inbox.clear()
            lane.parked.clear()
            if lane.cancel is not None:
                lane.cancel.stop_for_shutdown()
            if lane.task is not None:
                tasks.append(lane.task)
        if tasks:
            await asyncio.wait(tasks, timeout=10)
