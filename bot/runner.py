"""Runs one turn: executes what `next_action` decides, persisting before emitting.

The runner holds no decisions of its own. Each action handler changes the persisted
state first, then tells the platform (an emit may hand control away for good).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, assert_never

from bot import breakers
from bot.config import Config
from bot.context import check_system_fits
from bot.conversation import Conversation
from bot.errors import ModelError, ToolError, user_message
from bot.events import ApprovalRequested, Event, Phase, Progress, TurnEnded, User
from bot.history import CallState, Msg, Outcome, ToolCall, estimate_tokens, tool_result
from bot.llm import Completion, ContextExceeded, Delta, ModelClient, Restart
from bot.loop import CallRecord, Decide, Exit, ExitReason, Reason, Run, TurnState, next_action
from bot.persona import Persona
from bot.store import ApprovalRow, Usage
from bot.store.sqlite import SQLiteStore, short_id
from bot.tools import Registry, ToolContext, cap, parse_arguments

log = logging.getLogger(__name__)
CANCEL_EVERY_CHUNKS = 8
HINT_RESERVE_TOKENS = 200
PROGRESS_TICK_S = 5.0

Emit = Callable[[Event], Awaitable[None]]


@dataclass(slots=True)
class Deps:
    config: Config
    store: SQLiteStore
    model: ModelClient
    tools: Registry
    persona: Persona
    emit: Emit
    tool_context: Callable[[Conversation], ToolContext]
    window_source: Callable[[], int]
    hint: Callable[[Conversation], str]
    _window: int = 0

    @property
    def window(self) -> int:
        """The context window in tokens, looked up on first use (it may import litellm)."""
        if not self._window:
            self._window = self.window_source()
        return self._window


class Runner:
    def __init__(self, deps: Deps) -> None:
        self.d = deps
        self._system_tokens: tuple[str, int] = ("", 0)
        self._tool_tokens = estimate_tokens(str(deps.tools.schemas()))

    # -- the loop ---------------------------------------------------------------------

    async def drive(self, conv: Conversation, cancel: asyncio.Event) -> ExitReason:
        state = conv.turn
        assert state is not None
        scratch = _Scratch(started=time.monotonic())
        while True:
            if cancel.is_set():
                state.cancelled = True
            action = next_action(state)
            match action:
                case Reason():
                    await self._reason(conv, state, cancel, scratch)
                case Decide(record):
                    await self._decide(conv, state, record)
                case Run(record):
                    await self._run(conv, state, record, cancel, scratch)
                case Exit(reason):
                    await self._exit(conv, state, reason, scratch)
                    return reason
                case _:
                    assert_never(action)

    # -- Reason: one model call -------------------------------------------------------

    def budget_fixed(self) -> int:
        """Tokens the system prompt and the tool schemas take in every request."""
        self.system_prompt()
        return self._fixed_tokens()

    def _fixed_tokens(self) -> int:
        """`budget_fixed` for the prompt last read (no new look at the persona)."""
        return self._system_tokens[1] + self._tool_tokens

    def budget(self) -> int:
        """Tokens left for the history once the system prompt, tools and answer fit."""
        fixed = self.budget_fixed()
        reserve = self.d.config.llm.max_output_tokens + HINT_RESERVE_TOKENS
        check_system_fits(fixed, self.d.window, reserve)
        return self.d.window - fixed - reserve

    def system_prompt(self) -> str:
        prompt = self.d.persona.system_prompt()
        if prompt is not self._system_tokens[0]:
            self._system_tokens = (prompt, estimate_tokens(prompt))
        return prompt

    def request(self, conv: Conversation) -> list[dict[str, Any]]:
        """The messages for the next model call: system prompt, sanitized window, hint."""
        wire = [{"role": "system", "content": self.system_prompt()}]
        wire.extend(conv.wire_window())
        for i in range(len(wire) - 1, 0, -1):
            if wire[i]["role"] == "user":
                hinted = dict(wire[i])
                hinted["content"] = f"{hinted['content']}\n\n{self.d.hint(conv)}"
                wire[i] = hinted
                break
        return wire

    async def _reason(self, conv: Conversation, state: TurnState, cancel: asyncio.Event,
                      scratch: _Scratch) -> None:
        await self._emit_progress(conv, state, Phase.THINKING, scratch)
        try:
            completion = await self._complete(conv, state, cancel, scratch)
        except ContextExceeded:
            log.warning("context window exceeded in %s; emergency trim", conv.row.key)
            conv.trim_to(self.budget() // 2)
            try:
                completion = await self._complete(conv, state, cancel, scratch)
            except ModelError as exc:
                state.error = user_message(exc)
                return
        except ModelError as exc:
            log.warning("model call failed in %s", conv.row.key, exc_info=True)
            state.error = user_message(exc)
            return
        if completion is None:  # cancelled mid-stream: keep only plain text
            state.cancelled = True
            if scratch.text:
                scratch.partial = Msg("assistant", scratch.text, state.turn)
            return
        calls = []
        for c in completion.tool_calls:
            calls.append(ToolCall(conv.unique_call_id(c.id), c.name, c.arguments))
            conv.call_ids.add(calls[-1].id)
        state.steps += 1
        usage = None
        if completion.prompt_tokens is not None:
            usage = (completion.prompt_tokens, completion.completion_tokens or 0, completion.cost)
        msg = Msg("assistant", completion.text, state.turn, tuple(calls))
        if calls:
            conv.append(await self.d.store.append_assistant(
                conv.row.id, conv.row.session, msg, state.steps, usage))
            state.calls.extend(CallRecord(call=c) for c in calls)
        else:  # the answer: a plain step always ends the turn; stored with its end
            scratch.final = (msg, (state.steps, usage))
        state.last_step_plain = not calls
        scratch.answer = completion.text or scratch.answer
        scratch.text = ""

    async def _complete(self, conv: Conversation, state: TurnState, cancel: asyncio.Event,
                        scratch: _Scratch) -> Completion | None:
        messages = self.request(conv)  # reads the persona: the estimate below reuses it
        estimated = conv.kept + self._fixed_tokens()
        stream = self._consume(conv, state, messages, scratch, cancel)
        task = asyncio.ensure_future(stream)
        waiter = asyncio.ensure_future(cancel.wait())
        try:
            await asyncio.wait({task, waiter}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            waiter.cancel()
        if not task.done():
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
            return None
        completion = task.result()
        if completion is not None and completion.prompt_tokens:
            conv.calibrate(estimated, completion.prompt_tokens)
        return completion

    async def _consume(self, conv: Conversation, state: TurnState, messages: list[dict[str, Any]],
                       scratch: _Scratch, cancel: asyncio.Event) -> Completion | None:
        chunks = 0
        async for item in self.d.model.stream(messages, self.d.tools.schemas()):
            match item:
                case Delta(text):
                    chunks += 1
                    if chunks % CANCEL_EVERY_CHUNKS == 0 and cancel.is_set():
                        return None
                    if text:
                        scratch.text += text
                        await self._emit_progress(conv, state, Phase.THINKING, scratch)
                case Restart():
                    scratch.text = ""
                case Completion():
                    return item
        raise ModelError("the model stream ended without a completion")

    # -- Decide: breakers and policy --------------------------------------------------

    async def _decide(self, conv: Conversation, state: TurnState, record: CallRecord) -> None:
        call = record.call
        tool = self.d.tools.get(call.name)
        if tool is None:
            await self.finish(conv, state, record, Outcome.ERROR,
                              f"error: there is no tool named `{call.name}`; "
                              f"available: {', '.join(self.d.tools.names())}")
            return
        try:
            args = parse_arguments(call.arguments)
        except ToolError as exc:
            await self.finish(conv, state, record, Outcome.ERROR, f"error: {exc}")
            return
        trip = breakers.check(self.d.config.limits.breakers, state.calls, call.name,
                              call.arguments)
        if trip is not None:
            if trip.fatal:
                state.fatal = trip.message
            await self.finish(conv, state, record, Outcome.SKIPPED, trip.message)
            return
        policy = self.d.config.approvals.tools.get(call.name, tool.policy)
        if policy == "deny":
            await self.finish(conv, state, record, Outcome.DENIED,
                              f"denied: the `{call.name}` tool is disabled by Tandem's policy")
        elif policy == "allow" or await self.d.store.has_rule(
                conv.row.id, call.name, tool.rule_key(args)):
            await self._set(conv, record, CallState.ALLOWED)
        elif state.unattended and self.d.config.approvals.unattended == "deny":
            await self.finish(conv, state, record, Outcome.DENIED,
                              "denied: this is a scheduled run and nobody is there to approve "
                              f"`{call.name}`; tell the user what you would have run")
        else:
            await self._ask(conv, state, record, tool.summary(args))

    async def _ask(self, conv: Conversation, state: TurnState, record: CallRecord,
                   summary: str) -> None:
        now = time.time()
        expire = self.d.config.approvals.expire_after_s
        row = ApprovalRow(short_id(), conv.row.id, record.call.id, record.call.name, summary,
                          state.requester, "pending", now, now + expire)
        await self.d.store.add_approval(row)
        await self._set(conv, record, CallState.ASKING)
        await self.d.emit(ApprovalRequested(conv.row.key, row.id, row.tool, summary,
                                            User(state.requester), expire))

    async def _set(self, conv: Conversation, record: CallRecord, state: CallState) -> None:
        await self.d.store.set_call(conv.row.id, record.call.id, state)
        record.state = state

    async def finish(self, conv: Conversation, state: TurnState, record: CallRecord,
                     outcome: Outcome, text: str) -> None:
        """FINISHED with a result message: persisted first, then kept in memory."""
        result = tool_result(record.call, text, state.turn)
        stored = await self.d.store.set_call(conv.row.id, record.call.id, CallState.FINISHED,
                                             outcome, result, conv.row.session)
        assert stored is not None
        conv.append(stored)
        record.state, record.outcome = CallState.FINISHED, outcome

    # -- Run: one allowed call --------------------------------------------------------

    async def _run(self, conv: Conversation, state: TurnState, record: CallRecord,
                   cancel: asyncio.Event, scratch: _Scratch) -> None:
        call = record.call
        tool = self.d.tools.get(call.name)
        assert tool is not None
        args = parse_arguments(call.arguments)
        approval = await self.d.store.approval_for_call(conv.row.id, call.id)
        if approval is not None and approval.summary != tool.summary(args):
            await self.finish(conv, state, record, Outcome.DENIED,
                              "denied: the call differs from the one that was approved")
            return
        await self._emit_progress(conv, state, Phase.TOOL, scratch, call.name)
        task = asyncio.ensure_future(tool.run(self.d.tool_context(conv), args))
        waiter = asyncio.ensure_future(cancel.wait())
        try:
            while not (task.done() or waiter.done()):  # a tick so "for how long" stays true
                await asyncio.wait({task, waiter}, timeout=PROGRESS_TICK_S,
                                   return_when=asyncio.FIRST_COMPLETED)
                if not (task.done() or waiter.done()):
                    await self._emit_progress(conv, state, Phase.TOOL, scratch, call.name)
        finally:
            waiter.cancel()
        if not task.done():
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
            state.cancelled = True
            await self.finish(conv, state, record, Outcome.INTERRUPTED,
                              "interrupted: the user cancelled while this was running")
            return
        outcome, text = _tool_outcome(task, call.name, self.d.config.limits.tool_output_chars)
        await self.finish(conv, state, record, outcome, text)

    # -- Exit -------------------------------------------------------------------------

    async def _exit(self, conv: Conversation, state: TurnState, reason: ExitReason,
                    scratch: _Scratch) -> None:
        key = conv.row.key
        assert scratch.final is None or reason is not ExitReason.SUSPENDED
        if reason is ExitReason.SUSPENDED:
            await self.d.store.end_turn(conv.row.id, state.turn, "suspended", None)
            await self.d.emit(TurnEnded(key, state.turn, scratch.answer, reason.value,
                                        suspended=True))
            return
        why = {ExitReason.CANCELLED: "interrupted: the user cancelled the turn",
               ExitReason.BREAKER: "interrupted: the turn was stopped by a circuit breaker",
               ExitReason.ERROR: "interrupted: the turn ended with an error"}
        for record in state.calls:
            if record.state is not CallState.FINISHED:
                await self.finish(conv, state, record, Outcome.INTERRUPTED,
                                  why.get(reason, "interrupted"))
        last, step = scratch.final or (scratch.partial, None)
        stored = await self.d.store.end_turn(conv.row.id, state.turn, "done", reason.value,
                                             last, conv.row.session, step=step)
        if stored is not None:
            conv.append(stored)
        conv.turn = None
        await self.d.emit(TurnEnded(key, state.turn, self._final_text(state, reason, scratch),
                                    reason.value))

    def _final_text(self, state: TurnState, reason: ExitReason, scratch: _Scratch) -> str:
        match reason:
            case ExitReason.COMPLETED:
                return scratch.answer or "(The model returned an empty answer.)"
            case ExitReason.CANCELLED:  # what had streamed, or an answer just complete
                shown = scratch.partial or (scratch.final[0] if scratch.final else None)
                text = shown.content if shown else ""
                return f"{text}\n\n⏹ Cancelled." if text else "⏹ Cancelled."
            case ExitReason.MAX_STEPS:
                note = (f"I stopped after {state.max_steps} steps without finishing. "
                        "Say \"continue\" to let me go on.")
                return f"{scratch.answer}\n\n{note}" if scratch.answer else note
            case ExitReason.BREAKER:
                return state.fatal or "Stopped: a tool kept failing."
            case ExitReason.ERROR:
                return state.error or "Something went wrong."
            case _:
                return scratch.answer

    async def _emit_progress(self, conv: Conversation, state: TurnState, phase: Phase,
                             scratch: _Scratch, tool: str | None = None) -> None:
        await self.d.emit(Progress(conv.row.key, state.turn, phase, scratch.text, tool,
                                   time.monotonic() - scratch.started))


@dataclass(slots=True)
class _Scratch:
    """Per-drive display state: what has streamed, not what decides anything."""

    started: float
    text: str = ""
    answer: str = ""
    partial: Msg | None = None
    """A cancelled stream's text, stored as the turn ends."""
    final: tuple[Msg, tuple[int, Usage | None]] | None = None
    """The model's answer (a step without tool calls), stored as the turn ends."""


def _tool_outcome(task: asyncio.Future[str], name: str, limit: int) -> tuple[Outcome, str]:
    exc = task.exception()
    if exc is None:
        return Outcome.OK, cap(task.result(), limit)
    if isinstance(exc, ToolError):
        return Outcome.ERROR, cap(f"error: {exc}", limit)
    log.error("tool %s crashed", name, exc_info=exc)
    return Outcome.ERROR, f"error: `{name}` failed unexpectedly (details are in Tandem's logs)"

