"""Intake: who may be heard, what was heard before, and what a message becomes.

Every inbound passes the one access check, then is recorded by its platform id before
it is processed (a redelivered update is refused; messages and scheduled runs stay
open until their turn begins, so a crash in between replays them at the next start).
A user message's text is cleaned (control characters go, an empty message gets a
clear answer, one too long for the context is kept whole in the workspace) and
labelled with its author, since several people may share a conversation.
"""

from __future__ import annotations

import functools
import json
import logging
import re
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from bot.core.config import Config
from bot.core.events import (
    Attachment,
    Cancel,
    ConvKey,
    Decision,
    Edit,
    Inbound,
    Quote,
    Trigger,
    User,
    UserMessage,
    Verdict,
)
from bot.core.file_modes import private_dir, write_private
from bot.core.history import THREAD_CONTEXT, Said
from bot.llm.senses import Senses
from bot.media import INBOX, conversation_folder
from bot.media.receive import Received, Receiver
from bot.serve.access import Access
from bot.serve.talk import Talk
from bot.store import ConvRow, Store
from bot.turn.budget import Budget

log = logging.getLogger(__name__)

_CONTROL = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f\u200b\ufeff]")
PREVIEW_CHARS = 4000
EMPTY = "Your message was empty, so there is nothing to answer. Send some text."


def intake(text: str, config: Config, conv: ConvKey) -> tuple[str, str | None]:
    """(text for the model, note for the user or None). A message too long for the model
    is kept whole in the conversation's own `inbox/` folder, private (0600 in 0700)."""
    text = _CONTROL.sub("", text.replace("\r\n", "\n")).strip()
    if not text:
        return "", EMPTY
    limit = config.limits.max_message_chars
    if len(text) <= limit:
        return text, None
    workspace = Path(config.workspace.dir)
    where = f"{INBOX}/{conversation_folder(conv)}"
    folder = private_dir(workspace / where, below=workspace)
    name = f"message-{time.time_ns()}.txt"
    write_private(folder / name, text.encode("utf-8"))
    saved = f"{where}/{name}"
    note = (f"Your message has {len(text):,} characters, more than the {limit:,} Tandem "
            f"passes to the model at once. It is saved whole as {saved} in the "
            "workspace; the model sees the start and can read the rest from that file.")
    model_text = (f"{text[:PREVIEW_CHARS]}\n\n[The message continues: {len(text):,} characters "
                  f"in all, saved as {saved} in the workspace; use read_file to read it.]")
    return model_text, note


@dataclass(frozen=True, slots=True)
class Receipt:
    accepted: bool
    note: str | None = None
    """Why it was refused (shown privately to the user), or None."""
    duplicate: bool = False
    """Refused because its id was recorded before (a redelivery)."""


class Intake:
    def __init__(self, config: Config, store: Store, access: Access,
                 receiver: Receiver | None = None) -> None:
        self.config = config
        self.store = store
        self.access = access
        self.receiver = receiver or Receiver(config, {}, Senses(config.llm, config.media))
        self.talk = Talk(config, store, access)

    async def accept(self, item: Inbound) -> Receipt:
        """Access, then record: a refusal, a duplicate (refused, no note), or accepted."""
        refusal = self.access.check(item)
        if refusal is not None:
            return Receipt(False, refusal)
        if item.ref is not None:
            kind, payload = encode_inbound(item)
            if not await self.store.accept_inbound(item.ref, item.conv, kind, payload):
                log.info("duplicate inbound %s ignored", item.ref)
                return Receipt(False, None, duplicate=True)
        return Receipt(True)

    async def said(self, batch: Sequence[UserMessage], row: ConvRow | None = None,
                   budget: Budget | None = None) -> tuple[list[Said], list[str]]:
        """(what each message says to the model, labelled with its author, with the media
        it brought; notes for the user). With `budget`, a message's files are fetched only
        while its sender's and the conversation's budgets last, and a transcription
        counts."""
        said: list[Said] = []
        notes: list[str] = []
        around = await self.talk.since_last(batch)
        for message in batch:
            got = await self._files(message, row, budget) if message.attachments \
                else Received()
            notes += got.notes
            text, note = intake(message.text, self.config, message.conv)
            if note and not (note is EMPTY and (message.attachments or message.forwarded)):
                notes.append(note)
            words = "\n".join(filter(None, [text, *got.lines]))
            if not words and not got.media and message.forwarded is None:
                continue
            context = (f"{THREAD_CONTEXT}\n{message.context}\n\n"
                       if message.context else "")
            if not said:
                context += around
            said.append((context + self.talk.words(message, words), tuple(got.media)))
        return said, notes


    async def _files(self, message: UserMessage, row: ConvRow | None,
                     budget: Budget | None) -> Received:
        if budget is None or row is None:
            return await self.receiver.receive(message)
        user = message.user.id
        if await budget.reached(row, user) is not None:  # checked before anything is fetched
            names = ", ".join(a.name for a in message.attachments)
            return Received(notes=[f"{names} was not fetched: the daily budget is used up."])
        return await self.receiver.receive(message, functools.partial(budget.spend, row, user))


def encode_inbound(item: Inbound) -> tuple[str, str]:
    match item:
        case UserMessage():
            return "message", json.dumps(asdict(item))
        case Edit():
            return "edit", json.dumps(asdict(item))
        case Trigger():
            return "trigger", json.dumps({"conv": asdict(item.conv), "job_id": item.job_id,
                                          "prompt": item.prompt, "late": item.late,
                                          "requester": item.requester})
        case Decision():
            return "decision", json.dumps({"conv": asdict(item.conv), "user": asdict(item.user),
                                           "approval_id": item.approval_id,
                                           "verdict": item.verdict.value})
        case Cancel():
            return "cancel", "{}"
        case _:
            return type(item).__name__.lower(), "{}"


def replay(kind: str, payload: str, ref: str) -> Inbound | None:
    """Rebuild an inbound recorded before a crash (messages, triggers and presses replay;
    a press recorded before it could carry its details is dropped)."""
    try:
        data = json.loads(payload)
        conv = ConvKey(**data["conv"])
        if kind == "message":
            return message_of(data, ref)
        if kind == "trigger":
            return Trigger(conv, data["job_id"], data["prompt"], data["late"], ref=ref,
                           requester=data.get("requester", ""))
        if kind == "decision":  # checked again on the lane, as every press is
            return Decision(conv, User(**data["user"]), data["approval_id"],
                            Verdict(data["verdict"]), ref=ref)
    except (ValueError, KeyError, TypeError):
        log.warning("could not replay inbound %s", ref)
    return None


def message_of(data: dict[str, Any], ref: str | None) -> UserMessage:
    """A `UserMessage` from its JSON form (`asdict`; older records lack the later fields)."""
    def quote(raw: Any) -> Quote | None:
        if not isinstance(raw, dict):
            return None
        who = raw.get("author")
        return Quote(raw["text"], User(**who) if isinstance(who, dict) else None,
                     bool(raw.get("by_tandem")), raw.get("origin", ""))

    around = data.get("around")
    return UserMessage(ConvKey(**data["conv"]), User(**data["user"]), data["text"], ref=ref,
                       context=data.get("context"),
                       attachments=tuple(Attachment(**a) for a in data.get("attachments", ())),
                       message_id=data.get("message_id"), quote=quote(data.get("quote")),
                       forwarded=quote(data.get("forwarded")),
                       around=ConvKey(**around) if isinstance(around, dict) else None)
