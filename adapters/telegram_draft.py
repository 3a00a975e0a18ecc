"""A turn streamed as a Telegram message draft, in a private chat.

`sendMessageDraft` shows a preview of the answer as it is written, animated by the
client, without a message in the chat until the answer is done: then it is sent once
(split if long), which also replaces the draft. A draft lives about 30 s after its last
update, so a quiet turn (a long tool run) refreshes it. Drafts go through the chat's
pacer like every other call, so they never reach flood control. A draft has no buttons:
the edge offers ⏹ Cancel beside it (`adapters.edge.turns`).

Where Telegram refuses a draft (an older server, a chat without drafts), the turn falls
back to a `LiveMessage` — a placeholder with ⏹ Cancel, edited — and the chat is
remembered as one without drafts. `Draft` is a `Live` surface like `LiveMessage`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable

from telegram.error import BadRequest, Forbidden, NetworkError, TimedOut

from adapters.live import LiveMessage, RetryLater, split_text
from adapters.telegram_api import BotApi, Posted

log = logging.getLogger(__name__)
KEEP_ALIVE_S = 20.0
"""Seconds after which an unchanged draft is sent again (Telegram drops it after ~30 s)."""


class Draft:
    """One turn's draft in chat `chat`; `send` delivers a final part as a message."""

    def __init__(self, api: BotApi, chat: int, thread: int | None, draft_id: int, *,
                 limit: int, render: Callable[[str], str],
                 send: Callable[[str], Awaitable[Posted]],
                 fallback: Callable[[], LiveMessage[Posted]],
                 refused: Callable[[int], None]) -> None:
        if draft_id == 0:
            raise ValueError("a draft id must be non-zero")
        self.api, self.chat, self.thread, self.draft_id = api, chat, thread, draft_id
        self.limit, self.render = limit, render
        self._send, self._fallback, self._refused = send, fallback, refused
        self.live: LiveMessage[Posted] | None = None
        """The edited placeholder this turn fell back to, once drafts were refused."""
        self._wanted = ""
        self._shown = ""
        self._shown_at = 0.0
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._sent: list[Posted] = []
        self._done = False
        self.drafts = 0
        self.said = ""
        """The answer streamed so far (status lines are not it)."""
        self.answered = False
        """The answer so far was sent as a message (above an approval card)."""

    @property
    def refs(self) -> list[Posted]:
        return self.live.refs if self.live is not None else list(self._sent)

    async def open(self, text: str, *, delay: float = 0.0) -> None:
        """Start streaming; the status `text` shows once `delay` has passed."""
        self._wanted = text
        self._task = asyncio.get_running_loop().create_task(self._loop(delay))

    @property
    def cancellable(self) -> bool:
        """Only the placeholder it fell back to has a ⏹ of its own."""
        return self.live is not None

    def adopt(self, ref: Posted) -> None:
        self._sent.append(ref)

    def update(self, text: str) -> None:
        if self.live is not None:
            self.live.update(text)
            return
        self._wanted = text
        self._wake.set()

    def answer(self, text: str) -> None:
        self.said = text
        self.update(text)

    async def pause(self, said: str) -> bool:
        """Waiting for approval: the placeholder says so, if there is one; a draft leaves
        only what the model said (the card says the rest)."""
        if self.live is not None:
            return await self.live.pause(said)
        if said.strip() and not self.answered:
            await self.finish(said)
        return False

    async def show(self) -> None:
        """The answer so far as a message now (above an approval card); nothing when
        there is none yet."""
        if self.live is not None:
            await self.live.show()
        elif self.said.strip() and not self.answered:
            self.answered = True
            await self._stop()
            for part in split_text(self.said, self.limit):
                self._sent.append(await self._send(part))

    async def finish(self, text: str) -> None:
        """The final text as messages (once), which also replaces the draft."""
        await self._stop()
        if self.live is not None:
            await self.live.finish(text)
            return
        parts = split_text(text or " ", self.limit)
        for i, part in enumerate(parts):
            try:
                self._sent.append(await self._send(part))
            except TimedOut:
                raise  # it may have arrived: never sent twice
            except (NetworkError, RetryLater):
                # Telegram is out of reach for longer than the client retries: the rest
                # goes with a placeholder's patience (it retries for minutes)
                log.warning("Telegram: the answer could not be sent in chat %s yet; "
                            "retrying", self.chat)
                self.live = self._fallback()
                await self.live.finish("\n\n".join(parts[i:]))
                return

    async def close(self) -> None:
        await self._stop()
        if self.live is not None:
            await self.live.close()

    async def _stop(self) -> None:
        self._done = True
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def _loop(self, delay: float) -> None:
        if delay > 0:
            await asyncio.sleep(delay)
        while not self._done and self.live is None:
            if (wait := self.api.next_at(self.chat) - time.monotonic()) > 0:
                await asyncio.sleep(wait)  # then the newest text goes, not a second-old one
            text = self._wanted
            if text != self._shown or time.monotonic() - self._shown_at > KEEP_ALIVE_S:
                await self._draft(text)
            self._wake.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), KEEP_ALIVE_S)

    async def _draft(self, text: str) -> None:
        """Show `text` as the draft (its last part when long: the part being written)."""
        part = split_text(text, self.limit)[-1] if text.strip() else text
        try:
            await self.api.draft(self.chat, self.thread, self.draft_id, self.render(part),
                                 part)
            self.drafts += 1
        except (BadRequest, Forbidden) as exc:
            log.info("Telegram: no drafts in chat %s (%s); editing a placeholder instead",
                     self.chat, exc)
            self._refused(self.chat)
            await self._fall_back()
            return
        except (RetryLater, NetworkError):
            log.info("Telegram: a draft update failed in chat %s", self.chat, exc_info=True)
        self._shown, self._shown_at = text, time.monotonic()

    async def _fall_back(self) -> None:
        live = self._fallback()
        await live.open(self._wanted)
        self.live = live

