"""A conversation's work item as JSON (a task queue job's arguments) and back."""

from __future__ import annotations

import json
from dataclasses import asdict
from typing import Any

from bot.core.events import (
    Attachment,
    Cancel,
    Command,
    ConvKey,
    Decision,
    Edit,
    Trigger,
    User,
    UserMessage,
    Verdict,
)
from bot.serve.intake import message_of
from bot.serve.recovery import Resume
from bot.serve.worker import Expiry, Work

_KINDS: dict[str, type[Any]] = {
    "message": UserMessage, "decision": Decision, "cancel": Cancel, "trigger": Trigger,
    "command": Command, "expiry": Expiry, "resume": Resume, "edit": Edit}
_NAMES = {kind: name for name, kind in _KINDS.items()}


def encode(item: Work) -> str:
    return json.dumps({"kind": _NAMES[type(item)], **asdict(item)}, ensure_ascii=False)


def decode(raw: str) -> Work:
    """The item `encode` wrote; ValueError when it is not one."""
    try:
        data = json.loads(raw)
        kind = _KINDS[data.pop("kind")]
        if kind is UserMessage:
            return message_of(data, data.get("ref"))
        data["conv"] = ConvKey(**data["conv"])
        if isinstance(data.get("user"), dict):
            data["user"] = User(**data["user"])
        if "attachments" in data:
            data["attachments"] = tuple(Attachment(**a) for a in data["attachments"])
        if "verdict" in data:
            data["verdict"] = Verdict(data["verdict"])
        item: Work = kind(**data)
    except (KeyError, TypeError, ValueError) as exc:
        raise ValueError(f"not a work item: {exc}") from None
    return item
