"""The store: one narrow async interface; no SQL outside its implementations.

SQLite (`bot.store.sqlite`) is the embedded default; PostgreSQL (`bot.store.postgres`,
for several workers) implements the same `Store` protocol. Callers build one with
`bot.store.backends.open_store` and see only `Store`.

Calls and turns are addressed by (conversation, session, ...): a new session starts
its turn numbers again at 1, and providers reuse call ids such as `call_0`.

Layer: above `bot.core` only, beside `bot.llm` (neither imports the other). It may
import `bot.core` alone.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Protocol

from bot.core.events import ConvKey
from bot.core.history import CallState, Msg, Outcome, ToolCall
from bot.core.invisible import visible

Usage = tuple[int, int, float]
"""A model call's prompt tokens, completion tokens and cost."""


OPEN_KINDS = ("message", "trigger", "decision")
"""Inbound kinds that stay open until processed (a crash in between replays them)."""


def new_id() -> str:
    """A short random id (approvals, rules, jobs)."""
    return uuid.uuid4().hex[:12]


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
    conv_id: int
    session: int
    turn: int
    status: str
    """running | suspended | done"""
    steps: int
    requester: str
    unattended: bool
    reason: str | None = None
    unshown: str | None = None
    """A done turn's final text while it is not known to be shown in the chat (a
    process died between storing the answer and showing it): shown by the next load."""
    live: str | None = None
    """Where the turn's live message (its placeholder) was posted: the platform's own
    JSON, so that another process can finish that message."""


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
    session: int
    call_id: str
    tool: str
    summary: str
    requester: str
    status: str
    """pending | approved | denied | always | expired | cancelled | superseded"""
    created_at: float
    expires_at: float
    decided_by: str | None = None

    def remaining_s(self) -> int:
        """Seconds until it expires (0 once it has)."""
        return max(0, int(self.expires_at - time.time()))


@dataclass(frozen=True, slots=True)
class RuleRow:
    """A standing rule: `tool` with exactly `key` runs without asking."""

    id: str
    conv_id: int
    tool: str
    key: str
    created_at: float = 0.0
    session: int | None = None
    """Only in this session of the conversation (until `/new`); None: in every one."""
    user: str = ""
    """Only for calls in this person's turns; empty: everyone's."""
    author: str = ""
    """Who made it: a user id (empty for rules older than this record)."""
    expires_at: float | None = None
    """None: until revoked."""
    author_name: str = ""


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


