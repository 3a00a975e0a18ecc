"""The store: one narrow async interface; no SQL outside its implementations.

SQLite (`bot.store.sqlite`) is the embedded default; a PostgreSQL implementation
would implement the same `Store` protocol.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from bot.events import ConvKey
from bot.history import CallState, Msg, Outcome, ToolCall

Usage = tuple[int, int, float]
"""A model call's prompt tokens, completion tokens and cost."""


@dataclass(frozen=True, slots=True)
class ConvRow:
    id: int
    key: ConvKey
    session: int
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cost: float = 0.0


@dataclass(frozen=True, slots=True)
class TurnRow:
    turn: int
    status: str
    """running | suspended | done"""
    steps: int
    requester: str
    unattended: bool
    reason: str | None = None


@dataclass(frozen=True, slots=True)
class CallRow:
    call: ToolCall
    turn: int
    state: CallState
    outcome: Outcome | None


@dataclass(frozen=True, slots=True)
class ApprovalRow:
    id: str
    conv_id: int
    call_id: str
    tool: str
    summary: str
    requester: str
    status: str
    """pending | approved | denied | always | expired | cancelled | superseded"""
    created_at: float
    expires_at: float
    decided_by: str | None = None


@dataclass(frozen=True, slots=True)
class RuleRow:
    id: str
    conv_id: int
    tool: str
    key: str


@dataclass(frozen=True, slots=True)
class JobRow:
    id: str
    conv_id: int
    key: ConvKey
    spec: str
    """The schedule as given: a time, an interval or a cron expression."""
    kind: str
    """date | interval | cron"""
    prompt: str
    created_by: str
    last_slot: float | None
    """The scheduled time of the last run claimed (so a slot never runs twice)."""
    active: bool
    anchor: float
    """A one-shot job's time, or when a recurring job was created (intervals count from it)."""


class Store(Protocol):
    async def open(self) -> None: ...
    async def close(self) -> None: ...

    async def conversation(self, key: ConvKey) -> ConvRow: ...
    async def conversation_by_id(self, conv_id: int) -> ConvRow | None: ...
    async def new_session(self, conv_id: int) -> int: ...
    async def add_usage(self, conv_id: int, prompt: int, completion: int, cost: float) -> None: ...

    async def history(self, conv_id: int, session: int) -> list[Msg]: ...
    async def last_turn(self, conv_id: int, session: int) -> TurnRow | None: ...
    async def turn_calls(self, conv_id: int, turn: int) -> list[CallRow]: ...

    async def accept_inbound(self, ref: str, conv: ConvKey, kind: str, payload: str) -> bool: ...
    async def unprocessed_inbound(self) -> list[tuple[str, str, str]]: ...
    async def begin_turn(self, conv_id: int, session: int, messages: Sequence[Msg],
                         requester: str, unattended: bool, refs: Sequence[str]) -> list[Msg]: ...
    async def append_assistant(self, conv_id: int, session: int, msg: Msg, steps: int,
                               usage: Usage | None = None) -> Msg: ...
    async def set_call(self, conv_id: int, call_id: str, state: CallState,
                       outcome: Outcome | None = None, result: Msg | None = None,
                       session: int = 0) -> Msg | None: ...
    async def end_turn(self, conv_id: int, turn: int, status: str, reason: str | None,
                       last: Msg | None = None, session: int = 0, *,
                       step: tuple[int, Usage | None] | None = None) -> Msg | None: ...
    async def open_turns(self) -> list[tuple[int, int]]: ...

    async def add_approval(self, row: ApprovalRow) -> None: ...
    async def approval(self, approval_id: str) -> ApprovalRow | None: ...
    async def approval_for_call(self, conv_id: int, call_id: str) -> ApprovalRow | None: ...
    async def decide(self, approval_id: str, status: str, by: str | None) -> bool: ...
    async def pending_approvals(self, conv_id: int | None = None) -> list[ApprovalRow]: ...

    async def add_rule(self, conv_id: int, tool: str, key: str) -> None: ...
    async def has_rule(self, conv_id: int, tool: str, key: str) -> bool: ...
    async def rules(self, conv_id: int) -> list[RuleRow]: ...
    async def delete_rule(self, conv_id: int, rule_id: str) -> bool: ...

    async def add_job(self, row: JobRow) -> None: ...
    async def jobs(self, conv_id: int | None = None) -> list[JobRow]: ...
    async def job(self, job_id: str) -> JobRow | None: ...
    async def claim_slot(self, job_id: str, slot: float, ref: str, conv: ConvKey,
                         payload: str, *, last: bool = False) -> bool: ...
    async def deactivate_job(self, job_id: str) -> bool: ...

    async def track_process(self, pid: int) -> None: ...
    async def untrack_process(self, pid: int) -> None: ...
    async def tracked_processes(self) -> list[int]: ...
