"""The turn's state machine: `next_action` and every transition, table by table."""

from __future__ import annotations

from typing import Any

import pytest

from bot import turn as t
from bot.core.config import Breakers
from bot.core.events import User
from bot.core.history import CallState, Outcome, ToolCall

LIMITS = Breakers()
ANN = User("u1", "Ann")
S = CallState


def rec(i: str, state: CallState, approval: str | None = None,
        outcome: Outcome | None = None) -> t.CallRecord:
    if state is S.FINISHED and outcome is None:
        outcome = Outcome.OK
    return t.CallRecord(call=ToolCall(i, "shell", f'{{"command": "{i}"}}'), state=state,
                        outcome=outcome, approval_id=approval)


def st(*calls: t.CallRecord, **kw: Any) -> t.TurnState:
    return t.TurnState(turn=1, max_steps=3, calls=calls, **kw)


def states(state: t.TurnState) -> list[CallState]:
    return [r.state for r in state.calls]


# ---- next_action --------------------------------------------------------------------

ASK_A = rec("a", S.ASKING, "apA")
NEXT = [
    ("a fresh turn reasons", st(), t.Reason()),
    ("an allowed call runs even while another asks",
     st(ASK_A, rec("b", S.ALLOWED)), t.Run(rec("b", S.ALLOWED))),
    ("pending calls wait while a human is asked: suspension carries what it waits for",
     st(ASK_A, rec("b", S.PENDING)), t.Suspend((ASK_A,))),
    ("pending calls are decided in order",
     st(rec("a", S.FINISHED), rec("b", S.PENDING), rec("c", S.PENDING)),
     t.Decide(rec("b", S.PENDING))),
    ("plain text completes", st(steps=1, last_step_plain=True), t.Exit(t.ExitReason.COMPLETED)),
    ("the step budget is its own reason",
     st(rec("a", S.FINISHED), steps=3), t.Exit(t.ExitReason.MAX_STEPS)),
    ("below the budget it reasons again", st(rec("a", S.FINISHED), steps=2), t.Reason()),
    ("cancel comes first", st(rec("a", S.ALLOWED), cancelled=True),
     t.Exit(t.ExitReason.CANCELLED)),
    ("then an error", st(rec("a", S.ALLOWED), error="x"), t.Exit(t.ExitReason.ERROR)),
    ("then a breaker", st(rec("a", S.ALLOWED), fatal="x"), t.Exit(t.ExitReason.BREAKER)),
]


@pytest.mark.parametrize(("state", "action"), [(s, a) for _, s, a in NEXT],
                         ids=[n for n, _, _ in NEXT])
def test_next_action(state: t.TurnState, action: t.Action) -> None:
    before = repr(state)
    assert t.next_action(state) == action
    assert repr(state) == before  # pure


# ---- transitions --------------------------------------------------------------------


def test_a_model_step_adds_pending_calls_and_counts_the_step() -> None:
    state = t.model_step(st(), (ToolCall("a", "shell", "{}"),))
    assert (state.steps, states(state), state.last_step_plain) == (1, [S.PENDING], False)
    plain = t.model_step(state, ())
    assert plain.last_step_plain and plain.steps == 2


POLICY = [
    ("allow", t.Allow(), [S.ALLOWED], [t.SetCall("a", S.ALLOWED)]),
    ("refuse", t.Refuse(Outcome.DENIED, "denied: policy"), [S.FINISHED],
     [t.Finish("a", Outcome.DENIED, "denied: policy")]),
    ("ask", t.AskHuman("ls", "ap1", 60), [S.ASKING], [t.Ask("a", "ap1", "ls", 60)]),
]


@pytest.mark.parametrize(("verdict", "after", "effects"), [p[1:] for p in POLICY],
                         ids=[p[0] for p in POLICY])
def test_a_policy_verdict(verdict: t.Verdict, after: list[CallState],
                          effects: list[t.Effect]) -> None:
    step = t.decide(st(rec("a", S.PENDING)), LIMITS, "a", verdict)
    assert states(step.state) == after
    assert list(step.effects) == effects


def test_breakers_come_before_the_policy() -> None:
    same = [t.CallRecord(call=ToolCall(f"r{i}", "shell", '{"command": "ls"}'),
                         state=S.FINISHED, outcome=Outcome.OK) for i in range(5)]
    state = st(*same, t.CallRecord(call=ToolCall("n", "shell", '{"command":"ls"}')))
    step = t.decide(state, LIMITS, "n", t.Allow())
    [finish] = step.effects
    assert isinstance(finish, t.Finish) and finish.outcome is Outcome.SKIPPED
    assert step.state.fatal is None and "already" in finish.text


def test_the_fatal_tier_fires_right_after_the_eighth_failure() -> None:
    state = st(*[t.CallRecord(call=ToolCall(f"c{i}", "shell", f'{{"n": {i}}}'),
                              state=S.SUBMITTED) for i in range(8)])
    for i in range(8):
        assert state.fatal is None
        state = t.finish(state, LIMITS, f"c{i}", Outcome.ERROR, "error: exit 1").state
    assert state.fatal is not None and "8 times" in state.fatal
    assert t.next_action(state) == t.Exit(t.ExitReason.BREAKER)


DECISIONS = [
    (t.Press.APPROVE, [S.ALLOWED], [t.SetCall("a", S.ALLOWED), t.Resolve("apA", "approved", ANN)]),
    (t.Press.ALWAYS, [S.ALLOWED], [t.AddRule("shell", "a", ANN), t.SetCall("a", S.ALLOWED),
                                   t.Resolve("apA", "always", ANN)]),
]


