"""Pure transitions: each takes the turn's state and what happened, and returns a `Step`
(the new state and the effects the runner carries out)."""

from __future__ import annotations

from dataclasses import dataclass, replace
from enum import StrEnum

from bot.core.config import Breakers
from bot.core.events import User
from bot.core.history import CallState, Outcome, ToolCall
from bot.turn.breakers import Seen, Trip, TripKind, after_failure, check
from bot.turn.state import (
    AddRule,
    Ask,
    CallRecord,
    Close,
    Effect,
    ExitReason,
    Finish,
    Resolve,
    SetCall,
    Step,
    Tell,
    TurnState,
)


def _with(turn: TurnState, record: CallRecord, /, **changes: object) -> TurnState:
    new = replace(record, **changes)  # type: ignore[arg-type]
    calls = tuple(new if r.call.id == record.call.id else r for r in turn.calls)
    return replace(turn, calls=calls)


def model_step(state: TurnState, calls: tuple[ToolCall, ...]) -> TurnState:
    """The model answered: its calls start PENDING; no calls means a plain answer."""
    return replace(state, steps=state.steps + 1, last_step_plain=not calls,
                   calls=state.calls + tuple(CallRecord(call=c) for c in calls))


def finish(state: TurnState, limits: Breakers, call_id: str, outcome: Outcome, text: str,
           skipped_by: TripKind | None = None) -> Step:
    """A call has its result. Failures go to the ledger; the fatal tier fires at once."""
    record = state.record(call_id)
    if record is None or record.state is CallState.FINISHED:
        return Step(state)
    ledger = state.ledger.record(record.call.name, record.call.arguments, outcome, skipped_by)
    new = _with(replace(state, ledger=ledger), record, state=CallState.FINISHED,
                outcome=outcome, skipped_by=skipped_by)
    if outcome is Outcome.ERROR and new.fatal is None:
        trip = after_failure(limits, ledger, record.call.name)
        if trip is not None:
            new = replace(new, fatal=trip.message)
    return Step(new, (Finish(call_id, outcome, text),))


@dataclass(frozen=True, slots=True)
class Allow:
    """The policy (or a standing rule) lets the call run."""


@dataclass(frozen=True, slots=True)
class Refuse:
    """The call cannot run: unknown tool, bad arguments, policy `deny`, nobody to ask."""

    outcome: Outcome
    text: str


@dataclass(frozen=True, slots=True)
class AskHuman:
    summary: str
    approval_id: str
    expires_in_s: int
    reason: str | None = None
    """Why a human is asked although the policy allows the tool (for the card)."""


Verdict = Allow | Refuse | AskHuman


def decide(state: TurnState, limits: Breakers, call_id: str, verdict: Verdict) -> Step:
    """Breakers first, then the policy's verdict on a PENDING call."""
    record = state.record(call_id)
    if record is None or record.state is not CallState.PENDING:
        return Step(state)
    seen = [Seen(r.call.name, r.call.arguments, r.outcome, r.skipped_by)
            for r in state.calls if r.outcome is not None]
    trip: Trip | None = check(limits, seen, state.ledger, record.call.name,
                                       record.call.arguments)
    if trip is not None:
        step = finish(state, limits, call_id, Outcome.SKIPPED, trip.message, trip.kind)
        if trip.fatal:
            return Step(replace(step.state, fatal=step.state.fatal or trip.message),
                        step.effects)
        return step
    match verdict:
        case Allow():
            return Step(_with(state, record, state=CallState.ALLOWED),
                        (SetCall(call_id, CallState.ALLOWED),))
        case Refuse(outcome, text):
            return finish(state, limits, call_id, outcome, text)
        case AskHuman(summary, approval_id, expires, reason):
            return Step(_with(state, record, state=CallState.ASKING, approval_id=approval_id),
                        (Ask(call_id, approval_id, summary, expires, reason),))


def submitted(state: TurnState, call_id: str) -> Step:
    """An ALLOWED call is handed to its tool."""
    record = state.record(call_id)
    assert record is not None and record.state is CallState.ALLOWED
    return Step(_with(state, record, state=CallState.SUBMITTED),
                (SetCall(call_id, CallState.SUBMITTED),))


class Press(StrEnum):
    APPROVE = "approved"
    DENY = "denied"
    ALWAYS = "always"
    SESSION = "session"


def human_decision(state: TurnState, limits: Breakers, approval_id: str, press: Press,
                   by: User, rule_key: str | None = None) -> Step:
    """Someone allowed to decide pressed a button on a live card."""
    record = next((r for r in state.waiting if r.approval_id == approval_id), None)
    if record is None:  # the call is no longer waiting: the card is stale
        return Step(state, (Resolve(approval_id, "expired"),))
    resolve = Resolve(approval_id, press.value, by)
    if press is Press.DENY:
        step = finish(state, limits, record.call.id, Outcome.DENIED,
                      f"denied: {by.name or by.id} did not approve this call; do not retry it")
        return Step(step.state, (*step.effects, resolve))
    effects: list[Effect] = [SetCall(record.call.id, CallState.ALLOWED), resolve]
    if press in (Press.ALWAYS, Press.SESSION) and rule_key is not None:
        effects.insert(0, AddRule(record.call.name, rule_key, by,
                                  session=press is Press.SESSION))
    return Step(_with(state, record, state=CallState.ALLOWED), tuple(effects))


