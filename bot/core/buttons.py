"""Typed button data: packed into at most 64 bytes, unpacked in one place.

Buttons carry only a short opaque id; what it refers to lives in the store.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from bot.core.events import Verdict

MAX_BYTES = 64
STALE = "This button is no longer valid."
"""The answer to a press whose data means nothing (forged, or from an older version);
a press on a decided card gets the core's own answer ("Already decided: …")."""
_VERDICT_CODES = {Verdict.APPROVE: "a", Verdict.DENY: "d", Verdict.ALWAYS: "w",
                  Verdict.SESSION: "s"}
_CODE_VERDICTS = {v: k for k, v in _VERDICT_CODES.items()}


@dataclass(frozen=True, slots=True)
class ApprovalButton:
    approval_id: str
    verdict: Verdict


@dataclass(frozen=True, slots=True)
class CancelButton:
    turn: int | None = None
    """The turn the button was shown for: a stale button cannot cancel a later turn."""
    session: int | None = None
    """The session of that turn (turn numbers start at 1 again after `/new`)."""


@dataclass(frozen=True, slots=True)
class ItemButton:
    """Cancel a scheduled job (`job`), revoke a standing rule (`rule`), lift a used-up
    daily budget (`budget`) or switch the model (`model`, the id `/model` gives each):
    each is the chat command `command` with `item_id`."""

    kind: Literal["job", "rule", "budget", "model"]
    item_id: str

    @property
    def command(self) -> str:
        return _ITEM_COMMANDS[self.kind]


_ITEM_COMMANDS = {"job": "canceljob", "rule": "revoke", "budget": "liftbudget",
                  "model": "model"}
_ITEM_CODES = {"job": "jc", "rule": "rr", "budget": "bl", "model": "md"}


ButtonData = ApprovalButton | CancelButton | ItemButton


def pack(data: ButtonData) -> str:
    match data:
        case ApprovalButton(approval_id, verdict):
            out = f"ap:{approval_id}:{_VERDICT_CODES[verdict]}"
        case CancelButton(turn, session):
            out = "cx" if turn is None else f"cx:{turn}" if session is None \
                else f"cx:{turn}:{session}"
        case ItemButton(kind, item_id):
            out = f"{_ITEM_CODES[kind]}:{item_id}"
    if len(out.encode()) > MAX_BYTES:
        raise ValueError(f"button data over {MAX_BYTES} bytes: {out!r}")
    return out


def unpack(raw: str) -> ButtonData | None:
    """Parse button data; anything malformed or forged gives None."""
    if not isinstance(raw, str) or len(raw.encode()) > MAX_BYTES:
        return None
    parts = raw.split(":")
    match parts:
        case ["ap", approval_id, code] if approval_id.isalnum() and code in _CODE_VERDICTS:
            return ApprovalButton(approval_id, _CODE_VERDICTS[code])
        case ["cx"]:
            return CancelButton()
        case ["cx", turn] if turn.isdigit() and len(turn) <= 12:
            return CancelButton(int(turn))
        case ["cx", turn, session] if turn.isdigit() and len(turn) <= 12 \
                and session.isdigit() and len(session) <= 12:
            return CancelButton(int(turn), int(session))
        case ["jc", item_id] if item_id.isalnum():
            return ItemButton("job", item_id)
        case ["rr", item_id] if item_id.isalnum():
            return ItemButton("rule", item_id)
        case ["bl", item_id] if item_id.isalnum():
            return ItemButton("budget", item_id)
        case ["md", item_id] if item_id.isalnum():
            return ItemButton("model", item_id)
    return None
