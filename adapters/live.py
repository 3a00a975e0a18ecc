"""Platform-neutral rendering helpers: splitting long answers and one live message.

`split_text` cuts at paragraph, then line, then word boundaries and never inside a
fenced code block (a block too long for one part is closed and reopened).
`LiveMessage` streams a turn into one placeholder by edits, at most one per
`min_interval` (the final one too), holding edits while the platform says "retry after",
and delivers the final text whatever happens (overflow continues in new messages). The
placeholder may be due only after a delay: a turn that ends sooner shows as one message,
not a placeholder and an edit (half the platform calls for a quick answer).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Generic, Protocol, TypeVar

log = logging.getLogger(__name__)
Ref = TypeVar("Ref")
Key = TypeVar("Key")
FENCE = "```"
FINAL_DEADLINE_S = 600.0
THINKING = "⏳ Thinking…"
WAITING = "⏸ Waiting for approval"
QUEUED = "👀 Got it; I will answer after the current reply."
"""Said when a message arrives during a turn and reactions cannot say it."""


def paused_for_approval(text: str) -> str:
    """A turn's text as it pauses for an approval."""
    return f"{text.rstrip()}\n\n{WAITING}" if text.strip() else WAITING


class RetryLater(Exception):
    # A signal from the platform, not a failure.
    """The platform asked us to wait (HTTP 429 with retry_after / Retry-After)."""

    def __init__(self, seconds: float) -> None:
        super().__init__(f"retry after {seconds} s")
        self.seconds = seconds


def _cut_point(text: str, limit: int) -> int:
    window = text[:limit]
    for sep in ("\n\n", "\n", " "):
        at = window.rfind(sep)
        if at > limit // 3:
            return at + len(sep)
    return limit


def split_text(text: str, limit: int) -> list[str]:
    """Parts of at most `limit` characters; joined they give back the text's content."""
    if limit < 16:
        raise ValueError("limit too small")
    parts: list[str] = []
    rest = text
    reopen = ""
    while rest:
        rest = reopen + rest
        if len(rest) <= limit:
            parts.append(rest)
            break
        budget = limit - len(FENCE) - 1  # room to close a code block
        cut = _cut_point(rest, budget)
        part = rest[:cut]
        fences = part.count(FENCE)
        reopen = ""
        if fences % 2 == 1:  # the cut is inside a code block: close it here, reopen after
            opener = part[part.rfind(FENCE):].split("\n", 1)[0]
            part = part.rstrip("\n") + "\n" + FENCE
            reopen = opener + "\n"
        parts.append(part.rstrip() if not reopen else part)
        rest = rest[cut:].lstrip("\n") if not reopen else rest[cut:]
    return [p for p in parts if p.strip()] or [text[:limit]]


@dataclass(slots=True)
class _Shown(Generic[Ref]):
    ref: Ref
    text: str
    live: bool = True


