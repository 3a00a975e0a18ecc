"""Approvals: who may press a card's buttons, and the timers that expire a card.

A press is checked twice: when it arrives (so the presser gets a private answer at
once) and again on the conversation's lane, right before it takes effect (it may have
been decided meanwhile). The decision itself is a transition of the turn
(`bot.turn.human_decision` / `expire`), carried out by the runner.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

from bot import turn as t
from bot.core.events import ApprovalResolved, ConvKey, Decision, Notice, User, Verdict
from bot.serve.access import Access
from bot.serve.permissions import Action, may
from bot.store import ApprovalRow
from bot.tools import parse_arguments
from bot.turn.conversation import Conversation
from bot.turn.runner import Runner

_PRESS = {Verdict.APPROVE: t.Press.APPROVE, Verdict.DENY: t.Press.DENY,
          Verdict.ALWAYS: t.Press.ALWAYS, Verdict.SESSION: t.Press.SESSION}


class Approvals:
    def __init__(self, runner: Runner, access: Access,
                 due: Callable[[ConvKey, str], None]) -> None:
        self.runner = runner
        self.store = runner.d.store
        self.access = access
        self._due = due
        """Called when a card's time is up (queues the expiry on the lane)."""
        self._timers: dict[str, asyncio.TimerHandle] = {}

    def may_decide(self, key: ConvKey, approval: ApprovalRow, user: User) -> bool:
        return may(self.access, user, Action.DECIDE, key, approval.requester)

    async def check(self, item: Decision) -> str | None:
        """Why this press cannot count (a private answer to the presser), or None."""
        approval = await self.store.approval(item.approval_id)
        if approval is None:
            return "This approval is unknown; nothing was run."
        row = await self.store.conversation(item.conv)
        if row.id != approval.conv_id:
            return "This approval belongs to another conversation; nothing was run."
        if not self.may_decide(item.conv, approval, item.user):
            return ("This approval is not yours: only the person who asked or an approver "
                    "can decide it.")
        if approval.status != "pending":
            return f"Already decided: {approval.status}."
        return None

    async def decide(self, conv: Conversation, item: Decision) -> bool:
        """Apply a press; True when the turn can go on."""
        approval = await self.store.approval(item.approval_id)
        if approval is not None and approval.status != "pending" \
                and approval.decided_by == item.user.id:
            return False  # this press again (a worker died before marking it done)
        refusal = await self.check(item)
        if refusal is not None:
            await self.runner.d.emit(Notice(conv.row.key, refusal, ephemeral_to=item.user))
            return False
        approval = await self.store.approval(item.approval_id)
        assert approval is not None
        self.disarm(approval.id)
        state = conv.turn
        if state is None:
            await self._resolve_stale(conv, approval.id)
            return False
        limits = self.runner.limits
        if time.time() >= approval.expires_at:
            step = t.expire(state, limits, approval.id)
        else:
            press = _PRESS[item.verdict]
            step = t.human_decision(state, limits, approval.id, press, item.user,
                                    self._rule_key(state, approval) if press in
                                    (t.Press.ALWAYS, t.Press.SESSION) else None)
        await self.runner.apply(conv, step)
        return conv.turn is not None

    async def expire(self, conv: Conversation, approval_id: str) -> bool:
        """A card's time is up; True when the turn can go on."""
        self._timers.pop(approval_id, None)
        approval = await self.store.approval(approval_id)
        if approval is None or approval.status != "pending":
            return False
        if conv.turn is None:
            await self._resolve_stale(conv, approval_id)
            return False
        await self.runner.apply(conv, t.expire(conv.turn, self.runner.limits, approval_id))
        return conv.turn is not None

    async def _resolve_stale(self, conv: Conversation, approval_id: str) -> None:
        """A card whose call no longer waits (its turn is over): close it."""
        if await self.store.decide(approval_id, "expired", None):
            await self.runner.d.emit(ApprovalResolved(conv.row.key, approval_id, "expired"))

    def _rule_key(self, state: t.TurnState, approval: ApprovalRow) -> str | None:
        record = state.record(approval.call_id)
        tool = self.runner.d.tools.get(approval.tool)
        if record is None or tool is None:
            return None
        return tool.rule_key(parse_arguments(record.call.arguments))

    # -- timers -----------------------------------------------------------------------

    def arm(self, key: ConvKey, approval: ApprovalRow) -> None:
        if approval.id in self._timers:
            return
        delay = max(0.0, approval.expires_at - time.time())
        self._timers[approval.id] = asyncio.get_running_loop().call_later(
            delay, self._due, key, approval.id)

    def disarm(self, approval_id: str) -> None:
        timer = self._timers.pop(approval_id, None)
        if timer is not None:
            timer.cancel()

    def close(self) -> None:
        for timer in self._timers.values():
            timer.cancel()
        self._timers.clear()
