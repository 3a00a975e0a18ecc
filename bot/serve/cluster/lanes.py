"""Lanes across workers: the same interface as `bot.serve.lanes.Lanes`, backed by the cluster's
task queue. `put` queues a job locked on the conversation (the queue keeps one
conversation's jobs in order, one at a time, on whichever worker takes them); the turn
that runs here is announced to the others, so a Cancel received by any worker reaches
it. Work that must wait (a scheduled run while a human decides) comes back a little
later as a job of its own rather than waiting in this worker's memory.

`HeldLanes` are for a process beside the workers that is not one of them (`tandem
chat`): its own lanes, each item handled holding its conversation (`cluster.hold`).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from contextlib import AbstractAsyncContextManager
from dataclasses import asdict
from typing import Any, Generic, TypeVar

from bot.core.events import ConvKey, Decision, Trigger, UserMessage
from bot.serve.cluster import Cluster, conv_of, hold
from bot.serve.intake import replay
from bot.serve.lanes import Lanes
from bot.store import Store
from bot.turn.cancel import CancelSignal

log = logging.getLogger(__name__)
W = TypeVar("W")
PARKED_AGAIN_S = 5.0
"""A parked item is offered again after this long."""
EARLY_CANCEL_S = 5.0
"""A Cancel that came before its turn began here counts this long."""


class ClusterLanes(Lanes[W], Generic[W]):
    shared = True
    fresh = True

    def __init__(self, handle: Callable[[ConvKey, list[W]], Awaitable[None]],
                 cluster: Cluster, store: Store) -> None:
        super().__init__(handle)
        self.cluster = cluster
        self.store = store
        cluster.handle = self._job
        cluster.on_signal = self._on_signal
        cluster.on_sweep = self._requeue_lost
        self._remote: dict[ConvKey, int] = {}
        """Turns running on other workers, as they announced them."""
        self._here: dict[ConvKey, int] = {}
        """Jobs running on this worker, per conversation."""
        self._early: dict[ConvKey, int | None] = {}
        """A Cancel for a job running here whose turn had not begun yet (its number)."""
        self._deferring: set[asyncio.Task[None]] = set()
        self._jobs: set[asyncio.Future[Any]] = set()

    # -- queueing -------------------------------------------------------------------------

    def put(self, key: ConvKey, item: W) -> None:
        if self.closing:
            return
        self._later(self.cluster.defer(item))

    async def submit(self, key: ConvKey, item: W) -> None:
        """Queue `item` before returning (inbound keeps its platform's order). Inbound of
        this conversation recorded before it and not processed yet goes first: a worker
        that recorded it may have died before queueing it (the queue keeps one waiting
        job per inbound, and drops a copy of one processed meanwhile)."""
        if self.closing:
            return
        ref = getattr(item, "ref", None)
        if isinstance(item, UserMessage | Trigger | Decision) and ref is not None:
            for earlier, kind, payload in await self.store.open_inbound(key):
                if earlier == ref:
                    break
                if (again := replay(kind, payload, earlier)) is not None:
                    await self.cluster.defer(again)
        await self.cluster.defer(item)

    def park(self, key: ConvKey, item: W) -> None:
        self._later(self.cluster.defer(item, at=time.time() + PARKED_AGAIN_S))

    def unpark(self, key: ConvKey) -> None:
        """Nothing is held here: parked work is queued again on its own."""

    def expire_at(self, item: W, at: float) -> None:
        """Queue an approval's expiry for its time (it survives this worker)."""
        self._later(self.cluster.defer(item, at=at))

    def _later(self, defer: Awaitable[None]) -> None:
        async def run() -> None:
            try:
                await defer
            except Exception:
                log.error("cluster: could not queue work", exc_info=True)

        task = asyncio.get_running_loop().create_task(run())
        self._deferring.add(task)
        task.add_done_callback(self._deferring.discard)

    async def _requeue_lost(self) -> None:
        """Inbound that a worker recorded and died before queueing is queued now (the
        store starts at most one turn for it, so a copy that was queued is harmless)."""
        for ref, kind, payload in await self.store.unprocessed_inbound():
            if await self.cluster.queued(ref):
                continue
            item = replay(kind, payload, ref)
            if item is not None:
                log.warning("cluster: inbound %s was never queued; queueing it", ref)
                await self.cluster.defer(item)

    async def _job(self, item: Any) -> None:
        key: ConvKey = item.conv
        if self.closing:  # this worker stops: another one takes it
            await self.cluster.defer(item)
            return
        self._here[key] = self._here.get(key, 0) + 1
        job = asyncio.ensure_future(self._handle(key, [item]))
        self._jobs.add(job)
        try:
            await asyncio.shield(job)
        finally:
            self._jobs.discard(job)
            self._here[key] -= 1
            if not self._here[key]:
                del self._here[key]
                lane = self._lanes.get(key)
                if lane is not None and lane.cancel is None:
                    del self._lanes[key]

    # -- the running turn ---------------------------------------------------------------

    def begin(self, key: ConvKey, turn: int | None, owner: str | None = None) -> CancelSignal:
        event = super().begin(key, turn, owner)
        if self._early.get(key, -1) in (None, turn):  # its Cancel came while it loaded
            del self._early[key]
            event.set()
        self.cluster.signal({"kind": "running", "conv": asdict(key), "turn": turn})
        return event

    def end(self, key: ConvKey) -> None:
        super().end(key)
        self.cluster.signal({"kind": "ended", "conv": asdict(key)})

    async def cancel_anywhere(self, key: ConvKey, turn: int | None) -> bool:
        """Here, or on the worker that runs it: the store says which turn runs (a worker
        that started after the turn began never heard it announced)."""
        if self.cancel(key, turn):
            return True
        if turn is None and self._remote.get(key) == 0:  # being prepared on another worker
            self.cluster.signal({"kind": "cancel", "conv": asdict(key), "turn": None})
            return True
        row = await self.store.conversation(key)
        last = await self.store.last_turn(row.id, row.session)
        if last is None or last.status != "running" or turn not in (None, last.turn):
            return False
        self.cluster.signal({"kind": "cancel", "conv": asdict(key), "turn": last.turn})
        return True

    def _on_signal(self, message: dict[str, Any]) -> None:
        key = conv_of(message)
        if key is None:
            return
        match message.get("kind"):
            case "running":
                self._remote[key] = int(message.get("turn") or 0)
            case "ended":
                self._remote.pop(key, None)
            case "cancel":
                turn = message.get("turn")
                if not self.cancel(key, turn) and key in self._here:
                    self._early[key] = turn  # its job runs here, the turn not yet
                    asyncio.get_running_loop().call_later(
                        EARLY_CANCEL_S, lambda: self._early.pop(key, None))

    async def queue_stats(self) -> tuple[int, int]:
        return await self.cluster.stats()

    def running(self, key: ConvKey) -> bool:
        return super().running(key) or key in self._remote

    def busy(self, key: ConvKey) -> bool:
        return key in self._here

    # -- lifecycle ----------------------------------------------------------------------

    async def idle(self) -> None:
        while self._deferring or self._jobs:
            await asyncio.wait([*self._deferring, *self._jobs])

    async def close(self) -> None:
        """Stop taking work; turns running here are cancelled and waited for (10 s)."""
        self.closing = True
        for lane in self._lanes.values():
            if lane.cancel is not None:
                lane.cancel.stop_for_shutdown()
        pending = [*self._deferring, *self._jobs]
        if pending:
            await asyncio.wait(pending, timeout=10)


class HeldLanes(Lanes[W], Generic[W]):
    """Lanes of one process on a database other processes use too, without being one of
    the workers (a terminal: its work is its own, not the queue's). Each item is handled
    holding its conversation's advisory lock, and reads the conversation fresh: two
    terminals in one conversation answer one message at a time, each in the light of
    the other's, rather than both beginning the same turn."""

    fresh = True

    def __init__(self, handle: Callable[[ConvKey, list[W]], Awaitable[None]],
                 url: str) -> None:
        super().__init__(handle)
        self.url = url

    def hold(self, key: ConvKey,
             waiting: Callable[[], Awaitable[None]]) -> AbstractAsyncContextManager[object]:
        return hold(self.url, key, waiting)