@pytest.mark.parametrize(("press", "after", "effects"), DECISIONS, ids=["approve", "always"])
def test_a_press_on_a_live_card(press: t.Press, after: list[CallState],
                                effects: list[t.Effect]) -> None:
    step = t.human_decision(st(ASK_A), LIMITS, "apA", press, ANN, rule_key="a")
    assert states(step.state) == after
    assert list(step.effects) == effects


def test_a_denial_finishes_the_call_and_stores_before_it_resolves() -> None:
    step = t.human_decision(st(ASK_A, rec("b", S.PENDING)), LIMITS, "apA", t.Press.DENY, ANN)
    assert states(step.state) == [S.FINISHED, S.PENDING]
    finish, resolve = step.effects
    assert isinstance(finish, t.Finish) and finish.outcome is Outcome.DENIED
    assert resolve == t.Resolve("apA", "denied", ANN)
    assert t.next_action(step.state) == t.Decide(rec("b", S.PENDING))


def test_a_press_on_a_stale_card_only_closes_the_card() -> None:
    state = st(rec("a", S.FINISHED))
    step = t.human_decision(state, LIMITS, "apA", t.Press.APPROVE, ANN)
    assert step.state == state and step.effects == (t.Resolve("apA", "expired"),)


def test_expiry_denies_and_tells_the_chat() -> None:
    step = t.expire(st(ASK_A), LIMITS, "apA")
    assert [type(e) for e in step.effects] == [t.Finish, t.Resolve, t.Tell]
    assert step.effects[0] == t.Finish("a", Outcome.EXPIRED,
                                       "denied: nobody approved this call in time; do not "
                                       "retry it")


END = [
    ("exit on cancel closes live cards", lambda s: t.exit_turn(s, LIMITS, t.ExitReason.CANCELLED),
     "cancelled", None),
    ("cancel while waiting", lambda s: t.cancel_waiting(s, LIMITS, ANN), "cancelled",
     t.Close(t.ExitReason.CANCELLED, "⏹ Cancelled.")),
    ("supersede", lambda s: t.supersede(s, LIMITS, "a new message came"), "superseded",
     t.Close(t.ExitReason.SUPERSEDED, None)),
]


@pytest.mark.parametrize(("end", "status", "close"), [e[1:] for e in END],
                         ids=[e[0] for e in END])
def test_ending_a_turn_finishes_every_call_and_resolves_every_card(
        end: Any, status: str, close: t.Close | None) -> None:
    step: t.Step = end(st(ASK_A, rec("b", S.PENDING), rec("c", S.FINISHED)))
    assert states(step.state) == [S.FINISHED] * 3
    finishes = [e for e in step.effects if isinstance(e, t.Finish)]
    assert [f.call_id for f in finishes] == ["a", "b"]
    assert [e for e in step.effects if isinstance(e, t.Resolve)] == [
        t.Resolve("apA", status, ANN if status == "cancelled" and close else None)]
    closes = [e for e in step.effects if isinstance(e, t.Close)]
    assert closes == ([close] if close else [])


def test_supersede_says_in_words_what_did_not_run() -> None:
    step = t.supersede(st(ASK_A), LIMITS, "a new message came")
    [tell] = [e for e in step.effects if isinstance(e, t.Tell)]
    assert "`shell`" in tell.text and "a new message came" in tell.text


def test_a_scheduled_run_waits_for_a_turn_that_waits_for_a_human() -> None:
    assert t.trigger_arrives(None)
    assert not t.trigger_arrives(st(ASK_A))


RESTARTS = [
    ("a suspended turn stays suspended: PENDING and ASKING are kept",
     st(ASK_A, rec("b", S.PENDING)), False, [S.ASKING, S.PENDING], False, False),
    ("a decided turn goes on after a restart",
     st(rec("a", S.ALLOWED, "apA"), rec("b", S.PENDING)), False, [S.ALLOWED, S.PENDING],
     False, False),
    ("a running call is interrupted, the waiting card stays",
     st(rec("x", S.SUBMITTED), ASK_A), True, [S.FINISHED, S.ASKING], False, True),
    ("a running turn with nobody to ask ends and the chat is told",
     st(rec("x", S.SUBMITTED), rec("b", S.PENDING)), True, [S.FINISHED, S.FINISHED], True,
     True),
    ("a running turn without calls ends and the chat is told", st(), True, [], True, True),
]


@pytest.mark.parametrize(("state", "running", "after", "closed", "told"),
                         [r[1:] for r in RESTARTS], ids=[r[0] for r in RESTARTS])
def test_a_restart(state: t.TurnState, running: bool, after: list[CallState], closed: bool,
                   told: bool) -> None:
    step = t.restart(state, LIMITS, was_running=running)
    assert states(step.state) == after
    assert any(isinstance(e, t.Close) for e in step.effects) == closed
    assert any(isinstance(e, t.Tell) for e in step.effects) == told
    interrupted = [e for e in step.effects if isinstance(e, t.Finish)
                   and e.text.startswith("interrupted")]
    assert [f.call_id for f in interrupted] == [r.call.id for r in state.calls
                                                if r.state is S.SUBMITTED]


def test_a_call_is_submitted_before_it_runs() -> None:
    step = t.submitted(st(rec("a", S.ALLOWED)), "a")
    assert states(step.state) == [S.SUBMITTED]
    assert step.effects == (t.SetCall("a", S.SUBMITTED),)
    assert t.next_action(step.state) == t.Reason()  # a submitted call is never run twice
