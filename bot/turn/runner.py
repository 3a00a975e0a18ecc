"""Runs a turn: executes what `next_action` decides and carries out every effect.

The runner is the only place that changes call, approval and turn state: each effect
of a `bot.turn.Step` is stored first, and only when all of a step's effects are stored
are its events emitted (an emit may hand control away for good).
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import replace
from typing import assert_never

from bot import turn as t
from bot.core import watch as w
from bot.core.errors import ModelError, TurnTooLong, user_message
from bot.core.events import (
    ApprovalRequested,
    ApprovalResolved,
    Event,
    Notice,
    Phase,
    Progress,
    Suspended,
    TurnEnded,
    User,
)
from bot.core.history import CallState, Msg, Outcome, Said, tool_result
from bot.llm import Completion, ContextExceeded
from bot.store import ApprovalRow, ConvRow
from bot.tools import outcome_of, parse_arguments
from bot.turn import model_choice, policy, rules, streaming
from bot.turn.cancel import CancelSignal
from bot.turn.conversation import Conversation
from bot.turn.deps import Deps as Deps  # `bot.turn.runner.Deps` as before
from bot.turn.prompt import Request
from bot.turn.streaming import Scratch
from bot.turn.trimming import trim_history
from bot.turn.usage import Spent

log = logging.getLogger(__name__)
RAN = frozenset({Outcome.OK, Outcome.ERROR})
"""Outcomes whose result may hold what the tool returned (the others are Tandem's words)."""
PROGRESS_TICK_S = 5.0


class Runner:
    def __init__(self, deps: Deps) -> None:
        self.d = deps
        self.limits = deps.config.limits.breakers
        self.budget = deps.budget
        self._window = 0

    async def window(self) -> int:
        """The model's context window in tokens (looked up once, off the event loop)."""
        if not self._window:
            self._window = await self.d.model.window()
        return self._window

    # -- carrying out effects ---------------------------------------------------------

    async def apply(self, conv: Conversation, step: t.Step) -> None:
        """Store every effect of `step`, keep its state, then emit what it says."""
        row, state = conv.row, step.state
        events: list[Event] = []
        closed: t.Close | None = None
        for effect in step.effects:
            match effect:
                case t.SetCall(call_id, call_state):
                    await self.d.store.set_call(row.id, row.session, call_id, call_state)
                case t.Finish(call_id, outcome, text):
                    await self._finished(conv, state, call_id, outcome, text)
                case t.Ask(call_id, approval_id, summary, expires, reason):
                    record = state.record(call_id)
                    assert record is not None
                    now = time.time()
                    await self.d.store.add_approval(ApprovalRow(
                        approval_id, row.id, row.session, call_id, record.call.name, summary,
                        state.requester, "pending", now, now + expires))  # call: ASKING
                    events.append(ApprovalRequested(row.key, approval_id, record.call.name,
                                                    summary, User(state.requester), expires,
                                                    reason=reason))
                    await self.d.watch.see(w.Asked(row.key, approval_id, record.call.name,
                                                   summary, state.requester, now + expires))
                case t.Resolve(approval_id, status, by):
                    if await self.d.store.decide(approval_id, status, by.id if by else None):
                        events.append(ApprovalResolved(row.key, approval_id, status, by))
                        await self._decided(row, approval_id, status, by)
                case t.AddRule(tool, key, by) as rule:
                    await self.d.store.add_rule(row.id, tool, key, **rules.scope(
                        self.d.config.approvals, rule, state.requester, row.session))
                    await self.d.watch.see(w.RuleChanged(row.key, tool, key, "added",
                                                         by.id if by else None))
                case t.Tell(text):
                    events.append(Notice(row.key, text))
                case t.Close() as closed:
                    await self.d.store.end_turn(row.id, row.session, state.turn, "done",
                                                closed.reason.value, show=closed.text)
                case _:
                    assert_never(effect)
        self._keep(conv, state, done=closed is not None)
        for event in events:
            await self.d.emit(event)
        if closed is not None and closed.text is not None:
            await self.show_end(row, TurnEnded(row.key, state.turn, closed.text,
                                               closed.reason.value))

    async def _decided(self, row: ConvRow, approval_id: str, status: str,
                       by: User | None) -> None:
        approval = await self.d.store.approval(approval_id)
        if approval is not None:
            await self.d.watch.see(w.Decided(row.key, approval_id, approval.tool,
                                             approval.summary, status, by.id if by else None,
                                             time.time() - approval.created_at))

    async def show_end(self, row: ConvRow, event: TurnEnded) -> None:
        """Show a turn's end, then note that it was shown (until then the store keeps it,
        for whichever process loads the conversation next: `bot.serve.recovery`)."""
        await self.d.emit(event)
        await self.d.store.shown(row.id, row.session, event.turn)

    async def _finished(self, conv: Conversation, state: t.TurnState, call_id: str,
                        outcome: Outcome, text: str) -> None:
        record = state.record(call_id)
        assert record is not None
        stored = await self.d.store.set_call(
            conv.row.id, conv.row.session, call_id, CallState.FINISHED, outcome,
            tool_result(record.call, text, state.turn))
        assert stored is not None
        conv.append(stored)
        if outcome not in RAN:
            conv.unread.add(call_id)

    # -- a new turn -------------------------------------------------------------------

    async def begin(self, conv: Conversation, said: list[Said], requester: str,
                    unattended: bool, refs: list[str], cancel: CancelSignal | None = None
                    ) -> bool:
        """Store the turn's messages, trim once (this is the only trim of the turn).
        False when its inbound was processed already (a second copy of it)."""
        number = conv.last_turn + 1
        row = conv.row
        messages = [Msg("user", text, number, media=media) for text, media in said]
        stored = await self.d.store.begin_turn(row.id, row.session, messages, requester,
                                               unattended, refs)
        if stored is None:
            log.info("inbound %s in %s was processed already", refs, row.key)
            return False
        for msg in stored:
            conv.append(msg)
        ledger = conv.ledger if unattended else conv.ledger.forgive(self.limits.same_call_failures)
        conv.turn = t.TurnState(turn=number, max_steps=self.d.config.limits.max_steps,
                                unattended=unattended, requester=requester, ledger=ledger)
        # from here on a failure ends the stored turn as an error (`Worker._start`)
        await model_choice.refresh(self.d.store, self.d.config.llm, conv)
        await self._trim(conv, cancel)
        return True

    async def _trim(self, conv: Conversation, cancel: CancelSignal | None = None) -> None:
        await trim_history(self.d, conv, await self.window(), cancel)

    @staticmethod
    def _keep(conv: Conversation, state: t.TurnState, *, done: bool) -> None:
        conv.ledger = state.ledger
        conv.turn = None if done else state

    # -- the loop ---------------------------------------------------------------------

    async def drive(self, conv: Conversation, cancel: CancelSignal) -> t.ExitReason | None:
        """Run the turn until it ends (its reason) or waits for a human (None)."""
        scratch = Scratch(started=time.monotonic())
        while True:
            state = conv.turn
            assert state is not None
            if cancel.shutdown:  # Tandem stops: the turn is repaired at the next start
                return None
            if cancel.is_set() and not state.cancelled:
                state = conv.turn = replace(state, cancelled=True)
            action = t.next_action(state)
            match action:
                case t.Reason():
                    await self._reason(conv, state, cancel, scratch)
                case t.Decide(record):
                    await self.apply(conv, await self._decide(conv, state, record))
                case t.Run(record):
                    await self._run(conv, state, record, cancel, scratch)
                case t.Suspend(waiting):
                    await self.d.store.end_turn(conv.row.id, conv.row.session, state.turn,
                                                "suspended", None)
                    ids = tuple(r.approval_id for r in waiting if r.approval_id)
                    await self.d.emit(Suspended(conv.row.key, state.turn, ids, scratch.answer))
                    if not cancel.by_person:  # a person's Cancel as it paused: it ends
                        return None
                case t.Exit(reason):
                    await self._exit(conv, state, reason, scratch)
                    return reason
                case _:
                    assert_never(action)

    async def resumed(self, conv: Conversation) -> None:
        """A suspended turn goes on: a crash from here on finds it running. Reloaded
        since its pause, its history is trimmed again as it was at its beginning."""
        assert conv.turn is not None
        await self._trim(conv)
        await self.d.store.end_turn(conv.row.id, conv.row.session, conv.turn.turn,
                                    "running", None)

    # -- Reason: one model call -------------------------------------------------------

    async def _reason(self, conv: Conversation, state: t.TurnState, cancel: CancelSignal,
                      scratch: Scratch) -> None:
        await self._progress(conv, state, Phase.THINKING, scratch)
        if self.d.steer is not None:  # `busy: steer`: messages sent meanwhile join the turn
            await self.d.steer(conv)
        reached = None if self.budget is None else \
            await self.budget.reached(conv.row, state.requester)
        if reached is not None:
            conv.turn = replace(state, budget=reached.text)
            await self.d.watch.see(w.BudgetReached(conv.row.key, state.requester, reached.scope))
            await self.d.emit(reached.notice(conv.row.key))
            return
        try:
            completion = await self._complete_fitting(conv, cancel, scratch)
        except ModelError as exc:
            log.warning("model call failed in %s: %s", conv.row.key, exc)
            conv.turn = replace(state, error=self.d.redact(user_message(exc)))
            return
        if completion is None:  # cancelled mid-stream: keep only plain text
            conv.turn = replace(state, cancelled=not cancel.shutdown)
            if scratch.text:
                scratch.partial = Msg("assistant", self.d.redact(scratch.text), state.turn)
            return
        await self._record_step(conv, state, completion, scratch)

    async def _complete_fitting(self, conv: Conversation, cancel: CancelSignal,
                                scratch: Scratch) -> Completion | None:
        """Check the fit before sending; the provider's "too long" is the last resort."""
        window = await self.window()
        request = self.d.prompt.build(conv, window)
        try:
            if not self.d.prompt.fits(request, conv, window):
                raise ContextExceeded("the request does not fit (estimated before sending)")
            return await self._complete(conv, request, cancel, scratch)
        except ContextExceeded:  # older turns go, never this one
            log.warning("context window exceeded in %s; emergency trim", conv.row.key)
            conv.trim_to(self.d.prompt.history_budget(conv, window) // 2)
            request = self.d.prompt.build(conv, window)
            try:
                return await self._complete(conv, request, cancel, scratch)
            except ContextExceeded as exc:
                raise TurnTooLong(str(exc)) from exc

    async def _record_step(self, conv: Conversation, state: t.TurnState,
                           completion: Completion, scratch: Scratch) -> None:
        redact = self.d.redact
        calls = []
        for call in completion.tool_calls:  # ids unique in the session, within a step too
            calls.append(replace(call, id=conv.unique_call_id(call.id),
                                 arguments=redact(call.arguments)))
            conv.call_ids.add(calls[-1].id)
        completion = replace(completion, text=redact(completion.text))
        new = t.model_step(state, tuple(calls))
        usage = None
        conv.usage.add(state.turn, Spent.of(completion))
        if completion.prompt_tokens is not None:
            usage = (completion.prompt_tokens, completion.completion_tokens or 0, completion.cost)
            if self.budget is not None:
                await self.budget.spend(conv.row, state.requester, usage[0] + usage[1],
                                        usage[2])
        msg = Msg("assistant", completion.text, state.turn, tuple(calls))
        if calls:
            conv.append(await self.d.store.append_assistant(
                conv.row.id, conv.row.session, msg, new.steps, usage))
        else:  # the answer: a plain step always ends the turn; stored with its end
            scratch.final = (msg, (new.steps, usage))
        conv.turn = new
        scratch.answer = completion.text or scratch.answer
        scratch.text = ""

    async def _complete(self, conv: Conversation, request: Request, cancel: CancelSignal,
                        scratch: Scratch) -> Completion | None:
        state = conv.turn
        assert state is not None
        with model_choice.using(conv):
            completion = await streaming.complete(
                self.d.model, request, self.d.tools.schemas(), cancel, scratch,
                lambda: self._progress(conv, state, Phase.THINKING, scratch), self.d.watch,
                model_choice.in_use(self.d.config.llm, conv))
        if completion is not None and completion.prompt_tokens:
            conv.calibrate(request.estimated, completion.prompt_tokens)
        return completion

    # -- Decide: what the policy says -------------------------------------------------

    async def _decide(self, conv: Conversation, state: t.TurnState,
                      record: t.CallRecord) -> t.Step:
        verdict = await policy.verdict(self.d.config, self.d.tools, self.d.store, conv.row.id,
                                       record.call, unattended=state.unattended,
                                       window=conv.window(), turn=state.turn,
                                       unread=conv.unread, conv=conv.row.key,
                                       user=state.requester, session=conv.row.session)
        return t.decide(state, self.limits, record.call.id, verdict)

    # -- Run: one allowed call --------------------------------------------------------

    async def _run(self, conv: Conversation, state: t.TurnState, record: t.CallRecord,
                   cancel: CancelSignal, scratch: Scratch) -> None:
        call = record.call
        tool = self.d.tools.get(call.name)
        if tool is None:  # gone while the call waited (an MCP server's tools changed)
            gone = f"error: the tool `{call.name}` is not available now; nothing was run"
            await self.apply(conv, t.finish(state, self.limits, call.id, Outcome.ERROR, gone))
            return
        args = parse_arguments(call.arguments)
        approval = await self.d.store.approval_for_call(conv.row.id, conv.row.session, call.id)
        if approval is not None and approval.summary != tool.summary(args):
            differs = "denied: the call differs from the one that was approved"
            await self.apply(conv, t.finish(state, self.limits, call.id, Outcome.DENIED, differs))
            return
        await self.apply(conv, t.submitted(state, call.id))
        await self._progress(conv, state, Phase.TOOL, scratch, call.name)
        started = time.monotonic()
        task = asyncio.ensure_future(tool.run(self.d.tool_context(conv), args))
        waiter = asyncio.ensure_future(cancel.wait())
        try:
            while not (task.done() or waiter.done()):  # a tick so "for how long" stays true
                await asyncio.wait({task, waiter}, timeout=PROGRESS_TICK_S,
                                   return_when=asyncio.FIRST_COMPLETED)
                if not (task.done() or waiter.done()):
                    await self._progress(conv, state, Phase.TOOL, scratch, call.name)
        finally:
            waiter.cancel()
        assert conv.turn is not None
        if not task.done():
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
            who = "Tandem was stopping" if cancel.shutdown else "the user cancelled"
            step = t.finish(replace(conv.turn, cancelled=not cancel.shutdown), self.limits,
                            call.id, Outcome.INTERRUPTED, f"interrupted: {who} while this "
                            "was running")
        else:
            outcome, text = outcome_of(task, call.name, self.d.config.limits.tool_output_chars,
                                       self.d.redact)
            step = t.finish(conv.turn, self.limits, call.id, outcome, text)
        await self.apply(conv, step)
        ended = step.state.record(call.id)
        await self.d.watch.see(w.ToolRan(
            conv.row.key, call.name, tool.summary(args),
            ended.outcome.value if ended and ended.outcome else "interrupted",
            time.monotonic() - started, state.requester))

    # -- Exit -------------------------------------------------------------------------

    async def _exit(self, conv: Conversation, state: t.TurnState, reason: t.ExitReason,
                    scratch: Scratch) -> None:
        step = t.exit_turn(state, self.limits, reason)
        await self.apply(conv, step)  # unfinished calls are interrupted, live cards close
        last, counted = scratch.final or (scratch.partial, None)
        row = conv.row
        shown = scratch.partial or (scratch.final[0] if scratch.final else None)
        text = t.final_text(step.state, reason, scratch.answer, shown.content if shown else "")
        text = await model_choice.answered(self.d.watch, conv, scratch, text)
        stored = await self.d.store.end_turn(row.id, row.session, state.turn, "done",
                                             reason.value, last, step=counted, show=text)
        if stored is not None:
            conv.append(stored)
        if (spent := conv.usage.of(state.turn)) is not None:
            await self.d.watch.see(spent.told(row.key, state.requester))
        self._keep(conv, step.state, done=True)
        await self.d.watch.see(w.TurnDone(row.key, reason.value,
                                          time.monotonic() - scratch.started))
        await self.show_end(row, TurnEnded(row.key, state.turn, text, reason.value))

    async def _progress(self, conv: Conversation, state: t.TurnState, phase: Phase,
                        scratch: Scratch, tool: str | None = None) -> None:
        await self.d.emit(Progress(conv.row.key, state.turn, phase, scratch.text, tool,
                                   time.monotonic() - scratch.started))
