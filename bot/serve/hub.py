"""The one entry point: every `Inbound` goes through `Hub.submit`.

The hub composes the pieces: intake (access, dedupe, author labels) decides what is
taken; the worker (`bot.serve.worker`) owns the lanes (order, batching, out-of-band cancel),
the approvals (who may press, timers) and the conversations in memory, and handles
each item on its conversation's lane; the runner alone changes turn, call and
approval state.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import time
from typing import Any, Protocol

from bot.core.events import (
    Aside,
    Cancel,
    ConvKey,
    Decision,
    Edit,
    Event,
    Inbound,
    Queued,
    UserMessage,
)
from bot.core.watch import Refused
from bot.media.receive import Receiver
from bot.serve import members, permissions
from bot.serve.access import Access
from bot.serve.intake import Intake, Receipt
from bot.serve.permissions import Action, may
from bot.serve.recovery import recover
from bot.serve.scheduler import Scheduler
from bot.serve.worker import LanesFactory, Worker
from bot.turn.runner import Deps, Runner

log = logging.getLogger(__name__)


class Sink(Protocol):
    async def emit(self, event: Event) -> None: ...


class Hub:
    def __init__(self, deps: Deps, access: Access, scheduler: Scheduler,
                 receiver: Receiver | None = None, lanes: LanesFactory | None = None) -> None:
        self.d = deps
        self.runner = Runner(deps)
        self.access = access
        self.scheduler = scheduler
        self.intake = Intake(deps.config, deps.store, access, receiver)
        self.worker = Worker(self.runner, self.intake, access, scheduler, lanes)
        self.lanes, self.convs = self.worker.lanes, self.worker.convs
        self.approvals = self.worker.approvals
        self.owners = members.Owners(deps.config, deps.store)  # whose conversation a press is

    # -- lifecycle --------------------------------------------------------------------

    async def recover(self) -> None:
        """After a start: repair unfinished turns once each, show and re-arm pending
        approvals, and process inbound that was recorded but never handled. With several
        workers there is nothing to do: work waits in the queue, and a dead worker's job
        is taken by another, which repairs its conversation as it loads it. A terminal
        on their database repairs a conversation only holding it (`HeldLanes`)."""
        if self.lanes.shared:
            return
        await recover(self.d.store, self.convs, self.approvals, self.d.emit, self.lanes.put,
                      held=self.lanes.fresh)

    async def close(self) -> None:
        """Stop every lane (running turns end as cancelled) and all timers."""
        self.approvals.close()
        await self.lanes.close()
        await self.d.watch.close()  # the audit log's last entries, before the store closes

    async def idle(self) -> None:
        await self.lanes.idle()

    def session_of(self, key: ConvKey) -> int | None:
        """The session of a conversation whose turn runs here (its ⏹ carries it)."""
        conv = self.convs.cached(key)
        return conv.row.session if conv is not None else None

    async def _session(self, key: ConvKey) -> int:
        conv = self.convs.cached(key)
        if conv is not None and not self.lanes.fresh:
            return conv.row.session
        return (await self.d.store.conversation(key)).session

    def running(self, key: ConvKey) -> bool:
        """A turn is running right now (a Cancel would stop it)."""
        return self.lanes.running(key)

    # -- the entry point --------------------------------------------------------------

    async def submit(self, item: Inbound) -> Receipt:
        """Take one inbound; returns at once (the work runs on the conversation's lane)."""
        if self.lanes.closing:
            return Receipt(False, "Tandem is shutting down.")
        if isinstance(item, Aside):  # anyone's group talk, kept as context, never answered
            return Receipt(await self.intake.talk.aside(item))
        if isinstance(item, Decision):
            item = await self.owners.of(item)
        receipt = await self.intake.accept(item)
        if not receipt.accepted and not receipt.duplicate:
            await self._refused(item, "access", receipt.note)
        if receipt.duplicate and self.lanes.shared and item.ref is not None \
                and await self.d.store.inbound_open(item.ref):
            # a worker died before queueing it: this copy is (one job, one turn per inbound)
            log.info("inbound %s was recorded but not processed; queueing it", item.ref)
            receipt = Receipt(True)
        if not receipt.accepted:
            return receipt
        if isinstance(item, Cancel):
            return await self.cancel(item)
        if isinstance(item, Decision) and (refusal := await self.approvals.check(item)):
            if item.ref is not None:  # settled: never replayed
                await self.d.store.mark_inbound_done([item.ref])
            await self._refused(item, "press", refusal)
            return Receipt(False, refusal)
        if isinstance(item, Edit) and await self.intake.talk.edited(item):
            return receipt  # nothing for the conversation's lane to do
        if isinstance(item, UserMessage):
            item = await self._message(item)
        await self.lanes.submit(item.conv, item)
        return Receipt(True)

    async def _message(self, item: UserMessage) -> UserMessage:
        """Kept as said, stamped with when it came (`Worker._messages`), 👀 if it waits."""
        await self.intake.talk.said(item)
        if self.lanes.running(item.conv):
            await self.d.emit(Queued(item.conv, item.ref))
        return dataclasses.replace(item, received_at=time.time())

    async def cancel(self, item: Cancel) -> Receipt:
        """Out of band: the running turn (the button's own) stops at its next checkpoint,
        on whichever worker runs it."""
        item = await self.owners.of(item)
        if (refusal := self.access.check(item)) is not None:
            await self._refused(item, "access", refusal)
            return Receipt(False, refusal)
        owner = await self._running_for(item.conv)  # None: nothing to stop, for anyone
        if owner is not None and not may(self.access, item.user, Action.STOP, item.conv,
                                         owner):
            await self._refused(item, "stop", permissions.refusal(Action.STOP))
            return Receipt(False, permissions.refusal(Action.STOP))
        if item.session is not None and item.session != await self._session(item.conv):
            return Receipt(False, "That turn is already over.")  # a button from before /new
        if await self.lanes.cancel_anywhere(item.conv, item.turn):
            return Receipt(True, "Cancelling…")
        self.lanes.put(item.conv, item)  # a turn waiting for a human, or nothing at all
        return Receipt(True)

    async def _running_for(self, key: ConvKey) -> str | None:
        """Whose turn runs or waits in `key` (None: no turn; anyone may stop nothing)."""
        conv = self.convs.cached(key)
        if conv is not None and not self.lanes.shared:
            return conv.turn.requester if conv.turn is not None else \
                self.lanes.preparing(key)
        row = await self.d.store.conversation(key)
        turn = await self.d.store.last_turn(row.id, row.session)
        return turn.requester if turn is not None and turn.status != "done" else None

    async def _refused(self, item: Inbound, what: str, why: str | None) -> None:
        user = getattr(item, "user", None)
        await self.d.watch.see(Refused(item.conv.platform, user.id if user else "", what,
                                       why or "", item.conv))

    # -- where cards are (any worker may resolve an approval) -----------------------------

    async def remember_card(self, approval_id: str, where: dict[str, Any]) -> None:
        """Keep where the approval's card was posted (platform-specific fields)."""
        await self.d.store.set_card(approval_id, json.dumps(where))

    async def card_of(self, approval_id: str) -> dict[str, Any] | None:
        """Where the approval's card was posted, as `remember_card` was told."""
        raw = await self.d.store.card(approval_id)
        try:
            found = json.loads(raw) if raw else None
        except ValueError:
            return None
        return found if isinstance(found, dict) else None

    async def remember_live(self, key: ConvKey, turn: int, where: dict[str, Any]) -> None:
        """Keep where a turn's live message was posted (platform-specific fields), so that
        a process that shows the turn's end after this one died finishes that message."""
        conv = self.convs.cached(key)
        row = conv.row if conv is not None else await self.d.store.conversation(key)
        await self.d.store.set_live(row.id, row.session, turn, json.dumps(where))

    async def heard_in(self, key: ConvKey) -> bool:
        """Tandem was addressed in this conversation (by any worker, at any time)."""
        return await self.d.store.heard_in(key)

    def deliver(self, item: Inbound) -> None:
        """Queue an inbound whose id is already recorded (scheduled runs)."""
        self.lanes.put(item.conv, item)
