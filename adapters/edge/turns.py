"""The running turn of each conversation as the chat shows it.

One `Live` surface per turn (the platform picks placeholder, draft or stream). While the
turn runs, a ticker shows that Tandem is typing and counts a running tool's seconds. A
turn still running after `cancel_delay` whose surface has no ⏹ of its own (a draft, a
stream, an assistant thread's status line) gets a small status message with ⏹ Cancel; it
is deleted when the turn ends, pauses or is superseded, so no dead button is left. A quick
answer costs no extra call. A turn waiting for approval keeps its placeholder (saying so)
in `Paused` until it goes on.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Generic

from adapters.edge.chat import Chat, Live, Ref
from adapters.live import THINKING, Paused
from bot.core.buttons import CancelButton, pack
from bot.core.events import Button, ConvKey, Phase, Progress, Suspended, TurnEnded

log = logging.getLogger(__name__)
WORKING = "⏳ Working on it…"
"""The status message that carries ⏹ Cancel beside a draft or a stream."""


def cancel_button(turn: int | None, session: int | None = None) -> Button:
    return Button("⏹ Cancel", pack(CancelButton(turn, session)))


@dataclass(slots=True)
class Turn(Generic[Ref]):
    number: int
    live: Live[Ref]
    session: int | None = None
    started: float = field(default_factory=time.monotonic)
    status: str = THINKING
    progress: Progress | None = None
    tool_since: float | None = None
    offer: list[Ref] = field(default_factory=list)
    """The status message with ⏹ Cancel, once posted."""
    tasks: list[asyncio.Task[None]] = field(default_factory=list)
    offering: asyncio.Task[None] | None = None


class Turns(Generic[Ref]):
    def __init__(self, chat: Chat[Ref], *, placeholder_delay: float, cancel_delay: float,
                 typing_delay: float, typing_interval: float) -> None:
        self.chat = chat
        self.placeholder_delay, self.cancel_delay = placeholder_delay, cancel_delay
        self.typing_delay, self.typing_interval = typing_delay, typing_interval
        self._turns: dict[ConvKey, Turn[Ref]] = {}
        self._sweeps: set[asyncio.Task[None]] = set()
        """Cancel offers being deleted, after their turn's end."""
        self.paused: Paused[ConvKey, Ref] = Paused(chat.delete)
        """A turn waiting for approval: its placeholder (saying so) and its text."""

    def shows(self, conv: ConvKey, mine: Callable[[Ref], bool]) -> bool:
        """A message `mine` picks is (or may be, while it is posted) the running turn's."""
        turn = self._turns.get(conv)
        if turn is None:
            return False
        refs = turn.live.refs
        return not refs or any(mine(r) for r in [*refs, *turn.offer])

    async def started(self, conv: ConvKey, number: int, session: int | None = None) -> None:
        if (old := self._turns.pop(conv, None)) is not None:
            await self._stop(conv, old)
        await self.paused.settle(conv)
        def lost_cancel() -> None:  # the surface's own ⏹ went: one beside it, if due
            now = self._turns.get(conv)
            if now is not None and now.number == number and \
                    time.monotonic() - now.started >= self.cancel_delay:
                self._offer_soon(conv, now)

        turn = self._turns[conv] = Turn(number, self.chat.new_live(conv, number, lost_cancel),
                                        session)
        loop = asyncio.get_running_loop()
        turn.tasks = [loop.create_task(self._tick(conv, turn)),
                      loop.create_task(self._offer_after(conv, turn))]
        await turn.live.open(turn.status, delay=self.placeholder_delay)

    def progress(self, event: Progress) -> None:
        turn = self._turns.get(event.conv)
        if turn is None:
            return
        if event.text and not event.text.strip():  # nothing visible yet: still a status
            event = replace(event, text="")
        turn.progress = event
        running = event.phase is Phase.TOOL and bool(event.tool) and not event.text
        turn.tool_since = time.monotonic() if running else None
        if event.text:
            turn.status = event.text
            turn.live.answer(event.text)
        else:
            self._show_status(turn, self.chat.status(event, None))
        if time.monotonic() - turn.started >= self.cancel_delay:
            self._offer_soon(event.conv, turn)

    async def suspended(self, event: Suspended) -> None:
        """The turn waits for approval: a placeholder says so until the turn goes on; a
        draft or a stream leaves only what the model said (the card says the rest)."""
        turn = self._turns.pop(event.conv, None)
        if turn is None:
            return
        await self._stop_tasks(turn)
        if await turn.live.pause(event.text):
            self.paused.park(event.conv, turn.live, event.text)
        await turn.live.close()
        self._sweep(event.conv, turn)

    async def ended(self, event: TurnEnded) -> None:
        conv, text = event.conv, event.text
        turn = self._turns.pop(conv, None)
        if turn is not None:
            await self._stop_tasks(turn)
            await turn.live.finish(text)
            await turn.live.close()
            self._sweep(conv, turn)  # after the answer, and without holding it up
            return
        adopted = self.chat.adopt_live(conv, event.turn, event.live) if event.live else None
        if adopted is not None:
            # another process ran the turn and died: its placeholder becomes the answer
            await adopted.finish(text)
            await adopted.close()
        elif not await self.paused.settle(conv, text):  # ended while waiting for approval
            await self.chat.post(conv, text)

    async def show(self, conv: ConvKey) -> None:
        """The turn's message on screen now (it goes above an approval card)."""
        if (turn := self._turns.get(conv)) is not None:
            await turn.live.show()

    async def close(self) -> None:
        """Shutting down: every turn stops where it is."""
        turns, self._turns = self._turns, {}
        for conv, turn in turns.items():
            await self._stop(conv, turn)
        await asyncio.gather(*self._sweeps, return_exceptions=True)

    # -- while a turn runs ------------------------------------------------------------

    def _show_status(self, turn: Turn[Ref], status: str) -> None:
        if status != turn.status:
            turn.status = status
            turn.live.update(status)

    async def _tick(self, conv: ConvKey, turn: Turn[Ref]) -> None:
        """Typing while the turn runs; also ticks the seconds of a running tool."""
        await asyncio.sleep(self.typing_delay)
        while True:
            try:
                await self.chat.typing(conv)
            except self.chat.failures:
                log.debug("%s: no typing in %s", self.chat.platform, conv, exc_info=True)
            await asyncio.sleep(self.typing_interval)
            if turn.tool_since is not None and turn.progress is not None:
                running = time.monotonic() - turn.tool_since
                self._show_status(turn, self.chat.status(turn.progress, running))

    async def _offer_after(self, conv: ConvKey, turn: Turn[Ref]) -> None:
        await asyncio.sleep(self.cancel_delay)
        self._offer_soon(conv, turn)

    def _offer_soon(self, conv: ConvKey, turn: Turn[Ref]) -> None:
        if not turn.offer and turn.offering is None and not turn.live.cancellable:
            turn.offering = asyncio.get_running_loop().create_task(self._offer(conv, turn))
            turn.tasks.append(turn.offering)

    async def _offer(self, conv: ConvKey, turn: Turn[Ref]) -> None:
        """⏹ Cancel one tap away: a status message beside a surface without one. Never
        cancelled once started (a message posted must be known, to be deleted)."""
        try:
            turn.offer = await self.chat.post(conv, WORKING,
                                              (cancel_button(turn.number, turn.session),))
        except self.chat.failures:
            log.warning("%s: could not offer Cancel in %s", self.chat.platform, conv,
                        exc_info=True)
        finally:
            turn.offering = None

    async def _stop(self, conv: ConvKey, turn: Turn[Ref]) -> None:
        """A turn that will not finish here (shutdown, or superseded)."""
        await self._stop_tasks(turn)
        await turn.live.close()
        await self._drop_offer(conv, turn)

    @staticmethod
    async def _stop_tasks(turn: Turn[Ref]) -> None:
        """Typing and ticking stop; a Cancel offer being posted lands first (it is
        deleted with the others)."""
        offering = turn.offering
        for task in turn.tasks:
            if task is not offering:
                task.cancel()
        await asyncio.gather(*turn.tasks, return_exceptions=True)

    def _sweep(self, conv: ConvKey, turn: Turn[Ref]) -> None:
        """The turn's Cancel offer goes, in the background: what the turn's end shows is
        not delayed by it (a platform paces the calls in one chat)."""
        if turn.offer:
            task = asyncio.get_running_loop().create_task(self._drop_offer(conv, turn))
            self._sweeps.add(task)
            task.add_done_callback(self._sweeps.discard)

    async def _drop_offer(self, conv: ConvKey, turn: Turn[Ref]) -> None:
        offer, turn.offer = turn.offer, []
        for ref in offer:
            try:
                await self.chat.delete(conv, ref)
            except self.chat.failures:
                log.warning("%s: could not remove the Cancel offer in %s",
                            self.chat.platform, conv, exc_info=True)
