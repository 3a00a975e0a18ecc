"""`next_action` is pure: each state maps to one action, in the documented order."""

from __future__ import annotations

from bot.history import CallState, Outcome, ToolCall
from bot.loop import CallRecord, Decide, Exit, ExitReason, Reason, Run, TurnState, next_action


def rec(i: str, state: CallState) -> CallRecord:
    return CallRecord(call=ToolCall(i, "shell", "{}"), state=state,
                      outcome=Outcome.OK if state is CallState.FINISHED else None)


def st(**kw: object) -> TurnState:
    return TurnState(turn=1, max_steps=3, **kw)  # type: ignore[arg-type]


def test_a_fresh_turn_reasons() -> None:
    assert next_action(st()) == Reason()


def test_an_allowed_call_runs_even_while_another_asks() -> None:
    a, b = rec("a", CallState.ASKING), rec("b", CallState.ALLOWED)
    assert next_action(st(calls=[a, b])) == Run(b)


def test_pending_calls_wait_while_a_human_is_asked() -> None:
    a, b = rec("a", CallState.ASKING), rec("b", CallState.PENDING)
    assert next_action(st(calls=[a, b])) == Exit(ExitReason.SUSPENDED)
    assert not Exit(ExitReason.SUSPENDED).ends_turn


def test_pending_calls_are_decided_in_order() -> None:
    a, b = rec("a", CallState.FINISHED), rec("b", CallState.PENDING)
    assert next_action(st(calls=[a, b, rec("c", CallState.PENDING)])) == Decide(b)


def test_plain_text_completes() -> None:
    assert next_action(st(steps=1, last_step_plain=True)) == Exit(ExitReason.COMPLETED)


def test_step_budget_is_a_different_reason_from_completion() -> None:
    done = [rec("a", CallState.FINISHED)]
    assert next_action(st(steps=3, calls=done)) == Exit(ExitReason.MAX_STEPS)
    assert next_action(st(steps=2, calls=done)) == Reason()


def test_cancel_error_and_breaker_end_the_turn_first() -> None:
    running = [rec("a", CallState.ALLOWED)]
    assert next_action(st(calls=running, cancelled=True)) == Exit(ExitReason.CANCELLED)
    assert next_action(st(calls=running, error="x")) == Exit(ExitReason.ERROR)
    assert next_action(st(calls=running, fatal="x")) == Exit(ExitReason.BREAKER)


def test_next_action_changes_nothing() -> None:
    state = st(calls=[rec("a", CallState.PENDING)])
    before = repr(state)
    next_action(state)
    next_action(state)
    assert repr(state) == before
