"""Approval cards: which message shows which approval, and its outcome once decided.

A card is posted by the platform (`Chat.show_card`), remembered here and in the store
(another worker, or this one after a restart, shows the outcome on it). When the approval
is resolved the card gets its outcome line and loses its buttons; a card that is gone, or
that nobody knows of, gets the line as a message of its own. After a restart a card is
known only from a press the hub accepted on it (`learn`): an outcome that came first is
kept for that moment.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from typing import Protocol, TypeVar

from adapters.edge.chat import Chat, Where
from bot.core.events import ApprovalRequested, ApprovalResolved

log = logging.getLogger(__name__)
V = TypeVar("V")
MEMORY = 1000
"""Cards and unshown outcomes kept in memory (the store keeps every card)."""


class CardStore(Protocol):
    async def remember_card(self, approval_id: str, where: Where) -> None: ...

    async def card_of(self, approval_id: str) -> Where | None: ...


class Cards:
    def __init__(self, chat: Chat[object], store: CardStore) -> None:
        self.chat, self.store = chat, store
        self._cards: OrderedDict[str, Where] = OrderedDict()
        self._unshown: OrderedDict[str, str] = OrderedDict()
        """Outcome lines of approvals resolved while their card was unknown."""

    def known(self, approval_id: str) -> bool:
        return approval_id in self._cards

    async def requested(self, event: ApprovalRequested) -> None:
        where = await self.chat.show_card(event)
        _remember(self._cards, event.approval_id, where)
        await self.store.remember_card(event.approval_id, where)

    async def reminded(self, event: ApprovalRequested) -> None:
        """A pending approval shown again after a restart: its card is still on screen,
        unless none was ever posted (Tandem stopped in between); then it is posted now."""
        if event.approval_id in self._cards or \
                await self.store.card_of(event.approval_id) is not None:
            return
        await self.requested(event)

    async def resolved(self, event: ApprovalResolved) -> None:
        line = self.chat.outcome_line(event.outcome, event.by)
        where = await self._where(event.approval_id)
        if where is not None and await self.chat.decide_card(event.approval_id, where, line):
            return
        if where is None:  # a press may show where it is later
            _remember(self._unshown, event.approval_id, line)
        await self.chat.post_line(event.conv, line)

    async def learn(self, approval_id: str, where: Where) -> None:
        """A press the hub accepted came from this card (the platform checked that the
        message shows only this approval's buttons). Remembered before the first await,
        so before the lane can resolve the approval; one resolved first shows its
        outcome now."""
        if approval_id in self._cards:
            return
        line = self._unshown.pop(approval_id, None)
        if line is None:
            _remember(self._cards, approval_id, where)
            return
        try:
            await self.chat.decide_card(approval_id, where, line)
        except self.chat.failures:
            log.warning("%s: could not show an approval's outcome", self.chat.platform,
                        exc_info=True)

    async def _where(self, approval_id: str) -> Where | None:
        """The card of `approval_id`: posted here, else where the store says."""
        where = self._cards.pop(approval_id, None)
        return where if where is not None else await self.store.card_of(approval_id)


def _remember(kept: OrderedDict[str, V], key: str, value: V) -> None:
    kept[key] = value
    while len(kept) > MEMORY:
        kept.popitem(last=False)
