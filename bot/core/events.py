"""What enters the core (`Inbound`) and what leaves it (`Event`).

Adapters build `Inbound` values from platform updates and render `Event`s back as
messages, edits and buttons. No platform object ever crosses into `bot/`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any


@dataclass(frozen=True, slots=True)
class ConvKey:
    """One conversation: a DM, a group, a forum topic or a thread."""

    platform: str
    chat_id: str
    thread_id: str | None = None
    member: str | None = None
    """With `groups.sessions: per_user`: the member whose own conversation this is, in a
    group or thread that others share (where it is shown is the rest of the key)."""

    def __str__(self) -> str:
        tail = f"/{self.thread_id}" if self.thread_id else ""
        who = f"~{self.member}" if self.member else ""
        return f"{self.platform}:{self.chat_id}{tail}{who}"

    @property
    def place(self) -> ConvKey:
        """The chat, topic or thread itself, whoever's conversation this is there."""
        return ConvKey(self.platform, self.chat_id, self.thread_id) if self.member else self

    def stored_thread(self) -> str:
        """The thread and the member as one column of the store."""
        return (self.thread_id or "") + (f"~{self.member}" if self.member else "")

    @classmethod
    def stored(cls, platform: str, chat_id: str, thread: str | None) -> ConvKey:
        """The key `stored_thread` wrote."""
        thread_id, _, member = (thread or "").partition("~")
        return cls(platform, chat_id, thread_id or None, member or None)


@dataclass(frozen=True, slots=True)
class User:
    id: str
    name: str = ""
    team: str | None = None
    """The workspace (Slack team) the user belongs to, where the platform has one."""


@dataclass(frozen=True, slots=True)
class Attachment:
    """A file sent with a message, not yet fetched."""

    name: str
    mime: str
    size: int
    """As the platform declares it (0 when it does not say)."""
    kind: str = "file"
    """What the platform says it is: image | audio | video | file."""
    source: str = ""
    """Where the platform's adapter fetches it from (a file id, a private URL)."""


class Verdict(StrEnum):
    APPROVE = "approve"
    DENY = "deny"
    ALWAYS = "always"
    """This call, without asking, in this chat from now on (`approvals.always_*`)."""
    SESSION = "session"
    """This call, without asking, until the conversation starts afresh (`/new`)."""


@dataclass(frozen=True, slots=True)
class Quote:
    """Another message that a message replies to, quotes or forwards."""

    text: str
    author: User | None = None
    """Who wrote it, where the platform says and it is a person (None: a channel, a
    hidden sender, or nobody known)."""
    by_tandem: bool = False
    """One of Tandem's own messages."""
    origin: str = ""
    """Who it came from, in words, when `author` cannot say (a channel, a bot, a hidden
    sender)."""


@dataclass(frozen=True, slots=True)
class UserMessage:
    conv: ConvKey
    user: User
    text: str
    ref: str | None = None
    """Platform id of the update/event (`tg:42`, `slack:Ev01`): recorded so it runs once."""
    attachments: tuple[Attachment, ...] = ()
    context: str | None = None
    """Earlier thread messages fetched once when the bot joins a thread."""
    message_id: str | None = None
    """The platform's id of the message itself (what an edit of it names)."""
    quote: Quote | None = None
    """The message it replies to or quotes."""
    forwarded: Quote | None = None
    """Set when the message is a forward: where it came from (its text is `text`)."""
    around: ConvKey | None = None
    """Where the talk around the message is kept when that is not `conv` (a Slack channel
    whose mention starts a thread)."""
    received_at: float = 0.0
    """When Tandem took it (`time.time()`; 0: not known, as for one replayed after a
    restart). One taken before a card existed does not supersede that card."""


@dataclass(frozen=True, slots=True)
class Aside:
    """A message in a group that was not addressed to Tandem, kept as context (never
    answered). Anyone in the group may have written it."""

    conv: ConvKey
    user: User
    text: str
    message_id: str
    quote: Quote | None = None
    ref: str | None = None


