"""The one entry point: every `Inbound` goes through `Hub.submit`.

Work for one conversation is serialized on a lane (a queue drained by one task that
exists only while there is work); different conversations run concurrently. `Cancel`
is handled out of band: it sets the running turn's cancel event at once. Messages that
arrive while a turn runs are acknowledged (`Queued`) and answered together next.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import OrderedDict, deque
from dataclasses import dataclass, field
from typing import Any, Protocol

from bot import commands
from bot.config import Config
from bot.conversation import Conversation
from bot.errors import TandemError, user_message
from bot.events import (
    ApprovalResolved,
    Cancel,
    Command,
    ConvKey,
    Decision,
    Event,
    Inbound,
    Notice,
    Queued,
    Trigger,
    TurnEnded,
    TurnStarted,
    User,
    UserMessage,
    Verdict,
)
from bot.history import CallState, Msg, Outcome
from bot.intake import intake
from bot.loop import CallRecord, ExitReason, TurnState
from bot.recovery import encode_inbound, load_conversation, replay
from bot.runner import Deps, Runner
from bot.store import ApprovalRow

log = logging.getLogger(__name__)
MAX_CACHED_CONVERSATIONS = 2000


class Sink(Protocol):
    async def emit(self, event: Event) -> None: ...


@dataclass(frozen=True, slots=True)
class Receipt:
    accepted: bool
    note: str | None = None
    """Why it was refused (shown privately to the user), or None."""


@dataclass(frozen=True, slots=True)
class _Expire:
    conv: ConvKey
    approval_id: str


_Work = Inbound | _Expire


@dataclass(slots=True)
class _Lane:
    inbox: deque[_Work] = field(default_factory=deque)
    task: asyncio.Task[None] | None = None
    cancel: asyncio.Event | None = None
    """Set while a turn runs; setting it cancels that turn."""


class Hub:
    def __init__(self, deps: Deps, approvers: dict[str, set[str]] | None = None) -> None:
        self.d = deps
        self.config: Config = deps.config
        self.runner = Runner(deps)
        self.approvers = approvers or {}
        self._lanes: dict[ConvKey, _Lane] = {}
        self._convs: OrderedDict[ConvKey, Conversation] = OrderedDict()
        self._timers: dict[str, asyncio.TimerHandle] = {}
        self._closing = False
        self._early: set[str] | None = set()
        """Refs accepted before `recover()` looked for unhandled inbound: already queued."""
        self.scheduler: Any = None
        """The job scheduler, when one runs (see `bot.scheduler`)."""

    # -- lifecycle --------------------------------------------------------------------

    async def recover(self) -> None:
        """After a start: repair turns a crash interrupted, re-arm approval expiry,
        and process inbound that was recorded but never handled."""
        for conv_id, _turn in await self.d.store.open_turns():
            row = await self.d.store.conversation_by_id(conv_id)
            if row is not None:
                conv = await self._conversation(row.key)
                for text in conv.notices:
                    await self.d.emit(Notice(row.key, text))
                conv.notices.clear()
        for approval in await self.d.store.pending_approvals():
            row = await self.d.store.conversation_by_id(approval.conv_id)
            if row is not None:
                self._arm_expiry(row.key, approval)
        rows = await self.d.store.unprocessed_inbound()
        early, self._early = self._early or set(), None
        for ref, kind, payload in rows:
            item = replay(kind, payload, ref)
            if item is not None and ref not in early:  # else this process queued it already
                self._enqueue(item)

    async def close(self) -> None:
        """Stop every lane (running turns end as cancelled) and all timers."""
        self._closing = True
        for timer in self._timers.values():
            timer.cancel()
        self._timers.clear()
        tasks = []
        for lane in self._lanes.values():
            lane.inbox.clear()
            if lane.cancel is not None:
                lane.cancel.set()
            if lane.task is not None:
                tasks.append(lane.task)
        if tasks:
            await asyncio.wait(tasks, timeout=10)

    async def idle(self) -> None:
        """Wait until no lane has work (tests and the scriptable console use this)."""
        while tasks := [lane.task for lane in self._lanes.values() if lane.task is not None]:
            await asyncio.wait(tasks)

    def busy(self, key: ConvKey) -> bool:
        """The conversation has work queued or running."""
        lane = self._lanes.get(key)
        return lane is not None and lane.task is not None

    def running(self, key: ConvKey) -> bool:
        """A turn is running right now (a Cancel would stop it)."""
        lane = self._lanes.get(key)
        return lane is not None and lane.cancel is not None

    # -- the entry point --------------------------------------------------------------

    async def submit(self, item: Inbound) -> Receipt:
        """Take one inbound; returns at once (the work runs on the conversation's lane)."""
        if self._closing:
            return Receipt(False, "Tandem is shutting down.")
        if item.ref is not None and isinstance(item, Cancel):
            if not await self.d.store.accept_inbound(item.ref, item.conv, "cancel", "{}"):
                return Receipt(False, None)  # a redelivered /stop
        if isinstance(item, Cancel):
            return self.cancel(item)
        if item.ref is not None:
            kind, payload = encode_inbound(item)
            if not await self.d.store.accept_inbound(item.ref, item.conv, kind, payload):
                log.info("duplicate inbound %s ignored", item.ref)
                return Receipt(False, None)
            if self._early is not None:
                self._early.add(item.ref)
        if isinstance(item, Decision):
            refusal = await self._check_decision(item)
            if refusal is not None:
                return Receipt(False, refusal)
        if isinstance(item, UserMessage) and self.running(item.conv):
            await self.d.emit(Queued(item.conv, item.ref))
        self._enqueue(item)
        return Receipt(True)

    def cancel(self, item: Cancel) -> Receipt:
        """Cancel out of band: the running turn stops at its next checkpoint."""
        lane = self._lanes.get(item.conv)
        if lane is not None and lane.cancel is not None:
            lane.cancel.set()
            return Receipt(True, "Cancelling…")
        self._enqueue(item)
        return Receipt(True)

    def deliver(self, item: Inbound) -> None:
        """Queue an inbound whose id is already recorded (scheduled runs, replays)."""
        if not self._closing:
            self._enqueue(item)

    def _enqueue(self, item: _Work) -> None:
        lane = self._lanes.setdefault(item.conv, _Lane())
        lane.inbox.append(item)
        if lane.task is None:
            lane.task = asyncio.get_running_loop().create_task(self._drain(item.conv, lane))

    async def _drain(self, key: ConvKey, lane: _Lane) -> None:
        try:
            while lane.inbox:
                item = lane.inbox.popleft()
                batch: list[UserMessage] = []
                if isinstance(item, UserMessage):
                    batch.append(item)
                    while lane.inbox and isinstance(lane.inbox[0], UserMessage):
                        batch.append(lane.inbox.popleft())  # type: ignore[arg-type]
                try:
                    await self._handle(key, lane, item, batch)
                except Exception as exc:
                    log.error("failed to handle %s in %s", type(item).__name__, key,
                              exc_info=True)
                    self._convs.pop(key, None)  # reload (and repair) from the store next time
                    await self._safe_emit(Notice(key, user_message(exc)))
        finally:
            lane.task = None
            if not lane.inbox:
                self._lanes.pop(key, None)

    async def _handle(self, key: ConvKey, lane: _Lane, item: _Work,
                      batch: list[UserMessage]) -> None:
        conv = await self._conversation(key)
        for text in conv.notices:
            await self.d.emit(Notice(key, text))
        conv.notices.clear()
        match item:
            case UserMessage():
                await self._on_messages(conv, lane, batch)
            case Trigger():
                await self._on_trigger(conv, lane, item)
            case Decision():
                await self._on_decision(conv, lane, item)
            case Cancel():
                await self._end_suspended(conv, "cancelled", Outcome.INTERRUPTED,
                                          "interrupted: the user cancelled the turn",
                                          item.user, announce=True)
            case Command():
                await commands.run(self, conv, item)
            case _Expire():
                await self._on_expire(conv, lane, item)

    # -- turns ------------------------------------------------------------------------

    async def _on_messages(self, conv: Conversation, lane: _Lane,
                           batch: list[UserMessage]) -> None:
        texts = []
        for message in batch:
            text, note = intake(message.text, self.config)
            if note:
                await self.d.emit(Notice(conv.row.key, note))
            if text:
                author = message.user.name or message.user.id
                context = f"[Earlier in this thread]\n{message.context}\n\n" \
                    if message.context else ""
                texts.append(f"{context}[{author}] {text}")
        refs = [m.ref for m in batch if m.ref]
        if not texts:
            if refs:
                await self.d.store.mark_inbound_done(refs)
            return
        await self._end_suspended(conv, "superseded", Outcome.DENIED,
                                  "not run: the user sent a new message instead of deciding",
                                  None)
        await self._start_turn(conv, lane, texts, batch[-1].user.id, False, refs)

    async def _on_trigger(self, conv: Conversation, lane: _Lane, item: Trigger) -> None:
        late = " (running late: Tandem was not running at the scheduled time)" \
            if item.late else ""
        text = f"[Scheduled task {item.job_id}{late}] {item.prompt}"
        await self._end_suspended(conv, "superseded", Outcome.DENIED,
                                  "not run: a scheduled task started instead", None)
        refs = [item.ref] if item.ref else []
        await self._start_turn(conv, lane, [text], item.requester or f"job:{item.job_id}", True,
                               refs)

    async def _start_turn(self, conv: Conversation, lane: _Lane, texts: list[str],
                          requester: str, unattended: bool, refs: list[str]) -> None:
        turn = conv.last_turn + 1
        msgs = [Msg("user", t, turn) for t in texts]
        stored = await self.d.store.begin_turn(conv.row.id, conv.row.session, msgs, requester,
                                               unattended, refs)
        for msg in stored:
            conv.append(msg)
        conv.trim_to(self.runner.budget())
        conv.turn = TurnState(turn=turn, max_steps=self.config.limits.max_steps,
                              unattended=unattended, requester=requester)
        await self._drive(conv, lane)

    async def _drive(self, conv: Conversation, lane: _Lane) -> None:
        assert conv.turn is not None
        lane.cancel = asyncio.Event()
        turn = conv.turn.turn
        try:
            await self.d.emit(TurnStarted(conv.row.key, turn))
            await self.runner.drive(conv, lane.cancel)
        except Exception as exc:  # the turn cannot go on: end it where the user sees it
            log.error("turn %d in %s failed", turn, conv.row.key, exc_info=True)
            self._convs.pop(conv.row.key, None)  # reload (and repair) from the store
            await self._safe_emit(TurnEnded(conv.row.key, turn, user_message(exc),
                                            ExitReason.ERROR.value))
            return
        finally:
            lane.cancel = None
        if conv.turn is not None and any(r.state is CallState.ASKING for r in conv.turn.calls):
            for approval in await self.d.store.pending_approvals(conv.row.id):
                self._arm_expiry(conv.row.key, approval)

    # -- approvals --------------------------------------------------------------------

    def may_decide(self, key: ConvKey, approval: ApprovalRow, user: User) -> bool:
        return user.id == approval.requester or user.id in self.approvers.get(key.platform, set())

    async def _check_decision(self, item: Decision) -> str | None:
        approval = await self.d.store.approval(item.approval_id)
        if approval is None:
            return "This approval is unknown; nothing was run."
        row = await self.d.store.conversation(item.conv)
        if row.id != approval.conv_id:
            return "This approval belongs to another conversation; nothing was run."
        if not self.may_decide(item.conv, approval, item.user):
            return "This approval is not yours: only the person who asked or an approver " \
                "can decide it."
        if approval.status != "pending":
            return f"Already decided: {approval.status}."
        return None

    async def _on_decision(self, conv: Conversation, lane: _Lane, item: Decision) -> None:
        refusal = await self._check_decision(item)
        if refusal is not None:
            await self.d.emit(Notice(conv.row.key, refusal, ephemeral_to=item.user))
            return
        approval = await self.d.store.approval(item.approval_id)
        assert approval is not None
        state = conv.turn
        record = _find(state, approval.call_id)
        if state is None or record is None or record.state is not CallState.ASKING:
            await self.d.store.decide(approval.id, "expired", None)
            await self.d.emit(ApprovalResolved(conv.row.key, approval.id, "expired"))
            return
        if time.time() >= approval.expires_at:
            await self._expire(conv, approval, record)
        else:
            status = {Verdict.APPROVE: "approved", Verdict.DENY: "denied",
                      Verdict.ALWAYS: "always"}[item.verdict]
            if not await self.d.store.decide(approval.id, status, item.user.id):
                return
            self._disarm(approval.id)
            if item.verdict is Verdict.DENY:
                await self.runner.finish(conv, state, record, Outcome.DENIED,
                                         f"denied: {item.user.name or item.user.id} did not "
                                         "approve this call; do not retry it")
            else:
                if item.verdict is Verdict.ALWAYS:
                    tool = self.d.tools.get(record.call.name)
                    assert tool is not None
                    await self.d.store.add_rule(conv.row.id, record.call.name,
                                                tool.rule_key(_args(record)))
                await self.d.store.set_call(conv.row.id, record.call.id, CallState.ALLOWED)
                record.state = CallState.ALLOWED
            await self.d.emit(ApprovalResolved(conv.row.key, approval.id, status, item.user))
        await self._drive(conv, lane)

    async def _on_expire(self, conv: Conversation, lane: _Lane, item: _Expire) -> None:
        approval = await self.d.store.approval(item.approval_id)
        if approval is None or approval.status != "pending":
            return
        record = _find(conv.turn, approval.call_id)
        await self._expire(conv, approval, record)
        if conv.turn is not None and record is not None:
            await self._drive(conv, lane)

    async def _expire(self, conv: Conversation, approval: ApprovalRow,
                      record: CallRecord | None) -> None:
        if not await self.d.store.decide(approval.id, "expired", None):
            return
        self._disarm(approval.id)
        if record is not None and conv.turn is not None:
            await self.runner.finish(conv, conv.turn, record, Outcome.EXPIRED,
                                     "denied: nobody approved this call in time; do not retry it")
        await self.d.emit(ApprovalResolved(conv.row.key, approval.id, "expired"))
        await self.d.emit(Notice(conv.row.key, f"The approval for `{approval.tool}` expired, "
                                 "so it was not run."))

    async def _end_suspended(self, conv: Conversation, status: str, outcome: Outcome,
                             result: str, user: User | None, *, announce: bool = False) -> None:
        """Finish a turn waiting for approval (a new message, a cancel, /new)."""
        state = conv.turn
        if state is None:
            if announce:
                await self.d.emit(Notice(conv.row.key, "Nothing is running."))
            return
        for record in state.calls:
            if record.state is CallState.FINISHED:
                continue
            approval = await self.d.store.approval_for_call(conv.row.id, record.call.id)
            if approval is not None and await self.d.store.decide(approval.id, status,
                                                                  user.id if user else None):
                self._disarm(approval.id)
                await self.d.emit(ApprovalResolved(conv.row.key, approval.id, status, user))
            await self.runner.finish(conv, state, record, outcome, result)
        await self.d.store.end_turn(conv.row.id, state.turn, "done", status)
        conv.turn = None
        if announce:
            await self.d.emit(TurnEnded(conv.row.key, state.turn, "⏹ Cancelled.",
                                        ExitReason.CANCELLED.value))

    def _arm_expiry(self, key: ConvKey, approval: ApprovalRow) -> None:
        if approval.id in self._timers or self._closing:
            return
        delay = max(0.0, approval.expires_at - time.time())
        loop = asyncio.get_running_loop()
        self._timers[approval.id] = loop.call_later(
            delay, self._enqueue, _Expire(key, approval.id))

    def _disarm(self, approval_id: str) -> None:
        timer = self._timers.pop(approval_id, None)
        if timer is not None:
            timer.cancel()

    # -- conversations ----------------------------------------------------------------

    async def _conversation(self, key: ConvKey) -> Conversation:
        conv = self._convs.get(key)
        if conv is not None:
            self._convs.move_to_end(key)
            return conv
        conv = await self._load(key)
        self._convs[key] = conv
        while len(self._convs) > MAX_CACHED_CONVERSATIONS:
            old, _ = next(iter(self._convs.items()))
            if self.busy(old):
                break
            self._convs.popitem(last=False)
        return conv

    async def _load(self, key: ConvKey) -> Conversation:
        return await load_conversation(self.d.store, self.runner, key,
                                       self.config.limits.max_steps)

    async def reset(self, conv: Conversation) -> None:
        """`/new`: finish whatever waits, start a fresh session."""
        await self._end_suspended(conv, "cancelled", Outcome.INTERRUPTED,
                                  "interrupted: the conversation was reset", None)
        await self.d.store.new_session(conv.row.id)
        self._convs.pop(conv.row.key, None)

    async def _safe_emit(self, event: Event) -> None:
        with contextlib.suppress(Exception):
            await self.d.emit(event)


def _find(state: TurnState | None, call_id: str) -> CallRecord | None:
    if state is None:
        return None
    return next((r for r in state.calls if r.call.id == call_id), None)


def _args(record: CallRecord) -> dict[str, object]:
    from bot.tools import parse_arguments

    return parse_arguments(record.call.arguments)


__all__ = ["Hub", "Receipt", "Sink", "TandemError"]
