"""Whose conversation a press belongs to, where members have their own (`groups.sessions:
per_user`).

A member's message names their own conversation (the platform's adapter adds them to the
key), but a button is pressed on a message in the group: the press names the group. An
approval's press goes to the conversation that asked (the approval says which, and the
press must come from the chat it was shown in); a ⏹ Cancel to the one whose turn of that
number runs there. Elsewhere a press keeps the key it came with.
"""

from __future__ import annotations

import dataclasses
from typing import TypeVar

from bot.core.config import Config
from bot.core.events import Cancel, ConvKey, Decision
from bot.store import Store

P = TypeVar("P", Decision, Cancel)


async def owner(store: Store, item: P) -> P:
    """`item` with the conversation of the approval or the turn it presses."""
    if item.conv.member is not None:
        return item
    found: ConvKey | None = None
    if isinstance(item, Decision):
        approval = await store.approval(item.approval_id)
        row = await store.conversation_by_id(approval.conv_id) if approval else None
        found = row.key if row is not None else None
    elif item.turn is not None:
        for turn in await store.open_turns():
            row = await store.conversation_by_id(turn.conv_id)
            if row is not None and row.key.place == item.conv and turn.turn == item.turn \
                    and turn.status != "done" \
                    and getattr(item, "session", None) in (None, turn.session):
                found = row.key
                break
    if found is None or found.member is None or found.place != item.conv:
        return item
    return dataclasses.replace(item, conv=found)


class Owners:
    """`owner` where members have their own conversations on some platform; elsewhere a
    press keeps its key (no lookup)."""

    def __init__(self, config: Config, store: Store) -> None:
        self.store = store
        self.per_user = any(section.groups.sessions == "per_user"
                            for section in (config.telegram, config.slack))

    async def of(self, item: P) -> P:
        return await owner(self.store, item) if self.per_user else item
