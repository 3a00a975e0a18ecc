"""Intake: who may be heard, what was heard before, and what a message becomes.

Every inbound passes the one access check, then is recorded by its platform id before
it is processed (a redelivered update is refused; messages and scheduled runs stay
open until their turn begins, so a crash in between replays them at the next start).
A user message's text is cleaned (control characters go, an empty message gets a
clear answer, one too long for the context is kept whole in the workspace) and
labelled with its author, since several people may share a conversation.
"""

from __future__ import annotations

import json
import logging
import re
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

from bot.access import Access
from bot.config import Config
from bot.events import Cancel, ConvKey, Inbound, Trigger, User, UserMessage
from bot.store import Store

log = logging.getLogger(__name__)

_CONTROL = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f\u200b\ufeff]")
PREVIEW_CHARS = 4000


def intake(text: str, config: Config) -> tuple[str, str | None]:
    """(text for the model, note for the user or None)."""
    text = _CONTROL.sub("", text.replace("\r\n", "\n")).strip()
    if not text:
        return "", "Your message was empty, so there is nothing to answer. Send some text."
    limit = config.limits.max_message_chars
    if len(text) <= limit:
        return text, None
    folder = Path(config.workspace.dir) / "inbox"
    folder.mkdir(parents=True, exist_ok=True)
    name = f"message-{time.time_ns()}.txt"
    (folder / name).write_text(text, encoding="utf-8")
    note = (f"Your message has {len(text):,} characters, more than the {limit:,} Tandem "
            f"passes to the model at once. It is saved whole as inbox/{name} in the "
            "workspace; the model sees the start and can read the rest from that file.")
    model_text = (f"{text[:PREVIEW_CHARS]}\n\n[The message continues: {len(text):,} characters "
                  f"in all, saved as inbox/{name} in the workspace; use read_file to read it.]")
    return model_text, note


@dataclass(frozen=True, slots=True)
class Receipt:
    accepted: bool
    note: str | None = None
    """Why it was refused (shown privately to the user), or None."""


class Intake:
    def __init__(self, config: Config, store: Store, access: Access) -> None:
        self.config = config
        self.store = store
        self.access = access

    async def accept(self, item: Inbound) -> Receipt:
        """Access, then record: a refusal, a duplicate (refused, no note), or accepted."""
        refusal = self.access.check(item)
        if refusal is not None:
            return Receipt(False, refusal)
        if item.ref is not None:
            kind, payload = encode_inbound(item)
            if not await self.store.accept_inbound(item.ref, item.conv, kind, payload):
                log.info("duplicate inbound %s ignored", item.ref)
                return Receipt(False, None)
        return Receipt(True)

    def texts(self, batch: Sequence[UserMessage]) -> tuple[list[str], list[str]]:
        """(the batch's texts for the model, each labelled with its author; notes)."""
        texts, notes = [], []
        for message in batch:
            text, note = intake(message.text, self.config)
            if note:
                notes.append(note)
            if text:
                author = message.user.name or message.user.id
                context = (f"[Earlier in this thread]\n{message.context}\n\n"
                           if message.context else "")
                texts.append(f"{context}[{author}] {text}")
        return texts, notes


def encode_inbound(item: Inbound) -> tuple[str, str]:
    match item:
        case UserMessage():
            return "message", json.dumps({"conv": asdict(item.conv), "user": asdict(item.user),
                                          "text": item.text, "context": item.context})
        case Trigger():
            return "trigger", json.dumps({"conv": asdict(item.conv), "job_id": item.job_id,
                                          "prompt": item.prompt, "late": item.late,
                                          "requester": item.requester})
        case Cancel():
            return "cancel", "{}"
        case _:
            return type(item).__name__.lower(), "{}"


def replay(kind: str, payload: str, ref: str) -> Inbound | None:
    """Rebuild an inbound recorded before a crash (only messages and triggers replay)."""
    try:
        data = json.loads(payload)
        conv = ConvKey(**data["conv"])
        if kind == "message":
            return UserMessage(conv, User(**data["user"]), data["text"], ref=ref,
                               context=data.get("context"))
        if kind == "trigger":
            return Trigger(conv, data["job_id"], data["prompt"], data["late"], ref=ref,
                           requester=data.get("requester", ""))
    except (ValueError, KeyError, TypeError):
        log.warning("could not replay inbound %s", ref)
    return None