class LiveMessage(Generic[Ref]):
    """One turn's placeholder, edited as the answer streams.

    `post(text, live)` sends a new message and returns its reference; `edit(ref, text,
    live)` changes one (`live` says whether the Cancel button stays). Both raise
    `RetryLater` on flood control; other errors are the callbacks' to handle.
    """

    def __init__(self, post: Callable[[str, bool], Awaitable[Ref]],
                 edit: Callable[[Ref, str, bool], Awaitable[None]], *, limit: int,
                 min_interval: float = 1.0, hold: Callable[[], float] | None = None) -> None:
        self._post, self._edit = post, edit
        self.limit = limit
        self.min_interval = min_interval
        self._hold = hold or (lambda: 0.0)
        self._shown: list[_Shown[Ref]] = []
        self._wanted = ""
        self._last_edit = 0.0
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._opener: asyncio.Task[None] | None = None
        self._posting = False
        self._final: str | None = None
        self.edits = 0

    @property
    def last_call(self) -> float:
        """When this message's last post or edit started (time.monotonic)."""
        return self._last_edit

    @property
    def refs(self) -> list[Ref]:
        """The messages on screen, in order."""
        return [shown.ref for shown in self._shown]

    @property
    def cancellable(self) -> bool:
        """The placeholder carries ⏹ Cancel until its final text."""
        return self._final is None

    async def open(self, text: str, *, delay: float = 0.0) -> None:
        """Post the placeholder (with the Cancel button): now, or in the background after
        `delay` seconds unless the turn has finished by then."""
        self._wanted = text
        if delay > 0:
            self._opener = asyncio.get_running_loop().create_task(self._open_after(delay))
        else:
            await self._open_now()

    def adopt(self, ref: Ref) -> None:
        """Take over a message already on screen (a placeholder another process posted)
        as this one's first: `finish` edits it rather than posting anew."""
        self._shown.append(_Shown(ref, "", True))

    async def show(self) -> None:
        """Have the placeholder on screen now, due or not (say, above an approval card)."""
        await self._stop_opener(land=True)
        if not self._posting:
            await self._open_now()

    async def _open_after(self, delay: float) -> None:
        await asyncio.sleep(delay)
        await self._open_now()

    async def _open_now(self) -> None:
        self._posting = True
        text = self._wanted
        ref = await self._retrying(lambda: self._post(text, True), deadline=30.0)
        if ref is not None:
            self._shown.append(_Shown(ref, text, True))
            self._last_edit = time.monotonic()
            if self._wanted != text:
                self.update(self._wanted)

    async def _stop_opener(self, *, land: bool) -> None:
        """Drop a placeholder not yet due; one being posted is awaited when `land`."""
        opener, self._opener = self._opener, None
        if opener is None:
            return
        if not (land and self._posting):
            opener.cancel()
        await asyncio.gather(opener, return_exceptions=True)

    def update(self, text: str) -> None:
        """Show `text` soon (coalesced: only the latest wins)."""
        if self._final is not None:
            return
        self._wanted = text
        if not self._shown:
            return  # the placeholder shows the latest text when it lands
        self._wake.set()
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._flush_loop())

    def answer(self, text: str) -> None:
        """The answer so far: shown like a status, soon."""
        self.update(text)

    async def pause(self, said: str) -> bool:
        """The placeholder says that the turn waits for an approval."""
        await self.finish(paused_for_approval(said))
        return True

    async def finish(self, text: str) -> None:
        """Deliver the final text (buttons removed), split across messages if needed."""
        self._final = text
        self._wake.set()
        await self._stop_opener(land=True)
        await self._stop_flushing()
        parts = split_text(text or " ", self.limit)
        for i, part in enumerate(parts):
            await self._place(i, part, live=False, deadline=FINAL_DEADLINE_S)

    async def close(self, *, land: bool = False) -> None:
        """Stop: a placeholder not yet due is dropped; one being posted is cut off, or,
        with `land`, awaited (so that `refs` names it)."""
        await self._stop_opener(land=land)
        await self._stop_flushing()

    async def _stop_flushing(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def _flush_loop(self) -> None:
        while self._final is None:
            await self._wake.wait()
            self._wake.clear()
            wait = max(self._last_edit + self.min_interval, self._hold()) - time.monotonic()
            if wait > 0:
                await asyncio.sleep(wait)
            if self._final is not None:
                return
            text = self._wanted
            parts = split_text(text, self.limit) if text else []
            try:
                for i, part in enumerate(parts):
                    await self._place(i, part, live=i == len(parts) - 1, deadline=0.0)
            except RetryLater:
                self._wake.set()  # try again after the hold

    async def _place(self, index: int, text: str, *, live: bool, deadline: float) -> None:
        if index < len(self._shown):
            shown = self._shown[index]
            if shown.text == text and shown.live == live:
                return  # unchanged (an earlier, finished part of a long answer too)
        if self._shown:  # every call in a turn's chat keeps the pace, the final one too
            wait = max(self._last_edit + self.min_interval, self._hold()) - time.monotonic()
            if wait > 0:
                await asyncio.sleep(wait)
        self._last_edit = time.monotonic()  # counts even if cut off by the final text
        if index < len(self._shown):
            await self._retrying(lambda: self._edit(shown.ref, text, live), deadline)
            shown.text, shown.live = text, live
        else:
            ref = await self._retrying(lambda: self._post(text, live), deadline)
            if ref is None:
                return
            self._shown.append(_Shown(ref, text, live))
        self._last_edit = time.monotonic()
        self.edits += 1

    async def _retrying(self, call: Callable[[], Awaitable[Ref | None]],
                        deadline: float) -> Ref | None:
        """Call, honouring RetryLater until `deadline` seconds pass (0: raise at once)."""
        give_up = time.monotonic() + deadline
        while True:
            try:
                return await call()
            except RetryLater as exc:
                if time.monotonic() + exc.seconds > give_up:
                    if deadline:
                        log.error("gave up delivering a message after %.0f s", deadline)
                        return None
                    raise
                await asyncio.sleep(exc.seconds)


class _Shows(Protocol[Ref]):  # a LiveMessage, or what stands in for one (a stream)
    @property
    def refs(self) -> list[Ref]: ...

    async def finish(self, text: str) -> None: ...


class Paused(Generic[Key, Ref]):
    """The placeholders of turns waiting for an approval (each saying so), by
    conversation. When the turn goes on, its placeholder loses the "waiting" line, or is
    deleted when that was all it said; a turn that ends while waiting ends in it."""

    def __init__(self, delete: Callable[[Key, Ref], Awaitable[None]]) -> None:
        self._delete = delete
        self._waiting: dict[Key, tuple[_Shows[Ref], str]] = {}

    def park(self, key: Key, live: _Shows[Ref], said: str) -> None:
        """`live` now shows `paused_for_approval(said)`."""
        self._waiting[key] = (live, said)

    async def settle(self, key: Key, text: str | None = None) -> bool:
        """The waiting placeholder of `key` becomes `text` (the turn's end), or what the
        model had said; False when there is none."""
        paused = self._waiting.pop(key, None)
        if paused is None:
            return False
        live, said = paused
        if text is not None or said.strip():
            await live.finish(text if text is not None else said)
        else:
            for ref in live.refs:
                await self._delete(key, ref)
        return True
