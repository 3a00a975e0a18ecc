"""Who may do what: one table, checked in the core for every platform.

Everyone here is an allowed user already (`bot.serve.access` let them in). Some acts
reach past what is one's own: stopping another person's turn, cancelling another's
scheduled task, revoking another's standing rule, starting a group's conversation afresh,
lifting a budget, reading the audit log, switching the model in a group. `may` says
whether `user` may; approvers may always do everything. (The commands also let the person
at the terminal do everything: on the console platform, whoever runs Tandem.)

| action | own (in a DM or a group) | another person's, or the group's |
|---|---|---|
| `STOP` (⏹ Cancel, `/stop`) | anyone | approvers |
| `CANCEL_JOB` (`/canceljob`, its button) | anyone | approvers |
| `REVOKE` (`/revoke`, its button) | anyone | approvers |
| `DECIDE` (an approval's buttons) | the requester | approvers |
| `NEW` (`/new`) | anyone in a DM | approvers, or anyone where none are set |
| `MODEL` (switching the model) | anyone in a DM | approvers, or anyone where none are set |
| `LIFT_BUDGET` (the card's button) | approvers | approvers |
| `AUDIT` (`/audit`) | approvers | approvers |
"""

from __future__ import annotations

from enum import StrEnum

from bot.core.events import ConvKey, User
from bot.serve.access import LOCAL_PLATFORMS, Access

DENIED = "Only {who} can do that here."


class Action(StrEnum):
    STOP = "stop"
    CANCEL_JOB = "canceljob"
    REVOKE = "revoke"
    DECIDE = "decide"
    NEW = "new"
    MODEL = "model"
    LIFT_BUDGET = "liftbudget"
    AUDIT = "audit"


OWNED = frozenset({Action.STOP, Action.CANCEL_JOB, Action.REVOKE, Action.DECIDE})
"""Acts on something a person owns (a turn, a task, a rule, a call): free for its owner."""
GROUP_WIDE = frozenset({Action.NEW, Action.MODEL})
"""Acts on the whole conversation: free in a DM; in a group for approvers, or for anyone
while the platform has no approvers."""
APPROVERS_ONLY = frozenset({Action.LIFT_BUDGET, Action.AUDIT})


def shared(conv: ConvKey) -> bool:
    """Several people may be in this conversation (a group, a channel, a thread in one).
    Telegram's private chats have positive ids, its groups negative ones; Slack's DMs are
    the channels whose id starts with D."""
    match conv.platform:
        case "telegram":
            return conv.chat_id.startswith("-")
        case "slack":
            return not conv.chat_id.startswith("D")
        case platform if platform in LOCAL_PLATFORMS:
            return False
    return True


def may(access: Access, user: User, action: Action, conv: ConvKey,
        owner: str | None = None) -> bool:
    """`user` may do `action` in `conv`; `owner` is whose thing it acts on (the turn's
    requester, the task's or the rule's author), where it has one."""
    if access.is_approver(conv.platform, user.id):
        return True
    if action in OWNED:
        return owner is not None and owner == user.id
    if action in GROUP_WIDE:
        return not shared(conv) or not access.approvers.get(conv.platform)
    return False


def refusal(action: Action) -> str:
    """What a person told no is shown (privately, where the platform can)."""
    who = {Action.STOP: "the person who asked or an approver",
           Action.CANCEL_JOB: "the person who scheduled it or an approver",
           Action.REVOKE: "the person who made the rule or an approver",
           Action.DECIDE: "the person who asked or an approver"}.get(action, "an approver")
    return DENIED.format(who=who)
