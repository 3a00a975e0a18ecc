"""The turn's state, the actions `next_action` returns, and the effects of a step."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum

from bot.core.events import User
from bot.core.history import CallState, Outcome, ToolCall
from bot.turn.breakers import Ledger, TripKind


class ExitReason(StrEnum):
    COMPLETED = "completed"
    MAX_STEPS = "max_steps"
    CANCELLED = "cancelled"
    BREAKER = "breaker"
    ERROR = "error"
    SUPERSEDED = "superseded"
    """A new message (or `/new`) came while the turn waited for a human."""
    INTERRUPTED = "interrupted"
    """Tandem stopped while the turn ran; found at the next start."""
    BUDGET = "budget"
    """A daily budget was used up before a model call."""


@dataclass(frozen=True, kw_only=True, slots=True)
class CallRecord:
    call: ToolCall
    state: CallState = CallState.PENDING
    outcome: Outcome | None = None
    approval_id: str | None = None
    """The approval asked for this call, once a card is out."""
    skipped_by: TripKind | None = None


@dataclass(frozen=True, kw_only=True, slots=True)
class TurnState:
    turn: int
    max_steps: int
    steps: int = 0
    """Model calls made in this turn."""
    calls: tuple[CallRecord, ...] = ()
    """This turn's tool calls, in the order the model made them."""
    last_step_plain: bool = False
    """The latest model step produced text and no tool calls."""
    cancelled: bool = False
    fatal: str | None = None
    """Set by a fatal circuit breaker: the turn ends with this text."""
    error: str | None = None
    budget: str | None = None
    """Set when a daily budget is used up: the turn ends with this text."""
    unattended: bool = False
    """A scheduled run: nobody is watching to approve."""
    requester: str = ""
    ledger: Ledger = field(default_factory=Ledger)
    """The session's recent failures (breakers); carried from turn to turn."""

    def record(self, call_id: str) -> CallRecord | None:
        return next((r for r in self.calls if r.call.id == call_id), None)

    @property
    def waiting(self) -> tuple[CallRecord, ...]:
        return tuple(r for r in self.calls if r.state is CallState.ASKING)

    @property
    def open_calls(self) -> tuple[CallRecord, ...]:
        return tuple(r for r in self.calls if r.state is not CallState.FINISHED)


# ---- actions: what `next_action` returns ---------------------------------------------


@dataclass(frozen=True, slots=True)
class Reason:
    """Call the model."""


@dataclass(frozen=True, slots=True)
class Decide:
    """Apply breakers and the approval policy to a PENDING call."""

    record: CallRecord


@dataclass(frozen=True, slots=True)
class Run:
    """Run an ALLOWED call."""

    record: CallRecord


@dataclass(frozen=True, slots=True)
class Suspend:
    """Nothing can run until a human decides: the turn waits for these calls."""

    waiting: tuple[CallRecord, ...]


@dataclass(frozen=True, slots=True)
class Exit:
    reason: ExitReason


Action = Reason | Decide | Run | Suspend | Exit


def next_action(state: TurnState) -> Action:
    """Read the state, change nothing, return what to do next."""
    if state.cancelled:
        return Exit(ExitReason.CANCELLED)
    if state.error is not None:
        return Exit(ExitReason.ERROR)
    if state.fatal is not None:
        return Exit(ExitReason.BREAKER)
    if state.budget is not None:
        return Exit(ExitReason.BUDGET)
    if allowed := next((r for r in state.calls if r.state is CallState.ALLOWED), None):
        return Run(allowed)
    if waiting := state.waiting:
        return Suspend(waiting)  # no PENDING call starts while a human is reading a card
    if pending := next((r for r in state.calls if r.state is CallState.PENDING), None):
        return Decide(pending)
    if state.last_step_plain:
        return Exit(ExitReason.COMPLETED)
    if state.steps >= state.max_steps:
        return Exit(ExitReason.MAX_STEPS)
    return Reason()


# ---- effects: what a transition asks the runner to carry out ------------------------


@dataclass(frozen=True, slots=True)
class SetCall:
    call_id: str
    state: CallState


@dataclass(frozen=True, slots=True)
class Finish:
    """The call is FINISHED: store its result message."""

    call_id: str
    outcome: Outcome
    text: str


@dataclass(frozen=True, slots=True)
class Ask:
    """Record a pending approval and post its card."""

    call_id: str
    approval_id: str
    summary: str
    expires_in_s: int
    reason: str | None = None


@dataclass(frozen=True, slots=True)
class Resolve:
    """A pending approval is decided: record it, then update its card."""

    approval_id: str
    status: str
    """approved | denied | always | expired | cancelled | superseded"""
    by: User | None = None


@dataclass(frozen=True, slots=True)
class AddRule:
    tool: str
    key: str
    by: User | None = None
    session: bool = False
    """For this session of the conversation only (else "always", as configured)."""


@dataclass(frozen=True, slots=True)
class Tell:
    """Say something to the conversation, in words."""

    text: str


@dataclass(frozen=True, slots=True)
class Close:
    """The turn is over (it was waiting, or a restart found it): record it, say so."""

    reason: ExitReason
    text: str | None
    """What the chat is shown as the turn's end; None shows nothing more."""


Effect = SetCall | Finish | Ask | Resolve | AddRule | Tell | Close


@dataclass(frozen=True, slots=True)
class Step:
    state: TurnState
    effects: tuple[Effect, ...] = ()