def expire(state: TurnState, limits: Breakers, approval_id: str) -> Step:
    """Nobody decided in time: deny, and say so."""
    record = next((r for r in state.waiting if r.approval_id == approval_id), None)
    if record is None:
        return Step(state, (Resolve(approval_id, "expired"),))
    step = finish(state, limits, record.call.id, Outcome.EXPIRED,
                  "denied: nobody approved this call in time; do not retry it")
    notice = Tell(f"The approval for `{record.call.name}` expired, so it was not run.")
    return Step(step.state, (*step.effects, Resolve(approval_id, "expired"), notice))


def end_open_calls(state: TurnState, limits: Breakers, outcome: Outcome, text: str,
                   status: str, by: User | None = None) -> Step:
    """Finish every unfinished call; live cards are resolved with `status`."""
    effects: list[Effect] = []
    for record in state.open_calls:
        step = finish(state, limits, record.call.id, outcome, text)
        state = step.state
        effects.extend(step.effects)
        if record.approval_id is not None and record.state is CallState.ASKING:
            effects.append(Resolve(record.approval_id, status, by))
    return Step(state, tuple(effects))


_EXIT_RESULTS = {
    ExitReason.CANCELLED: "interrupted: the user cancelled the turn",
    ExitReason.BREAKER: "interrupted: the turn was stopped by a circuit breaker",
    ExitReason.ERROR: "interrupted: the turn ended with an error",
    ExitReason.BUDGET: "interrupted: the daily budget was used up",
}


def exit_turn(state: TurnState, limits: Breakers, reason: ExitReason) -> Step:
    """The running turn ends: what never finished is interrupted, live cards close."""
    text = _EXIT_RESULTS.get(reason, "interrupted")
    return end_open_calls(state, limits, Outcome.INTERRUPTED, text, "cancelled")


def cancel_waiting(state: TurnState, limits: Breakers, by: User) -> Step:
    """Cancel pressed while the turn waits for a human (nothing is running)."""
    step = end_open_calls(state, limits, Outcome.INTERRUPTED,
                          "interrupted: the user cancelled the turn", "cancelled", by)
    return Step(step.state, (*step.effects, Close(ExitReason.CANCELLED, "⏹ Cancelled.")))


def supersede(state: TurnState, limits: Breakers, why: str) -> Step:
    """A new message (or `/new`) arrives while the turn waits for a human: the waiting
    calls are not run, and the chat is told which ones."""
    names = sorted({r.call.name for r in state.open_calls})
    step = end_open_calls(state, limits, Outcome.DENIED, f"not run: {why}", "superseded")
    told = (Tell(f"Not run: `{'`, `'.join(names)}` ({why})."),) if names else ()
    return Step(step.state, (*step.effects, *told, Close(ExitReason.SUPERSEDED, None)))


def trigger_arrives(state: TurnState | None) -> bool:
    """A scheduled run may start now; False while a turn waits for a human (the run
    waits for that turn to end rather than deny the human's pending approval)."""
    return state is None


def restart(state: TurnState, limits: Breakers, was_running: bool) -> Step:
    """A start found this turn unfinished.

    Only a call that was handed to its tool is interrupted (it may or may not have
    completed). A turn waiting for a human stays suspended with its cards and timers; a
    suspended one whose human decided since (approved, denied, or it expired) goes on,
    whatever the decision. A turn that was running with nobody to ask ends: its other
    calls never ran.
    """
    effects: list[Effect] = []
    interrupted = [r.call.name for r in state.calls if r.state is CallState.SUBMITTED]
    for record in state.calls:
        if record.state is CallState.SUBMITTED:
            step = finish(state, limits, record.call.id, Outcome.INTERRUPTED,
                          "interrupted: Tandem stopped while this call was running; it may "
                          "or may not have completed")
            state = step.state
            effects.extend(step.effects)
    what = f" (`{'`, `'.join(interrupted)}` was interrupted)" if interrupted else ""
    if state.waiting or not was_running:
        if interrupted:
            effects.append(Tell(f"Tandem restarted{what}; the rest of this turn goes on."))
        return Step(state, tuple(effects))
    dropped = sorted({r.call.name for r in state.open_calls})
    step = end_open_calls(state, limits, Outcome.INTERRUPTED,
                          "not run: Tandem restarted before this call ran", "cancelled")
    effects.extend(step.effects)
    if was_running or interrupted or dropped:
        extra = f"; `{'`, `'.join(dropped)}` did not run" if dropped else ""
        effects.append(Tell(f"An earlier answer here was interrupted{what}{extra}. "
                            "Send your message again if you still need the answer."))
    effects.append(Close(ExitReason.INTERRUPTED, None))
    return Step(step.state, tuple(effects))


def final_text(state: TurnState, reason: ExitReason, answer: str, shown: str) -> str:
    """What the chat is shown as the end of a running turn (`shown`: the text on screen
    when it was cancelled). An answer with no visible text counts as none."""
    answer = answer if answer.strip() else ""
    shown = shown if shown.strip() else ""
    match reason:
        case ExitReason.COMPLETED:
            return answer or "(The model returned an empty answer.)"
        case ExitReason.CANCELLED:
            return f"{shown}\n\n⏹ Cancelled." if shown else "⏹ Cancelled."
        case ExitReason.MAX_STEPS:
            note = (f"I stopped after {state.max_steps} steps without finishing. "
                    "Say \"continue\" to let me go on.")
            return f"{answer}\n\n{note}" if answer else note
        case ExitReason.BREAKER:
            return state.fatal or "Stopped: a tool kept failing."
        case ExitReason.ERROR:
            return state.error or "Something went wrong."
        case ExitReason.BUDGET:
            return f"{answer}\n\n{state.budget}" if answer else state.budget or ""
        case _:
            return answer
