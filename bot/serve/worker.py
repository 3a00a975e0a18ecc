"""The worker: what each conversation's lane does with an item of its work.

A message starts a turn (superseding one that waits for a human), a scheduled run
starts one unattended (or waits while a human decides), a press or an expiry lets a
waiting turn go on, a Cancel ends a waiting turn, a command answers. The runner
carries out every change of state.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass

from bot import turn as t
from bot.core.errors import user_message
from bot.core.events import (
    ApprovalRequested,
    Cancel,
    Command,
    ConvKey,
    Decision,
    Edit,
    Event,
    Inbound,
    Notice,
    Queued,
    Trigger,
    TurnEnded,
    TurnStarted,
    User,
    UserMessage,
)
from bot.core.history import Msg, Said
from bot.serve import commands
from bot.serve.access import LOCAL_PLATFORMS, Access
from bot.serve.approvals import Approvals
from bot.serve.commands import CommandContext, Reset
from bot.serve.intake import Intake
from bot.serve.lanes import Lanes
from bot.serve.recovery import Resume, load_conversation
from bot.serve.scheduler import Scheduler
from bot.turn.cancel import CancelSignal, unless_cancelled
from bot.turn.conversation import Conversation
from bot.turn.conversations import Conversations
from bot.turn.runner import Runner

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Expiry:
    """An approval card's time is up."""

    conv: ConvKey
    approval_id: str


Work = Inbound | Expiry | Resume
LanesFactory = Callable[[Callable[[ConvKey, list[Work]], Awaitable[None]]], Lanes[Work]]
"""Makes the lanes (in this process, or across workers) around the worker's handler."""