@dataclass(frozen=True, slots=True)
class Edit:
    """A message was edited (or, with `deleted`, deleted) after it was sent."""

    conv: ConvKey
    user: User
    message_id: str
    text: str = ""
    deleted: bool = False
    ref: str | None = None


@dataclass(frozen=True, slots=True)
class Decision:
    conv: ConvKey
    user: User
    approval_id: str
    verdict: Verdict
    ref: str | None = None


@dataclass(frozen=True, slots=True)
class Cancel:
    conv: ConvKey
    user: User
    ref: str | None = None
    turn: int | None = None
    """The turn the pressed button belongs to; None (`/stop`) means whatever runs now."""
    session: int | None = None
    """The session of that turn (a button from before a `/new` stops nothing)."""


@dataclass(frozen=True, slots=True)
class Trigger:
    conv: ConvKey
    job_id: str
    prompt: str
    late: bool = False
    ref: str | None = None
    requester: str = ""
    """Who scheduled the job (may approve its calls when unattended runs ask)."""


@dataclass(frozen=True, slots=True)
class Command:
    conv: ConvKey
    user: User
    name: str
    args: str = ""
    ref: str | None = None


Inbound = UserMessage | Decision | Cancel | Trigger | Command | Aside | Edit


# ---- outbound -------------------------------------------------------------------------


class Phase(StrEnum):
    THINKING = "thinking"
    TOOL = "running"


@dataclass(frozen=True, slots=True)
class TurnStarted:
    """A turn began: show a placeholder with a Cancel button."""

    conv: ConvKey
    turn: int
    session: int | None = None
    """The conversation's session (its Cancel button carries it)."""


@dataclass(frozen=True, slots=True)
class Progress:
    """What the running turn is doing now; `text` is the answer streamed so far."""

    conv: ConvKey
    turn: int
    phase: Phase
    text: str = ""
    tool: str | None = None
    elapsed_s: float = 0.0


@dataclass(frozen=True, slots=True)
class TurnEnded:
    """The final answer of a turn (or why there is none). Rendering must never drop it."""

    conv: ConvKey
    turn: int
    text: str
    reason: str
    live: dict[str, Any] | None = field(default=None, compare=False)
    """Where another process posted the turn's live message (what the platform's adapter
    told `Hub.remember_live`), when this end is shown by a process that did not run the
    turn: the adapter finishes that message rather than posting the text anew."""


@dataclass(frozen=True, slots=True)
class Suspended:
    """The turn waits for a human to decide these approvals; it is not over."""

    conv: ConvKey
    turn: int
    approval_ids: tuple[str, ...]
    text: str = ""
    """What the model said before it asked (may be empty)."""


@dataclass(frozen=True, slots=True)
class ApprovalRequested:
    conv: ConvKey
    approval_id: str
    tool: str
    summary: str
    """The exact call, rendered for a human (a command, a path and content...)."""
    requester: User
    expires_in_s: int
    reminder: bool = False
    """Shown again after a restart: platforms whose card stays on screen skip it."""
    reason: str | None = None
    """Why a human is asked although the policy allows the tool (tainted content)."""


@dataclass(frozen=True, slots=True)
class ApprovalResolved:
    conv: ConvKey
    approval_id: str
    outcome: str
    """approved | denied | always | expired | cancelled | superseded"""
    by: User | None = None


@dataclass(frozen=True, slots=True)
class Notice:
    """A short message for the conversation (command output, queued note, errors)."""

    conv: ConvKey
    text: str
    ephemeral_to: User | None = None
    buttons: tuple[Button, ...] = field(default=())


@dataclass(frozen=True, slots=True)
class Button:
    label: str
    data: str
    """Opaque packed data (see `bot.core.buttons`), at most 64 bytes."""


@dataclass(frozen=True, slots=True)
class Queued:
    """A message arrived while a turn ran; it will be answered together in the next turn."""

    conv: ConvKey
    ref: str | None


Event = (TurnStarted | Progress | TurnEnded | Suspended | ApprovalRequested | ApprovalResolved
         | Notice | Queued)
