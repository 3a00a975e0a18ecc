"""A turn's answer streamed into a Slack thread with Slack's chat streams.

`chat.startStream` opens a message that grows by `chat.appendStream` and is finished by
`chat.stopStream`; Slack renders its Markdown itself, so the text goes with its
`<!here>`-style and `<@U…>` mentions made inert, as on the posted path. Tandem calls
the three methods (the ones slack-sdk's `chat_stream()` helper wraps) itself, so that it
keeps its own pace: at most one call a second per channel, the stop included, and the
latest text wins. A stream only grows: a stream must be a thread reply, and in a channel it names
who it is for (`recipient_team_id`, `recipient_user_id`).

Until the answer's first words the turn shows its status: in an assistant thread as the
thread's status line, elsewhere in a placeholder with ⏹ Cancel (posted only if the turn
takes longer than the placeholder delay), which the stream replaces. When the answer must
change rather than grow (the model starts over after a tool, the text outgrows one
message) or Slack refuses a stream, the message is stopped and carries on as a
`LiveMessage`, edited by `chat.update`; a refusal also marks the channel as one without
streams. `SlackStream` is a `Live` surface like `LiveMessage`; while it streams (or shows
only a status line) the edge offers ⏹ Cancel beside it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import aiohttp
from slack_sdk.errors import SlackApiError
from slack_sdk.web.async_client import AsyncWebClient

from adapters.live import LiveMessage, paused_for_approval
from adapters.slack_mrkdwn import quiet_mentions

log = logging.getLogger(__name__)
Live = LiveMessage[str | None]
MAX_STREAM = 11_000
"""The longest answer kept in one streamed message (Slack takes 12,000 per call)."""
REFUSALS = frozenset({"not_allowed", "feature_not_enabled", "unknown_method",
                      "channel_type_not_supported", "not_supported",
                      "not_allowed_token_type", "method_not_supported_for_channel_type",
                      "missing_recipient_team_id", "missing_recipient_user_id",
                      "invalid_arguments", "missing_scope"})
"""Errors that mean streams are not for this channel (or app): fall back, remember."""


@dataclass(frozen=True, slots=True)
class Where:
    channel: str
    thread_ts: str
    recipient: tuple[str, str] | None = None
    """(team, user) the stream is for: required in a channel, not in a DM."""


def _wait_of(exc: BaseException) -> float | None:
    """Seconds Slack asked to wait (a 429), or None."""
    if isinstance(exc, SlackApiError) and exc.response.status_code == 429:
        return float(exc.response.headers.get("Retry-After", 1) or 1)
    return None


class SlackStream:
    """One turn's answer as a Slack chat stream (see the module docstring)."""

    def __init__(self, client: AsyncWebClient, where: Where, *, min_interval: float,
                 live: Callable[[], Live], refused: Callable[[str], None],
                 status: Callable[[str], Awaitable[None]] | None = None,
                 lost_cancel: Callable[[], None] = lambda: None) -> None:
        self.client, self.where = client, where
        self._lost_cancel = lost_cancel
        """Told when the placeholder (and its ⏹) gives way to the stream."""
        self.min_interval = min_interval
        self._new_live, self._refused, self._status = live, refused, status
        self.placeholder: Live | None = None
        """The status placeholder shown before the answer's first words (no status line)."""
        self.live: Live | None = None
        """What the message carries on as once it left the stream."""
        self.ts: str | None = None
        self._streamed = ""
        self._stopped = False
        self._wanted = ""
        self._last = 0.0
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._hold_until = 0.0
        self._said = ""
        self._busy = self._ending = False
        self._statuses: set[asyncio.Task[None]] = set()
        self.calls = 0

    @property
    def refs(self) -> list[str | None]:
        if self.live is not None:
            return self.live.refs
        ours: list[str | None] = [self.ts] if self.ts else []
        return ours or (self.placeholder.refs if self.placeholder is not None else [])

    @property
    def cancellable(self) -> bool:
        """A placeholder (before the stream, or after it) carries ⏹ Cancel; a stream and
        a status line do not."""
        return self.live is not None or (self.ts is None and self.placeholder is not None)

    async def open(self, status: str, *, delay: float = 0.0) -> None:
        """Show the status; the stream itself starts no sooner than `delay` from now, so
        a quick answer is one message."""
        self._last = time.monotonic() + delay - self.min_interval
        if self._status is not None:
            await self._say_status(status)
        else:
            self.placeholder = self._new_live()
            await self.placeholder.open(status, delay=delay)

    def adopt(self, ref: str | None) -> None:
        self.live = self._new_live()
        self.live.adopt(ref)

    def update(self, text: str) -> None:
        """A status line: the assistant thread's status, or the placeholder's."""
        if self.live is not None:
            self.live.update(text)
        elif self._status is not None and text != self._said:
            self._said = text
            task = asyncio.get_running_loop().create_task(self._say_status(text))
            self._statuses.add(task)
            task.add_done_callback(self._statuses.discard)
        elif self.placeholder is not None and self.ts is None:
            self.placeholder.update(text)

    def answer(self, text: str) -> None:
        """The answer so far: streamed (coalesced, paced), its mentions quiet."""
        if self.live is not None:
            self.live.update(text)
            return
        self._wanted = quiet_mentions(text)
        self._wake.set()
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._loop())

    async def show(self) -> None:
        """On screen now (above an approval card): the placeholder, or the stream."""
        if self.live is not None:
            await self.live.show()
        elif self.ts is None and self.placeholder is not None:
            await self.placeholder.show()

    async def pause(self, said: str) -> bool:
        """Waiting for approval: the message says so; with only a status line shown, what
        the model said goes as a message of its own (the card says the rest)."""
        if self.refs:
            await self.finish(paused_for_approval(said))
            return True
        await self.close()
        if said.strip():
            live = self._new_live()
            await live.finish(said)
            await live.close()
        return False

    async def finish(self, text: str) -> None:
        await self._stop_loop()
        quiet = quiet_mentions(text)
        if self.live is None and self.ts is not None and not self._stopped \
                and quiet.startswith(self._streamed) and len(quiet) <= MAX_STREAM:
            if await self._stop_stream(quiet[len(self._streamed):]):
                return
        live = await self._as_live()
        await live.finish(text)

    async def close(self) -> None:
        await self._stop_loop()
        if self.ts is not None and not self._stopped and self.live is None:
            await self._stop_stream("")  # shutting down: leave a finished message
        for live in (self.live, self.placeholder):
            if live is not None:
                await live.close()

    # -- the stream ----------------------------------------------------------------------

    async def _loop(self) -> None:
        while self.live is None:
            await self._wake.wait()
            self._wake.clear()
            wait = max(self._last + self.min_interval, self._hold_until) - time.monotonic()
            if wait > 0:
                await asyncio.sleep(wait)
            text = self._wanted
            if text == self._streamed:
                continue
            self._busy = True  # a call under way is finished before the loop stops
            try:
                if not text.startswith(self._streamed) or len(text) > MAX_STREAM:
                    await self._carry_on(text)  # it must change, not grow: edits now
                    return
                await self._grow(text)
            finally:
                self._busy = False
            if self._ending:
                return

    async def _grow(self, text: str) -> None:
        delta = text[len(self._streamed):]
        if self.ts is None and self.placeholder is not None:
            await self.placeholder.close(land=True)  # no placeholder posted after this
            if self.placeholder.refs and \
                    (wait := self.placeholder.last_call + self.min_interval
                     - time.monotonic()) > 0:
                await asyncio.sleep(wait)  # it just landed: the stream keeps the pace
        failed: BaseException | None = None
        try:
            if self.ts is None:
                resp = await self.client.chat_startStream(
                    channel=self.where.channel, thread_ts=self.where.thread_ts,
                    markdown_text=delta, **self._recipient())
                self.ts = str(resp["ts"])
            else:
                await self.client.chat_appendStream(channel=self.where.channel, ts=self.ts,
                                                    markdown_text=delta)
            self._streamed = text
        except (SlackApiError, aiohttp.ClientError, TimeoutError) as exc:
            failed = exc
        finally:
            self._last = time.monotonic()
            self.calls += 1
        if failed is None:
            if self.placeholder is not None and self.ts is not None:
                await self._drop_placeholder()
        elif (retry := _wait_of(failed)) is not None:
            self._hold_until = time.monotonic() + retry
            self._wake.set()
        else:
            self._failed(failed)
            await self._carry_on(text)

    def _recipient(self) -> dict[str, Any]:
        if self.where.recipient is None:
            return {}
        team, user = self.where.recipient
        return {"recipient_team_id": team, "recipient_user_id": user}

    def _failed(self, exc: BaseException) -> None:
        error = exc.response.get("error") if isinstance(exc, SlackApiError) else None
        if self.ts is None and error in REFUSALS:
            log.info("slack: no streams in %s (%s); updating a message instead",
                     self.where.channel, error)
            self._refused(self.where.channel)
        else:
            log.warning("slack: a stream call failed in %s", self.where.channel,
                        exc_info=True)

    async def _stop_stream(self, rest: str) -> bool:
        """Finish the stream with its last words; False when Slack would not."""
        wait = max(self._last + self.min_interval, self._hold_until) - time.monotonic()
        if wait > 0:
            await asyncio.sleep(wait)
        assert self.ts is not None
        try:
            await self.client.chat_stopStream(channel=self.where.channel, ts=self.ts,
                                              markdown_text=rest or None)
            self._streamed += rest
            return True
        except (SlackApiError, aiohttp.ClientError, TimeoutError):
            log.warning("slack: could not stop a stream in %s", self.where.channel,
                        exc_info=True)
            return False
        finally:
            self._stopped = True
            self._last = time.monotonic()
            self.calls += 1

    async def _carry_on(self, text: str) -> None:
        """Show `text` as a LiveMessage from now on, on screen at once."""
        live = await self._as_live()
        live.update(text)
        if not live.refs:  # the placeholder was due later, or stopped before it landed
            if (wait := self._last + self.min_interval - time.monotonic()) > 0:
                await asyncio.sleep(wait)  # a refused stream was a call in this chat too
            await live.show()

    async def _as_live(self) -> Live:
        """The message as a LiveMessage from here on: the stream (stopped), else the
        placeholder, else a new one."""
        if self.live is not None:
            return self.live
        if self.ts is not None:
            if not self._stopped:
                await self._stop_stream("")
            self.live = self._new_live()
            self.live.adopt(self.ts)
        elif self.placeholder is not None:
            self.live, self.placeholder = self.placeholder, None
        else:
            self.live = self._new_live()
        return self.live

    async def _drop_placeholder(self) -> None:
        """The stream took the placeholder's place: it goes."""
        placeholder, self.placeholder = self.placeholder, None
        if placeholder is None:
            return
        self._lost_cancel()
        for ts in placeholder.refs:
            if ts is not None:
                with contextlib.suppress(SlackApiError, aiohttp.ClientError, TimeoutError):
                    await self.client.chat_delete(channel=self.where.channel, ts=ts)
                    self.calls += 1

    async def _stop_loop(self) -> None:
        """Stop streaming: at once when idle, else once the call under way is done."""
        task, self._task = self._task, None
        if task is None or task is asyncio.current_task():
            return
        self._ending = True
        if not self._busy:
            task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task

    async def _say_status(self, text: str) -> None:
        assert self._status is not None
        self._said = text
        try:
            await self._status(text)
        except (SlackApiError, aiohttp.ClientError, TimeoutError):
            log.info("slack: could not set the thread's status", exc_info=True)
