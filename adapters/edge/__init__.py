"""The chat edge: what every platform shows for the core's events, written once.

`Edge` maps each core `Event` onto a platform's `Chat` primitives (`adapters.edge.chat`):
the turn's live surface and its ⏹ Cancel (`adapters.edge.turns`), approval cards and their
outcomes (`adapters.edge.cards`), notices, the 👀 of a queued message, and the private
answer to a press. It also holds what inbound handling shares: per-chat ordering locks,
strangers told once, and presses waiting for the core to settle them. A platform file
(`adapters.telegram`, `adapters.slack`) is its API's primitives plus the parsing of its
updates; it never decides what a chat shows.
"""

from __future__ import annotations

import asyncio
import logging
import weakref
from typing import Any, Generic

from adapters.edge.cards import Cards, CardStore
from adapters.edge.chat import Chat, Live, Ref, Where
from adapters.edge.turns import Turns, cancel_button
from adapters.live import QUEUED, RetryLater
from bot.core.events import (
    ApprovalRequested,
    ApprovalResolved,
    ConvKey,
    Event,
    Notice,
    Progress,
    Queued,
    Suspended,
    TurnEnded,
    TurnStarted,
)

__all__ = ["Chat", "Edge", "EdgeTimings", "Live", "Where", "cancel_button"]
log = logging.getLogger(__name__)
PRESS_WAIT_S = 2.0
"""How long a press's answer waits for the core to settle the press."""
STRANGERS = 10_000
"""Strangers remembered as told (per process); past that, nobody more is told."""


class Edge(Generic[Ref]):
    def __init__(self, chat: Chat[Ref], store: CardStore, *, placeholder_delay: float = 0.5,
                 cancel_delay: float = 1.5, typing_delay: float = 0.2,
                 typing_interval: float = 4.0) -> None:
        self.chat = chat
        self.turns: Turns[Ref] = Turns(chat, placeholder_delay=placeholder_delay,
                                       cancel_delay=cancel_delay, typing_delay=typing_delay,
                                       typing_interval=typing_interval)
        self.cards = Cards(chat, store)  # type: ignore[arg-type]
        self._presses: dict[tuple[ConvKey, str], asyncio.Future[str | None]] = {}
        """Presses the core took and has yet to settle: a refusal it sends the presser
        goes to them privately, as the press's answer."""
        self._told: set[tuple[str, str]] = set()
        self._locks: weakref.WeakValueDictionary[ConvKey, asyncio.Lock] = \
            weakref.WeakValueDictionary()

    async def emit(self, event: Event) -> None:
        """Show `event`; what the platform refuses is logged, and the turn goes on."""
        failures: tuple[type[BaseException], ...] = (*self.chat.failures, RetryLater)
        try:
            await self._show(event)
        except failures:
            log.warning("%s: could not show %s in %s", self.chat.platform,
                        type(event).__name__, event.conv, exc_info=True)

    async def _show(self, event: Event) -> None:
        match event:
            case TurnStarted():
                await self.turns.started(event.conv, event.turn, event.session)
            case Progress():
                self.turns.progress(event)
            case TurnEnded():
                await self.turns.ended(event)
            case Suspended():
                await self.turns.suspended(event)
            case ApprovalRequested() if event.reminder:
                await self.cards.reminded(event)
            case ApprovalRequested():
                await self.turns.show(event.conv)  # the turn's message goes above the card
                await self.cards.requested(event)
            case ApprovalResolved():
                if event.by is not None:
                    self.settle(event.conv, event.by.id, None)
                await self.cards.resolved(event)
            case Notice():
                await self._notice(event)
            case Queued():
                if not await self.chat.react(event.conv, event.ref):
                    await self.chat.post(event.conv, QUEUED)

    async def _notice(self, event: Notice) -> None:
        """A notice for the chat; one meant for one person goes to them alone: as their
        press's answer when they just pressed, else privately where the platform can."""
        to = event.ephemeral_to
        if to is not None and (self.settle(event.conv, to.id, event.text)
                               or await self.chat.tell(event.conv, to, event.text)):
            return
        await self.chat.post(event.conv, event.text, event.buttons)

    async def close(self) -> None:
        await self.turns.close()

    # -- what inbound handling shares ---------------------------------------------------

    def lock(self, conv: ConvKey) -> asyncio.Lock:
        """One chat's updates are handled in order (a platform may handle them at once)."""
        return self._locks.get(conv) or self._locks.setdefault(conv, asyncio.Lock())

    def first_time(self, chat_id: str, user_id: str) -> bool:
        """A stranger in this chat is told once (per process)."""
        key = (chat_id, user_id)
        if key in self._told or len(self._told) >= STRANGERS:
            return False
        self._told.add(key)
        return True

    async def settled(self, conv: ConvKey, user_id: str) -> str | None:
        """Wait (briefly: the client spins until answered) for the core to settle a press:
        its refusal for the presser, or None once it took effect or time is up."""
        key = (conv, user_id)
        if key in self._presses:
            return None  # an earlier press of theirs waits already
        future = self._presses[key] = asyncio.get_running_loop().create_future()
        try:
            return await asyncio.wait_for(future, PRESS_WAIT_S)
        except TimeoutError:
            return None
        finally:
            self._presses.pop(key, None)

    def settle(self, conv: ConvKey, user_id: str, note: str | None) -> bool:
        future = self._presses.get((conv, user_id))
        if future is None or future.done():
            return False
        future.set_result(note)
        return True


class _Timing:
    """One of the edge's timings, read and set as the adapter's own attribute."""

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    def __get__(self, adapter: Any, owner: type | None = None) -> float:
        return float(getattr(adapter.edge.turns, self.name))

    def __set__(self, adapter: Any, value: float) -> None:
        setattr(adapter.edge.turns, self.name, value)


class EdgeTimings:
    """The edge's timings as settings of the adapter that holds it as `edge`."""

    placeholder_delay = _Timing()
    """A turn that ends sooner shows as one message, with no placeholder."""
    cancel_delay = _Timing()
    """A turn still running this long gets ⏹ Cancel, where its surface has none."""
    typing_delay = _Timing()
    typing_interval = _Timing()
