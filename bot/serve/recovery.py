"""After a stop: load and repair conversations, show pending approvals, replay inbound.

A conversation is loaded from the store with its history, its breaker ledger and
its summary. If its last turn never ended, the `restart` transition decides what
becomes of it: a turn waiting for a human stays suspended, a call that was handed to
its tool is interrupted, and the chat is told in words. Inbound messages and
scheduled runs are recorded before they are processed; one that never reached its
turn is rebuilt from its record and processed at the next start.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bot import turn as t
from bot.core.events import ApprovalRequested, ConvKey, Event, Inbound, TurnEnded, User
from bot.core.history import CallState
from bot.serve.approvals import Approvals
from bot.serve.intake import replay
from bot.store import CallRow, Store
from bot.turn.breakers import Ledger
from bot.turn.conversation import Conversation
from bot.turn.conversations import Conversations
from bot.turn.runner import RAN, Runner

log = logging.getLogger(__name__)
LEDGER_REPLAY = 200
"""Finished calls read back to rebuild the breaker ledger of a session."""


@dataclass(frozen=True, slots=True)
class Resume:
    """A turn a restart found ready to go on (its human had already decided)."""

    conv: ConvKey


async def recover(store: Store, convs: Conversations, approvals: Approvals,
                  emit: Callable[[Event], Awaitable[None]],
                  put: Callable[[ConvKey, Inbound | Resume], None], *,
                  held: bool = False) -> None:
    """Repair each unfinished turn once; show pending cards again (a terminal has no card
    that stays on screen) and re-arm their timers; replay inbound never handled. One
    that this process took already too is queued twice, and starts one turn: the store
    begins a turn only for inbound still open. With `held` lanes (another process may be
    running that turn now) a conversation is loaded, and repaired, only on its lane,
    holding it: its running turn is unfinished only once its process let go."""
    for open_turn in await store.open_turns():
        row = await store.conversation_by_id(open_turn.conv_id)
        if row is None or row.session != open_turn.session:
            continue
        if held:
            put(row.key, Resume(row.key))
            continue
        conv = await convs.get(row.key)
        if conv.turn is not None and not conv.turn.waiting:
            put(row.key, Resume(row.key))
    for approval in await store.pending_approvals():
        row = await store.conversation_by_id(approval.conv_id)
        if row is not None:
            approvals.arm(row.key, approval)
            await emit(ApprovalRequested(row.key, approval.id, approval.tool, approval.summary,
                                         User(approval.requester), approval.remaining_s(),
                                         reminder=True))
    for ref, kind, payload in await store.unprocessed_inbound():
        item = replay(kind, payload, ref)
        if item is not None:
            put(item.conv, item)


async def load_conversation(store: Store, runner: Runner, key: ConvKey) -> Conversation:
    row = await store.conversation(key)
    conv = Conversation.load(row, await store.history(row.id, row.session))
    limits = runner.limits
    finished = await store.finished_calls(row.id, row.session, LEDGER_REPLAY)
    conv.ledger = Ledger.replay(limits.ledger_size, [
        (c.call.name, c.call.arguments, c.outcome) for c in finished if c.outcome])
    conv.unread = {c.call.id for c in finished if c.outcome and c.outcome not in RAN}
    summary = await store.summary(row.id, row.session)
    if summary is not None:
        conv.summary_through, conv.summary = summary
        conv.skip_summarized()
        conv.release(summarized_only=True)  # what the summary covers stays in the store
    last = await store.last_turn(row.id, row.session)
    if last is not None and last.status == "done" and last.unshown is not None:
        log.info("showing the end of turn %d of %s (stored, never shown)", last.turn, key)
        await runner.show_end(row, TurnEnded(key, last.turn, last.unshown,
                                             last.reason or "completed", _live(last.live)))
    if last is not None and last.status != "done":
        calls = await store.turn_calls(row.id, row.session, last.turn)
        state = t.TurnState(
            turn=last.turn, steps=last.steps, max_steps=runner.d.config.limits.max_steps,
            calls=tuple([t.CallRecord(call=c.call, state=c.state, outcome=c.outcome,
                                      approval_id=await _approval_id(store, conv, c))
                         for c in calls]),
            unattended=last.unattended, requester=last.requester, ledger=conv.ledger)
        conv.turn = state
        log.info("repairing turn %d of %s (%s)", last.turn, key, last.status)
        await runner.apply(conv, t.restart(state, limits, was_running=last.status == "running"))
    pictures = [Path(m.file) for msg in conv.history for m in msg.media
                if m.seen and m.kind == "image"]
    if pictures:  # decoded off the event loop now, not while the next request is built
        from bot.core.images import warm

        await asyncio.to_thread(warm, pictures)
    return conv  # trimmed when its next turn begins (that needs the model's window)


async def _approval_id(store: Store, conv: Conversation, call: CallRow) -> str | None:
    if call.state is not CallState.ASKING:
        return None
    approval = await store.approval_for_call(conv.row.id, conv.row.session, call.call.id)
    return approval.id if approval is not None and approval.status == "pending" else None


def _live(raw: str | None) -> dict[str, Any] | None:
    try:
        found = json.loads(raw) if raw else None
    except ValueError:
        return None
    return found if isinstance(found, dict) else None