class Worker:
    def __init__(self, runner: Runner, intake: Intake, access: Access,
                 scheduler: Scheduler, lanes: LanesFactory | None = None) -> None:
        self.runner = runner
        self.d = runner.d
        self.intake = intake
        self.scheduler = scheduler
        self.lanes: Lanes[Work] = (lanes or Lanes)(self._handle)
        self.convs = Conversations(self._load, self.lanes.busy)
        self.approvals = Approvals(runner, access, self.due)
        if self.d.config.busy == "steer":
            self.d.steer = self._steer

    def due(self, key: ConvKey, approval_id: str) -> None:
        """An approval's timer fired: its expiry waits its turn on the lane."""
        self.lanes.put(key, Expiry(key, approval_id))

    async def _load(self, key: ConvKey) -> Conversation:
        return await load_conversation(self.d.store, self.runner, key)

    # -- on the lane ------------------------------------------------------------------

    async def _handle(self, key: ConvKey, batch: list[Work]) -> None:
        try:
            async with self.lanes.hold(key, functools.partial(self._waits, key, batch)):
                if self.lanes.fresh:  # another process may have changed it: read it fresh
                    self.convs.drop(key)
                conv = await self.convs.get(key)
                if self.lanes.shared:
                    batch = await self._unsettled(conv, batch)
                elif conv.turn is not None and not conv.turn.waiting:
                    # decided, but never went on (its process died, or handling the press
                    # failed after the decision was stored): it goes on before anything else
                    await self._drive(conv, resumed=True)
                if batch:
                    await self._dispatch(conv, batch)
        except Exception as exc:
            log.error("failed to handle %s in %s", type(batch[0]).__name__, key, exc_info=True)
            self.convs.drop(key)  # reload (and repair) from the store next time
            await self._safe_emit(Notice(key, user_message(exc)))
            with contextlib.suppress(Exception):  # told: not run again at the next start
                await self.d.store.mark_inbound_done(
                    [i.ref for i in batch if isinstance(i, UserMessage | Trigger) and i.ref])
        finally:
            cached = self.convs.cached(key)
            if cached is None or cached.turn is None:
                self.lanes.unpark(key)

    async def _waits(self, key: ConvKey, batch: list[Work]) -> None:
        """Another process holds the conversation (a second terminal answers in it): its
        messages are told they are answered after that."""
        for item in batch:
            if isinstance(item, UserMessage):
                await self._safe_emit(Queued(key, item.ref))  # a note: never the message's end

    async def _unsettled(self, conv: Conversation, batch: list[Work]) -> list[Work]:
        """With several workers: a turn that a dead worker left ready to go on (its human
        had decided, or its tool was cut) goes on first, and items that a dead worker
        had processed already (its job is run again) are dropped."""
        if conv.turn is not None and not conv.turn.waiting:
            await self._drive(conv, resumed=True)
        elif conv.turn is not None:
            await self._post_lost_cards(conv)
        return [item for item in batch
                if not isinstance(item, UserMessage | Trigger | Decision) or item.ref is None
                or await self.d.store.inbound_open(item.ref)]

    async def _post_lost_cards(self, conv: Conversation) -> None:
        """Cards of a waiting turn that no platform posted (their worker died between
        storing the approval and posting its card): posted now, or nobody could press."""
        for approval in await self.d.store.pending_approvals(conv.row.id):
            if approval.session == conv.row.session and \
                    await self.d.store.card(approval.id) is None:
                log.info("posting the card of approval %s (its worker died first)",
                         approval.id)
                await self.d.emit(ApprovalRequested(
                    conv.row.key, approval.id, approval.tool, approval.summary,
                    User(approval.requester), approval.remaining_s()))

    async def _dispatch(self, conv: Conversation, batch: list[Work]) -> None:
        match item := batch[0]:
            case UserMessage() | Edit():
                async with self._preparing(conv.row.key, item.user.id) as cancel:
                    await self._messages(conv, await self._edited(
                        [m for m in batch if isinstance(m, UserMessage | Edit)]), cancel)
            case Trigger():
                async with self._preparing(conv.row.key, item.requester or None) as cancel:
                    await self._trigger(conv, item, cancel)
            case Decision():
                go_on = await self.approvals.decide(conv, item)
                if item.ref is not None:
                    await self.d.store.mark_inbound_done([item.ref])
                if go_on:
                    await self._drive(conv, resumed=True)
            case Expiry():
                if await self.approvals.expire(conv, item.approval_id):
                    await self._drive(conv, resumed=True)
            case Resume() if conv.turn is not None and not conv.turn.waiting:
                await self._drive(conv, resumed=True)
            case Cancel():
                await self._cancel_waiting(conv, item)
            case Command():
                await self._command(conv, item)

    async def _edited(self, batch: list[UserMessage | Edit]) -> list[UserMessage]:
        """The messages, with their edits applied: an edit of a message whose turn has not
        started replaces its text (a deletion drops it); an edit of one answered already,
        or being answered, is a note for the next turn (never a second answer)."""
        messages: list[UserMessage] = []
        for item in batch:
            if isinstance(item, UserMessage):
                messages.append(item)
                continue
            found = next((n for n, m in enumerate(messages)
                          if m.message_id == item.message_id and m.conv == item.conv), None)
            if found is None:
                await self.intake.talk.after_turn(item)
            elif item.deleted:
                gone = messages.pop(found)
                if gone.ref:
                    await self.d.store.mark_inbound_done([gone.ref])
            else:
                messages[found] = dataclasses.replace(messages[found], text=item.text)
                await self.d.store.edit_talk(str(item.conv), item.message_id, item.text)
        return messages

    @contextlib.asynccontextmanager
    async def _preparing(self, key: ConvKey, owner: str | None) -> AsyncIterator[CancelSignal]:
        """A turn's cancel signal exists from the moment it is prepared: a `/stop` during
        its downloads, transcription or summary call stops it."""
        try:
            yield self.lanes.begin(key, None, owner)
        finally:
            self.lanes.end(key)

    async def _steer(self, conv: Conversation) -> None:
        """`busy: steer`: the messages that wait behind the running turn join it now, at
        its next model call, so the model can change course."""
        waiting = self.lanes.take_messages(conv.row.key)
        batch = await self._edited([m for m in waiting if isinstance(m, UserMessage | Edit)])
        if not batch or conv.turn is None:
            return
        said, notes = await self.intake.said(batch, conv.row, self.runner.budget)
        for note in notes:
            await self.d.emit(Notice(conv.row.key, note))
        refs = [m.ref for m in batch if m.ref]
        messages = [Msg("user", text, conv.turn.turn, media=media) for text, media in said]
        stored = await self.d.store.add_to_turn(conv.row.id, conv.row.session, messages, refs)
        for msg in stored or ():
            conv.append(msg)

    async def _messages(self, conv: Conversation, batch: list[UserMessage],
                        cancel: CancelSignal) -> None:
        if not batch:
            return
        batch = list({m.ref or id(m): m for m in batch}.values())  # one copy of each
        if conv.turn is not None and await self._before_its_card(conv, batch):
            await self._after_decision(conv, batch)
            return
        refs = [m.ref for m in batch if m.ref]
        prepared = await unless_cancelled(
            self.intake.said(batch, conv.row, self.runner.budget), cancel)
        if prepared is None:  # stopped while its files were fetched or transcribed
            if not cancel.shutdown:  # (a shutdown: it is answered after the next start)
                await self.d.store.mark_inbound_done(refs)
                await self.d.emit(Notice(conv.row.key, "⏹ Cancelled."))
            return
        said, notes = prepared
        for note in notes:
            await self.d.emit(Notice(conv.row.key, note))
        if not said:
            await self.d.store.mark_inbound_done(refs)
            return
        if conv.turn is not None:
            await self._end_waiting(conv, t.supersede(
                conv.turn, self.runner.limits, "the user sent a new message instead of deciding"))
        await self._start(conv, said, batch[-1].user.id, False, refs, cancel)

    async def _before_its_card(self, conv: Conversation, batch: list[UserMessage]) -> bool:
        """Every message came before the waiting turn showed its first card."""
        shown = [a.created_at for a in await self.d.store.pending_approvals(conv.row.id)
                 if a.session == conv.row.session]
        return bool(shown) and all(0 < m.received_at < min(shown) for m in batch)

    async def _after_decision(self, conv: Conversation, batch: list[UserMessage]) -> None:
        """Messages sent while the turn was still working, before the card it then showed:
        nobody could have decided it yet, so they do not supersede it. They wait for the
        decision (or the card's expiry, or a Cancel) and are answered together after."""
        for message in batch:
            self.lanes.park(conv.row.key, message)
        if not self.lanes.shared:  # (with several workers they come back on their own)
            await self.d.emit(Notice(conv.row.key, "I will answer your message once the "
                                     "approval above is decided."))

    async def _trigger(self, conv: Conversation, item: Trigger, cancel: CancelSignal) -> None:
        if not t.trigger_arrives(conv.turn):  # the run waits; a human's card is not denied
            self.lanes.park(conv.row.key, item)
            await self.d.emit(Notice(conv.row.key, f"Scheduled task {item.job_id} is due; "
                                     "it runs once the pending approval is decided."))
            return
        late = " (running late: Tandem was not running at the scheduled time)" \
            if item.late else ""
        text = f"[Scheduled task {item.job_id}{late}] {item.prompt}"
        await self._start(conv, [(text, ())], item.requester or f"job:{item.job_id}", True,
                          [item.ref] if item.ref else [], cancel)

    async def _start(self, conv: Conversation, said: list[Said], requester: str,
                     unattended: bool, refs: list[str], cancel: CancelSignal) -> None:
        try:
            began = await self.runner.begin(conv, said, requester, unattended, refs, cancel)
        except Exception as exc:
            if conv.turn is None:  # nothing was stored: the lane tells of it
                raise
            log.error("turn %d in %s cannot begin", conv.turn.turn, conv.row.key,
                      exc_info=True)  # stored: it ends as an error, never left "running"
            conv.turn = dataclasses.replace(conv.turn, error=self.d.redact(user_message(exc)))
            began = True
        if began:
            await self._drive(conv)

    async def _drive(self, conv: Conversation, *, resumed: bool = False) -> None:
        assert conv.turn is not None
        key, number = conv.row.key, conv.turn.turn
        cancel = self.lanes.begin(key, number)
        try:
            await self.d.emit(TurnStarted(key, number, conv.row.session))
            if resumed:
                await self.runner.resumed(conv)
            await self.runner.drive(conv, cancel)
        except Exception as exc:  # the turn cannot go on: end it where the user sees it
            log.error("turn %d in %s failed", number, key, exc_info=True)
            await self._failed(conv, number, user_message(exc))
            return
        finally:
            self.lanes.end(key)
        conv.release(summarized_only=self.d.config.context.summary)  # memory: the window
        if conv.turn is not None:
            for approval in await self.d.store.pending_approvals(conv.row.id):
                self.approvals.arm(key, approval)
                self.lanes.expire_at(Expiry(key, approval.id), approval.expires_at)

    async def _failed(self, conv: Conversation, number: int, text: str) -> None:
        """End a failed turn in the store as well, so that the next message is not told of
        an interrupted answer; if even that fails, the next load repairs it."""
        ended = TurnEnded(conv.row.key, number, text, "error")
        try:
            state = conv.turn
            if state is not None and state.turn == number:
                await self.runner.apply(conv, t.exit_turn(state, self.runner.limits,
                                                          t.ExitReason.ERROR))
                await self.d.store.end_turn(conv.row.id, conv.row.session, number, "done",
                                            "error", show=text)
                await self.runner.show_end(conv.row, ended)
                return
        except Exception:
            log.warning("could not end turn %d in %s", number, conv.row.key, exc_info=True)
        finally:
            self.convs.drop(conv.row.key)  # reload (and repair) from the store
        await self._safe_emit(ended)

    async def _cancel_waiting(self, conv: Conversation, item: Cancel) -> None:
        state = conv.turn
        if state is None or item.turn not in (None, state.turn) \
                or item.session not in (None, conv.row.session):
            text = "Nothing is running." if item.turn is None else "That turn is already over."
            await self.d.emit(Notice(conv.row.key, text, ephemeral_to=item.user))
            return
        await self._end_waiting(conv, t.cancel_waiting(state, self.runner.limits, item.user))

    async def _command(self, conv: Conversation, cmd: Command) -> None:
        ctx = CommandContext(self.d.config, self.d.store, self.d.prompt,
                             self.runner.window, self.lanes.running(conv.row.key),
                             self.scheduler, self.d.mcp.status, self._backend,
                             self._approver(conv.row.key.platform, cmd.user),
                             self.runner.budget, self.d.watch, self.approvals.access)
        for out in await commands.run(ctx, conv, cmd):
            if isinstance(out, Reset):
                if conv.turn is not None:
                    await self._end_waiting(conv, t.supersede(
                        conv.turn, self.runner.limits, "the conversation was reset"))
                await self.d.store.new_session(conv.row.id)
                await self.intake.talk.forget(conv.row.key)
                self.convs.drop(conv.row.key)
            else:
                await self.d.emit(out)

    def _approver(self, platform: str, user: User) -> bool:
        """May use the approvers' commands (`/audit`, a budget's lift): an approver, or
        the person at the terminal (who runs Tandem)."""
        return platform in LOCAL_PLATFORMS or self.approvals.access.is_approver(platform,
                                                                               user.id)

    async def _backend(self) -> str:
        target = self.d.config.store.target
        if self.lanes.fresh and not self.lanes.shared:
            return "PostgreSQL, this process (a conversation is held while it is answered)"
        if not self.lanes.shared:
            return f"SQLite, one process ({target.removeprefix('sqlite://')})"
        try:
            workers, depth = await self.lanes.queue_stats()
        except Exception:  # only a status line: say it is unknown
            return "PostgreSQL, several workers (the task queue could not be read)"
        return f"PostgreSQL, {workers} workers alive, {depth} jobs queued or running"

    async def _end_waiting(self, conv: Conversation, step: t.Step) -> None:
        """End a turn that waits for a human; its cards' timers go too."""
        await self.runner.apply(conv, step)
        for effect in step.effects:
            if isinstance(effect, t.Resolve):
                self.approvals.disarm(effect.approval_id)

    async def _safe_emit(self, event: Event) -> None:
        with contextlib.suppress(Exception):
            await self.d.emit(event)
