"""How Slack shows what the edge decides: Tandem's `Chat` primitives on the Web API.

Markdown goes out as Block Kit sections of mrkdwn (`adapters.slack_render`). A turn's live
surface is a chat stream in a thread where Slack has them (`slack.streaming`; in a channel
only with the person it is for), else a placeholder with ⏹ Cancel edited by `chat.update`
(`LiveMessage`); where the placeholder lands is kept in the store, so that another process
can finish it. Calls wait out rate limits and short outages (`call`); a "slow down" during
a live message becomes `RetryLater`, and holds the channel's later edits. Something meant
for one person goes to them alone, as an ephemeral message.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Sequence
from functools import partial
from typing import Any, TypeVar

import aiohttp
from slack_sdk.errors import SlackApiError
from slack_sdk.web.async_client import AsyncWebClient
from slack_sdk.web.async_slack_response import AsyncSlackResponse

from adapters import slack_render as render
from adapters.edge import Where
from adapters.live import FINAL_DEADLINE_S, LiveMessage, RetryLater
from adapters.slack_inbound import PLATFORM
from adapters.slack_stream import SlackStream
from adapters.slack_stream import Where as StreamWhere
from adapters.slack_threads import remember
from bot.core.buttons import ApprovalButton, ButtonData
from bot.core.config import SlackConfig
from bot.core.errors import StoreError
from bot.core.events import ApprovalRequested, Button, ConvKey, Progress, User
from bot.serve.hub import Hub

log = logging.getLogger(__name__)
T = TypeVar("T")
Live = LiveMessage[str | None]
NETWORK_ERRORS = (SlackApiError, aiohttp.ClientError, TimeoutError)


def retry_after(exc: BaseException) -> float | None:
    """Seconds to wait before trying again, or None when retrying cannot help."""
    if isinstance(exc, SlackApiError):
        status = exc.response.status_code
        if status == 429:
            headers = exc.response.headers or {}
            raw = headers.get("Retry-After") or headers.get("retry-after") or 1
            return max(float(raw), 0.1)
        return 2.0 if status >= 500 else None
    return 2.0  # network trouble


class SlackChat:
    platform = PLATFORM
    failures: tuple[type[BaseException], ...] = (*NETWORK_ERRORS, RetryLater)

    def __init__(self, hub: Hub, slack: SlackConfig, client: Callable[[], AsyncWebClient],
                 *, min_edit_interval: float) -> None:
        self.hub, self.slack, self._client = hub, slack, client
        self.min_edit_interval = min_edit_interval
        self.team: str | None = None
        self.closed = False
        self.askers: OrderedDict[ConvKey, str] = OrderedDict()
        """Who last spoke to Tandem in each conversation (a stream in a channel is for
        them)."""
        self.card_at: OrderedDict[tuple[str, str], str] = OrderedDict()
        """(channel, ts) of decided cards: their approvals (a press on one is told so)."""
        self._holds: dict[str, float] = {}
        self._no_streams: set[str] = set()
        """Channels where Slack refused a stream."""

    @property
    def client(self) -> AsyncWebClient:
        return self._client()

    async def call(self, fn: Callable[[], Awaitable[T]], deadline: float = FINAL_DEADLINE_S,
                   channel: str | None = None) -> T:
        """A Web API call, waiting out rate limits and short outages until `deadline`."""
        give_up = time.monotonic() + deadline
        while True:
            try:
                return await fn()
            except NETWORK_ERRORS as exc:
                wait = retry_after(exc)
                if wait is None or time.monotonic() + wait > give_up or self.closed:
                    raise
                if channel is not None:
                    self._holds[channel] = time.monotonic() + wait
                await asyncio.sleep(wait)

    # -- a turn's live surface ------------------------------------------------------------

    def new_live(self, conv: ConvKey, turn: int,
                 lost_cancel: Callable[[], None]) -> SlackStream | Live:
        return self._stream(conv, turn, lost_cancel) or self._placeholder(conv, turn)

    def adopt_live(self, conv: ConvKey, turn: int, where: Where) -> Live | None:
        ts = where.get("ts")
        if not isinstance(ts, str):
            return None
        live = self._placeholder(conv, turn)
        live.adopt(ts)
        return live

    def _stream(self, conv: ConvKey, turn: int,
                lost_cancel: Callable[[], None]) -> SlackStream | None:
        """A stream for this turn: in a thread (streams are replies) where Slack has not
        refused one; in a channel only with the person it is for."""
        channel, thread = conv.chat_id, conv.thread_id
        if not self.slack.streaming or thread is None or channel in self._no_streams:
            return None
        dm = channel.startswith("D")
        asker = self.askers.get(conv)
        if not dm and (asker is None or self.team is None):
            return None
        where = StreamWhere(channel, thread, None if dm else (self.team or "", asker or ""))
        status = partial(self._assistant_status, channel, thread) \
            if dm and self.slack.assistant.enabled else None
        return SlackStream(self.client, where, min_interval=self.min_edit_interval,
                           live=lambda: self._placeholder(conv, turn),
                           refused=self._no_streams.add, status=status,
                           lost_cancel=lost_cancel)

    async def _assistant_status(self, channel: str, thread: str, text: str) -> None:
        """The assistant thread's status line ("is thinking…", "is running `shell`…")."""
        await self.client.assistant_threads_setStatus(
            channel_id=channel, thread_ts=thread, status=render.assistant_status(text))

    def _placeholder(self, conv: ConvKey, turn: int) -> Live:
        """The turn's edited placeholder; where it lands is kept in the store."""
        kept = False

        async def post(text: str, live: bool) -> str | None:
            nonlocal kept
            ts = await self._live_post(conv, text, live, turn)
            if live and not kept and ts is not None:
                kept = True
                try:
                    await self.hub.remember_live(conv, turn, {"ts": ts})
                except StoreError:  # only a later process's convenience: the turn goes on
                    log.warning("slack: could not keep where turn %d's message is", turn,
                                exc_info=True)
            return ts

        async def edit(ts: str | None, text: str, live: bool) -> None:
            await self._live_edit(conv, ts, text, live, turn)

        return LiveMessage(post, edit, limit=render.SECTION_CHARS,
                           min_interval=self.min_edit_interval,
                           hold=lambda: self._holds.get(conv.chat_id, 0.0))

    def _limited(self, channel: str, exc: BaseException) -> None:
        """Turn "slow down" (429, a 5xx, network trouble) into RetryLater for LiveMessage."""
        wait = retry_after(exc)
        if wait is not None:
            self._holds[channel] = time.monotonic() + wait
            raise RetryLater(wait) from None

    async def _live_post(self, conv: ConvKey, text: str, live: bool, turn: int) -> str | None:
        if self.closed:
            return None
        out = render.live(text, cancel=live, turn=turn, session=self.hub.session_of(conv))
        try:
            resp = await self.client.chat_postMessage(
                channel=conv.chat_id, thread_ts=conv.thread_id, text=out.text,
                blocks=out.blocks)
        except NETWORK_ERRORS as exc:
            self._limited(conv.chat_id, exc)
            log.error("slack: could not post in %s", conv, exc_info=True)
            return None
        return str(resp["ts"])

    async def _live_edit(self, conv: ConvKey, ts: str | None, text: str, live: bool,
                         turn: int) -> None:
        if self.closed or ts is None:
            return
        out = render.live(text, cancel=live, turn=turn, session=self.hub.session_of(conv))
        try:
            await self.client.chat_update(channel=conv.chat_id, ts=ts, text=out.text,
                                            blocks=out.blocks)
        except NETWORK_ERRORS as exc:
            self._limited(conv.chat_id, exc)
            log.warning("slack: could not edit %s in %s", ts, conv, exc_info=True)
            if not live:  # the final text must arrive: as a new message, then
                await self._live_post(conv, text, False, turn)

    def status(self, event: Progress, running_for: float | None) -> str:
        return render.progress_text(event)

    async def typing(self, conv: ConvKey) -> None:
        """Slack shows no typing for a bot (an assistant thread's status line says it)."""

    async def offer_prompts(self, channel: str, thread: str) -> None:
        """A new assistant thread: the configured prompts, offered."""
        prompts = [{"title": p[:75], "message": p} for p in self.slack.assistant.prompts]
        if not prompts:
            return
        try:
            await self.client.assistant_threads_setSuggestedPrompts(
                channel_id=channel, thread_ts=thread, prompts=prompts)
        except NETWORK_ERRORS:
            log.warning("slack: could not offer prompts in %s", channel, exc_info=True)

    # -- messages ---------------------------------------------------------------------

    async def _post_blocks(self, conv: ConvKey, text: str,
                           blocks: list[render.Block]) -> AsyncSlackResponse:
        return await self.call(lambda: self.client.chat_postMessage(
            channel=conv.chat_id, thread_ts=conv.thread_id, text=text, blocks=blocks),
            channel=conv.chat_id)

    async def post(self, conv: ConvKey, text: str,
                   buttons: Sequence[Button] = ()) -> list[str | None]:
        return [str((await self._post_blocks(conv, out.text, out.blocks))["ts"])
                for out in render.messages(text, buttons)]

    async def post_line(self, conv: ConvKey, line: str) -> None:
        # The line is mrkdwn already (its mention included), not Markdown to convert.
        await self._post_blocks(conv, line, [render.section(line)])

    async def delete(self, conv: ConvKey, ts: str | None) -> None:
        if ts is None:
            return
        channel = conv.chat_id
        try:
            await self.call(partial(self.client.chat_delete, channel=channel, ts=ts),
                            deadline=30.0, channel=channel)
        except NETWORK_ERRORS:
            log.info("slack: could not delete %s in %s", ts, channel, exc_info=True)

    async def tell(self, conv: ConvKey, user: User, text: str) -> bool:
        try:
            for out in render.messages(text):
                await self.call(partial(
                    self.client.chat_postEphemeral, channel=conv.chat_id, user=user.id,
                    thread_ts=conv.thread_id, text=out.text, blocks=out.blocks), deadline=30.0)
        except NETWORK_ERRORS:
            log.warning("slack: could not tell %s privately in %s", user.id, conv,
                        exc_info=True)
        return True

    async def react(self, conv: ConvKey, ref: str | None) -> bool:
        prefix = f"slack:{conv.chat_id}:"
        if ref is None or not ref.startswith(prefix):
            return True  # not a message of this channel's: nothing to mark
        try:
            await self.call(lambda: self.client.reactions_add(
                channel=conv.chat_id, timestamp=ref.removeprefix(prefix), name="eyes"),
                deadline=30.0)
        except SlackApiError as exc:
            if exc.response.get("error") == "already_reacted":
                return True
            log.warning("slack: could not react in %s (%s)", conv, exc.response.get("error"))
            return False  # reactions off: the edge says it instead
        return True

    # -- approval cards ---------------------------------------------------------------

    async def show_card(self, event: ApprovalRequested) -> Where:
        card = render.approval_card(event.approval_id, event.tool, event.summary,
                                    event.requester, event.expires_in_s, reason=event.reason)
        for blocks in card.preamble:
            await self._post_blocks(event.conv, f"The `{event.tool}` call, in full", blocks)
        resp = await self._post_blocks(event.conv, card.text, [*card.blocks, *card.buttons])
        return {"channel": str(resp["channel"]), "ts": str(resp["ts"]), "blocks": card.blocks}

    def decided_press(self, channel: str, ts: str, action_id: str) -> ButtonData | None:
        """A press without usable data on a decided card (a client showing the card as it
        was): the card's approval, so the core answers it ("Already decided…"). On a card
        still pending such a press is forged, and counts for nothing."""
        verdict = next((v for v, a in render.VERDICT_ACTIONS.items() if a == action_id), None)
        approval_id = self.card_at.get((channel, ts))
        if verdict is None or approval_id is None:
            return None
        return ApprovalButton(approval_id, verdict)

    def outcome_line(self, outcome: str, by: User | None) -> str:
        return render.outcome_line(outcome, by)

    async def decide_card(self, approval_id: str, where: Where, line: str) -> bool:
        blocks: Any = where.get("blocks")
        if not isinstance(blocks, list):
            return False
        channel, ts = str(where.get("channel")), str(where.get("ts"))
        remember(self.card_at, (channel, ts), approval_id)
        try:
            await self.call(lambda: self.client.chat_update(
                channel=channel, ts=ts, text=line, blocks=render.decided(blocks, line)),
                channel=channel)
        except SlackApiError:
            log.warning("slack: could not update the card %s", ts, exc_info=True)
            return False
        return True