@dataclass(frozen=True, slots=True)
class AuditRow:
    """One entry of the audit log: what happened (`kind`), where, who did it, to which
    tool, and the rest as JSON (`detail`)."""

    at: float
    kind: str
    """asked | decided | rule | tool | refused | budget"""
    conv: str = ""
    """The conversation (`ConvKey` as text), or "" (a refused stranger's DM, say)."""
    actor: str = ""
    tool: str = ""
    detail: str = "{}"
    id: int = 0

    @staticmethod
    def iso(at: float) -> str:
        """A time as the audit log writes it: UTC, to the second (2026-12-01T09:30:00Z)."""
        return datetime.fromtimestamp(at, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")

    def line(self) -> str:
        """This entry as one line of text (`tandem audit`, `/audit`): line breaks, control
        characters and invisible ones written out (⟨U+000A⟩), so no entry can forge
        another or rewrite what the terminal showed before it."""
        detail: dict[str, Any] = json.loads(self.detail)
        who = f" by {self.actor}" if self.actor else ""
        call = f"{self.tool} {detail.get('call', '')}"
        match self.kind:
            case "asked":
                what = f"asked{who}: {call} (expires {detail.get('expires')})"
            case "decided":
                what = f"{detail.get('status')}{who}: {call} (after {detail.get('waited_s')} s)"
            case "tool":
                what = f"ran{who}: {call} → {detail.get('outcome')} in {detail.get('seconds')} s"
            case "rule":
                what = f"rule {detail.get('change')}{who}: {self.tool} {detail.get('key', '')}"
            case "refused":
                what = f"refused {detail.get('what')} of {detail.get('platform')} user {self.actor}"
            case _:
                rest = ", ".join(f"{k}={v}" for k, v in detail.items())
                what = f"{self.kind}{who}: {rest}"
        where = f" [{self.conv}]" if self.conv else ""
        return visible(f"{self.iso(self.at)}{where} {what}", one_line=True)

    def as_json(self) -> str:
        """This entry as a JSON line (`tandem audit --json`)."""
        return json.dumps({"at": self.iso(self.at), "kind": self.kind, "conversation": self.conv,
                           "actor": self.actor, "tool": self.tool, **json.loads(self.detail)},
                          ensure_ascii=False)


@dataclass(frozen=True, slots=True)
class Spent:
    """What a scope (a person, a conversation) spent on a day, and whether an approver
    lifted its budget for that day."""

    tokens: int = 0
    cost: float = 0.0
    lifted: bool = False


@dataclass(frozen=True, slots=True)
class TalkRow:
    """A message of a chat as Tandem keeps it beside the conversation: one it was sent
    (`said`, for edits of it to find), group talk not addressed to it (`aside`), or what
    became of a message after its turn (`edit`, `deleted`), for the next turn to read."""

    place: str
    message_id: str
    kind: str
    """said | aside | edit | deleted"""
    author_id: str
    author: str
    outside: bool
    """Written by someone who is not an allowed user (content from outside)."""
    text: str
    at: float = 0.0
    before: str = ""
    """An edit's earlier text."""


class Store(Protocol):
    # -- plumbing
    async def open(self) -> None:
        """Connect and bring the schema up to date (raises StoreError)."""
    async def close(self) -> None: ...
    async def integrity_check(self) -> str:
        """'ok', or what the backend found wrong."""

    # -- conversations
    async def conversation(self, key: ConvKey) -> ConvRow:
        """The conversation for `key`, created on first use (session 1)."""
    async def conversation_by_id(self, conv_id: int) -> ConvRow | None: ...
    async def new_session(self, conv_id: int) -> int:
        """Start the next session; returns its number."""

    # -- history and turns
    async def history(self, conv_id: int, session: int) -> list[Msg]:
        """The session's messages, oldest first."""
    async def begin_turn(self, conv_id: int, session: int, messages: Sequence[Msg],
                         requester: str, unattended: bool,
                         refs: Sequence[str]) -> list[Msg] | None:
        """Store the turn's opening messages and a running turn row (numbered by
        messages[0].turn) and mark the inbound `refs` done, in one commit; returns the
        messages as stored. None, and nothing stored, when `refs` were given and every
        one of them was done already (a copy of inbound that was processed: this is
        what makes each inbound start at most one turn). A turn that already exists in
        this session is an error."""
    async def add_to_turn(self, conv_id: int, session: int, messages: Sequence[Msg],
                          refs: Sequence[str]) -> list[Msg] | None:
        """Messages given to a running turn (`busy: steer`), their inbound marked processed,
        in one commit; None when that inbound was processed already."""
    async def append_assistant(self, conv_id: int, session: int, msg: Msg, steps: int,
                               usage: Usage | None = None) -> Msg:
        """The model's step, its tool calls (PENDING), the step count and usage, in one
        commit. Returns the message as stored."""
    async def set_call(self, conv_id: int, session: int, call_id: str, state: CallState,
                       outcome: Outcome | None = None,
                       result: Msg | None = None) -> Msg | None:
        """Move a call to `state`; `result` (its tool message) is stored in the same
        commit and returned as stored."""
    async def turn_calls(self, conv_id: int, session: int, turn: int) -> list[CallRow]:
        """The turn's tool calls in creation order."""
    async def finished_calls(self, conv_id: int, session: int, limit: int) -> list[CallRow]:
        """The latest `limit` FINISHED calls of the session, oldest first."""
    async def end_turn(self, conv_id: int, session: int, turn: int, status: str,
                       reason: str | None, last: Msg | None = None, *,
                       step: tuple[int, Usage | None] | None = None,
                       show: str | None = None) -> Msg | None:
        """Set the turn's status and reason; `last` (a partial answer, or with `step`
        the model's final step with its step count and usage) is stored in the same
        commit, and so is `show`, the final text to show (the turn's `unshown` until
        `shown`). Returns `last` as stored."""
    async def shown(self, conv_id: int, session: int, turn: int) -> None:
        """The turn's final text reached the chat."""
    async def set_live(self, conv_id: int, session: int, turn: int, where: str) -> None:
        """Where the turn's live message was posted (the platform's own JSON)."""
    async def last_turn(self, conv_id: int, session: int) -> TurnRow | None: ...
    async def open_turns(self) -> list[TurnRow]:
        """Every turn not done (running or suspended) or whose end was never shown, in
        all conversations."""

    # -- summaries
    async def summary(self, conv_id: int, session: int) -> tuple[int, str] | None:
        """(through_id, text): the text summarizes every message with id <= through_id."""
    async def set_summary(self, conv_id: int, session: int, through_id: int,
                          text: str) -> None:
        """Replace the session's summary."""

    # -- inbound
    async def accept_inbound(self, ref: str, conv: ConvKey, kind: str, payload: str) -> bool:
        """Record an inbound id; False if it was seen before (a redelivery)."""
    async def unprocessed_inbound(self) -> list[tuple[str, str, str]]:
        """(ref, kind, payload) of messages, triggers and presses never processed."""
    async def open_inbound(self, conv: ConvKey) -> list[tuple[str, str, str]]:
        """(ref, kind, payload) of `conv`'s inbound not processed yet, in the order it was
        received."""
    async def inbound_open(self, ref: str) -> bool:
        """The inbound `ref` is recorded and not processed yet."""
    async def heard_in(self, conv: ConvKey) -> bool:
        """Some inbound of `conv` was recorded (Tandem was addressed there)."""
    async def mark_inbound_done(self, refs: Sequence[str]) -> None: ...

    # -- approvals
    async def add_approval(self, row: ApprovalRow) -> None:
        """Record a pending approval and move its call to ASKING, in one commit."""
    async def approval(self, approval_id: str) -> ApprovalRow | None: ...
    async def approval_for_call(self, conv_id: int, session: int,
                                call_id: str) -> ApprovalRow | None:
        """The newest approval asked for this call."""
    async def decide(self, approval_id: str, status: str, by: str | None) -> bool:
        """Move a pending approval to `status`; False when it was already decided."""
    async def pending_approvals(self, conv_id: int | None = None) -> list[ApprovalRow]: ...
    async def set_card(self, approval_id: str, card: str) -> None:
        """Where the approval's card was posted (the platform's own JSON), so whichever
        process resolves the approval can edit that card."""
    async def card(self, approval_id: str) -> str | None: ...

    # -- rules
    async def add_rule(self, conv_id: int, tool: str, key: str, *, author: str = "",
                       author_name: str = "", session: int | None = None, user: str = "",
                       expires_at: float | None = None) -> None:
        """Add a standing rule (one of the same scope is replaced: its author and expiry
        are the new ones)."""

    async def has_rule(self, conv_id: int, tool: str, key: str, *, session: int = 0,
                       user: str = "", now: float | None = None) -> bool:
        """A rule holds for this call: not expired, in every session or `session`, for
        everyone or `user`."""

    async def rules(self, conv_id: int, *, session: int | None = None,
                    now: float | None = None) -> list[RuleRow]:
        """The rules in force (those of `session` and of every session), oldest first."""

    async def delete_rule(self, conv_id: int, rule_id: str) -> bool: ...

    # -- jobs
    async def add_job(self, row: JobRow) -> None: ...
    async def jobs(self, conv_id: int | None = None) -> list[JobRow]:
        """Active jobs, oldest first."""
    async def job(self, job_id: str) -> JobRow | None: ...
    async def claim_slot(self, job_id: str, slot: float, ref: str, conv: ConvKey,
                         payload: str, *, last: bool = False) -> bool:
        """Claim the run for `slot` and record its trigger inbound, in one commit; False
        if this slot or a later one was claimed. `last` retires a one-shot job."""
    async def deactivate_job(self, job_id: str) -> bool: ...

    # -- tool processes (each worker's own: `owner` names it; "" for a lone process)
    async def track_process(self, pid: int, owner: str = "") -> None: ...
    async def untrack_process(self, pid: int, owner: str = "") -> None: ...
    async def tracked_processes(self, owner: str = "") -> list[int]: ...
    async def forget_processes(self, owner: str = "") -> None: ...

    # -- the audit log (append-only: nothing here updates or deletes an entry but the
    # pruning of old ones)
    async def append_audit(self, rows: Sequence[AuditRow]) -> None: ...
    async def audit(self, *, since: float | None = None, conv: str | None = None,
                    limit: int = 1000) -> list[AuditRow]:
        """The latest `limit` entries (of `conv`, from `since` on), oldest first."""
    async def prune_audit(self, before: float) -> int:
        """Delete the entries older than `before`; how many went."""

    # -- spending (budgets): scopes are "user:<platform>:<id>" and "conv:<id>"
    async def add_spend(self, day: str, scopes: Sequence[str], tokens: int,
                        cost: float) -> None:
        """Add to each scope's spending of `day`, in one commit."""
    async def spent(self, day: str, scopes: Sequence[str]) -> dict[str, Spent]:
        """Each scope's spending of `day` (scopes with none are left out)."""
    async def lift_budget(self, day: str, scope: str) -> None:
        """The scope's budget does not apply for the rest of `day`."""

    # -- the talk around a conversation (places are `str(ConvKey)`)
    async def keep_talk(self, row: TalkRow, keep: int) -> None:
        """Add a row; the place keeps its newest `keep` rows of that kind."""
    async def talk_of(self, place: str, message_id: str) -> TalkRow | None:
        """The `said` or `aside` row of a message, if Tandem saw it."""
    async def edit_talk(self, place: str, message_id: str, text: str) -> bool:
        """Change a kept message's text; True if an aside no turn has read was changed."""
    async def take_talk(self, places: Sequence[str]) -> list[TalkRow]:
        """The asides, edits and deletions no turn has read yet, oldest first; from now
        on they count as read."""
    async def forget_talk(self, places: Sequence[str]) -> None:
        """Drop everything kept about these places (`/new`)."""
    async def talk_authors(self, place: str) -> list[str]:
        """Who sent the messages for Tandem kept for a place, first to speak first."""

    # -- what a chat chose
    async def chat_model(self, conv_id: int) -> str | None:
        """The model the conversation switched to with `/model` (None: the configured one)."""
    async def set_chat_model(self, conv_id: int, model: str | None, by: str) -> None:
        """Switch the conversation to `model` (None: back to the configured one)."""
