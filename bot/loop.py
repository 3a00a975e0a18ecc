"""The reply loop's decision: a pure function from turn state to the next action.

The runner executes the action and persists its effect; it never decides whether to
stop. Everything here is data read from the store, so a suspended turn resumes by
running `next_action` again, in this process or after a restart.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum

from bot.history import CallState, Outcome, ToolCall


class ExitReason(StrEnum):
    COMPLETED = "completed"
    MAX_STEPS = "max_steps"
    CANCELLED = "cancelled"
    BREAKER = "breaker"
    ERROR = "error"
    SUSPENDED = "suspended"
    """Waiting for a human; not an end."""


@dataclass(kw_only=True, slots=True)
class CallRecord:
    call: ToolCall
    state: CallState = CallState.PENDING
    outcome: Outcome | None = None


@dataclass(kw_only=True, slots=True)
class TurnState:
    turn: int
    steps: int = 0
    """Model calls made in this turn."""
    max_steps: int
    calls: list[CallRecord] = field(default_factory=list)
    """This turn's tool calls, in the order the model made them."""
    last_step_plain: bool = False
    """The latest model step produced text and no tool calls."""
    cancelled: bool = False
    fatal: str | None = None
    """Set by the fatal circuit breaker: the turn must end."""
    error: str | None = None
    unattended: bool = False
    """A scheduled run: nobody is watching to approve."""
    requester: str = ""


@dataclass(frozen=True, slots=True)
class Reason:
    pass


@dataclass(frozen=True, slots=True)
class Decide:
    """Apply breakers and the approval policy to a PENDING call."""

    record: CallRecord


@dataclass(frozen=True, slots=True)
class Run:
    """Run an ALLOWED call."""

    record: CallRecord


@dataclass(frozen=True, slots=True)
class Exit:
    reason: ExitReason

    @property
    def ends_turn(self) -> bool:
        return self.reason is not ExitReason.SUSPENDED


Action = Reason | Decide | Run | Exit


def next_action(state: TurnState) -> Action:
    """Read the state, change nothing, return what to do next."""
    if state.cancelled:
        return Exit(ExitReason.CANCELLED)
    if state.error is not None:
        return Exit(ExitReason.ERROR)
    if state.fatal is not None:
        return Exit(ExitReason.BREAKER)
    action = _call_action(state.calls)
    if action is not None:
        return action
    if state.last_step_plain:
        return Exit(ExitReason.COMPLETED)
    if state.steps >= state.max_steps:
        return Exit(ExitReason.MAX_STEPS)
    return Reason()


def _call_action(calls: list[CallRecord]) -> Action | None:
    """Run an allowed call; else decide a pending one unless a human is being asked."""
    if allowed := next((r for r in calls if r.state is CallState.ALLOWED), None):
        return Run(allowed)
    if any(r.state in (CallState.ASKING, CallState.SUBMITTED) for r in calls):
        return Exit(ExitReason.SUSPENDED)
    if pending := next((r for r in calls if r.state is CallState.PENDING), None):
        return Decide(pending)
    return None
