"""The Telegram Bot API as the adapter calls it: paced per chat, over aiohttp.

`BotApi` makes every call the adapter sends to a chat, and every one of them (sends,
edits, reactions, drafts, files) goes through one per-chat pacer: a call starts no
sooner than `min_interval` after the previous call to that chat came back, so Telegram's
"about one message per second in a chat" is kept rather than found out by a 429. Should a
`retry_after` come all the same, it holds every call to that chat; a call that may wait
sleeps out the hold and retries (until the final deadline), one that may not raises
`RetryLater`. HTML that Telegram cannot parse goes again as plain text, and an edit that
changes nothing counts as done. `AiohttpRequest` is PTB's transport (a `BaseRequest`) on
aiohttp, which costs a quarter of the CPU of PTB's default httpx one.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

import aiohttp
from aiohttp.helpers import get_env_proxy_for_url
from telegram import (
    Bot,
    InlineKeyboardButton,
    InlineKeyboardMarkup,
    InputFile,
    Message,
    ReactionTypeEmoji,
    ReplyParameters,
    Update,
)
from telegram.constants import ChatAction, ParseMode
from telegram.error import BadRequest, NetworkError, RetryAfter, TelegramError, TimedOut
from telegram.request import BaseRequest, RequestData
from yarl import URL

from adapters import telegram_render as render
from adapters.live import FINAL_DEADLINE_S, RetryLater
from bot.core.watch import PlatformCall, Watch

log = logging.getLogger(__name__)
T = TypeVar("T")
TRANSIENT_RETRIES = 4
SEND_TIMEOUT_S = 30.0
"""How long a send waits for Telegram's reply. A send that times out may still have
arrived, and without its reply its message can never be edited: wait long for it."""
Rows = list[list[tuple[str, str]]]
_NOT_SERVED = object()


def defuse_updates(body: bytes) -> bytes:
    """Replace any update the library cannot parse by a bare `{"update_id": N}`.

    One malformed update fails the library's parsing of its whole batch, and the offset
    would never move past it: the bot would stall. The bare update is confirmed and
    matches no handler.
    """
    try:
        reply = json.loads(body)
        updates = reply["result"]
    except (ValueError, KeyError, TypeError):
        return body
    if not isinstance(updates, list):
        return body
    changed = False
    for i, item in enumerate(updates):
        try:
            Update.de_json(item, None)  # type: ignore[arg-type]
        except Exception:  # whatever the library raises on junk
            update_id = item.get("update_id") if isinstance(item, dict) else None
            log.warning("Telegram: update %s could not be parsed; skipped", update_id)
            updates[i] = {"update_id": update_id} if isinstance(update_id, int) else None
            changed = True
    if not changed:
        return body
    reply["result"] = [u for u in updates if u is not None]
    return json.dumps(reply).encode()


_Proxy = tuple[URL, aiohttp.BasicAuth | None] | None


def env_proxy(url: str) -> _Proxy:
    """The proxy the environment (`HTTPS_PROXY`, `NO_PROXY`…) sets for `url`, if any."""
    try:
        return get_env_proxy_for_url(URL(url))
    except LookupError:
        return None


class AiohttpRequest(BaseRequest):
    """PTB's transport boundary (`do_request` → status and body) on an aiohttp session.

    Proxy settings come from the environment, looked up once per host rather than on
    every request (aiohttp's `trust_env` re-reads them each time). A poll that asks again
    from the offset whose updates it was just given means the library could not parse
    them: that answer goes through `defuse_updates` (only then, as it parses each update
    once more). A call that fails is told to `watch` (`PlatformCall`: its HTTP status, a
    429 when Telegram limits the rate, 0 when no answer came)."""

    def __init__(self, *, read_timeout: float = 5.0, connect_timeout: float = 5.0,
                 connections: int = 64, watch: Watch | None = None) -> None:
        self._read, self._connect, self._connections = read_timeout, connect_timeout, connections
        self.watch = watch
        self._session: aiohttp.ClientSession | None = None
        self._proxies: dict[str, _Proxy] = {}
        self._served_from: object = _NOT_SERVED
        """The offset of the last poll, if it was given updates."""

    def _proxy(self, url: str) -> _Proxy:
        end = url.find("/", url.find("//") + 2)
        origin = url if end < 0 else url[:end]
        if origin not in self._proxies:
            self._proxies[origin] = env_proxy(origin)
        return self._proxies[origin]

    @property
    def read_timeout(self) -> float:
        return self._read

    async def initialize(self) -> None:
        if self._session is None or self._session.closed:
            connector = aiohttp.TCPConnector(limit=self._connections)
            self._session = aiohttp.ClientSession(connector=connector)

    async def shutdown(self) -> None:
        if self._session is not None and not self._session.closed:
            await self._session.close()

    async def do_request(self, url: str, method: str, request_data: RequestData | None = None,
                         read_timeout: object = None, write_timeout: object = None,
                         connect_timeout: object = None, pool_timeout: object = None,
                         ) -> tuple[int, bytes]:
        if self._session is None or self._session.closed:
            raise RuntimeError("AiohttpRequest is not initialized")
        read = read_timeout if isinstance(read_timeout, int | float) else self._read
        connect = connect_timeout if isinstance(connect_timeout, int | float) else self._connect
        data: dict[str, str] | aiohttp.FormData | None = None
        if request_data is not None:
            data = request_data.json_parameters
            if request_data.contains_files:
                data = aiohttp.FormData(data)
                for name, (filename, content, mime) in request_data.multipart_data.items():
                    data.add_field(name, content, filename=filename, content_type=mime)
        polling = url.endswith("/getUpdates")
        offset = request_data.parameters.get("offset") if polling and request_data else None
        timeout = aiohttp.ClientTimeout(sock_connect=connect, sock_read=read)
        proxy, proxy_auth = self._proxy(url) or (None, None)
        try:
            async with self._session.request(method, url, data=data, timeout=timeout,
                                             proxy=proxy, proxy_auth=proxy_auth) as reply:
                body = await reply.read()
                if polling and reply.status == 200:
                    if offset == self._served_from:
                        body = defuse_updates(body)
                    self._served_from = offset if b'"update_id"' in body else _NOT_SERVED
                if reply.status >= 400 and self.watch is not None \
                        and b"message is not modified" not in body:  # counts as done
                    await self._failed(url, reply.status)
                return reply.status, body
        except TimeoutError as exc:
            await self._failed(url, 0)
            raise TimedOut from exc
        except aiohttp.ClientError as exc:
            await self._failed(url, 0)
            raise NetworkError(f"aiohttp.{type(exc).__name__}: {exc}") from exc

    async def _failed(self, url: str, status: int) -> None:
        if self.watch is not None:
            method = url.rpartition("/")[2]
            method = method if method.isalnum() and len(method) <= 40 else "other"
            await self.watch.see(PlatformCall("telegram", method, status))


@dataclass(slots=True)
class Posted:
    """A message the bot showed; `message_id` None: not on screen, the next edit posts."""

    chat: int
    thread: int | None
    message_id: int | None
    turn: int | None = None
    """The turn a live placeholder belongs to (its Cancel button carries it)."""
    session: int | None = None
    """That turn's session (its Cancel button carries it too)."""


@dataclass(slots=True)
class _Pace:
    """Per chat: the earliest start of the next call, and until when Telegram said to wait.
    The lock keeps one call in flight per chat, so each is spaced from the one before."""

    next_at: float = 0.0
    hold_until: float = 0.0
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)


def _seconds(value: int | float | dt.timedelta) -> float:
    return value.total_seconds() if isinstance(value, dt.timedelta) else float(value)


def _is(exc: BadRequest, *needles: str) -> bool:
    return any(n in exc.message.lower() for n in needles)


def _keyboard(rows: Rows | None) -> InlineKeyboardMarkup | None:
    buttons = [[InlineKeyboardButton(label, callback_data=data) for label, data in row]
               for row in rows or [] if row]
    return InlineKeyboardMarkup(buttons) if buttons else None


class BotApi:
    """One bot's calls to chats, paced per chat and held while Telegram says to wait."""

    def __init__(self, bot: Bot, *, min_interval: float,
                 send_timeout: float = SEND_TIMEOUT_S) -> None:
        self.bot = bot
        self.min_interval = min_interval
        """Seconds from one call's answer to the next call in the same chat."""
        self.send_timeout = send_timeout
        self._paces: dict[int, _Pace] = {}

    def _pace(self, chat: int) -> _Pace:
        pace = self._paces.get(chat)
        if pace is None:
            pace = self._paces[chat] = _Pace()
        return pace

    def next_at(self, chat: int) -> float:
        """When the next call to `chat` may go out."""
        pace = self._pace(chat)
        return max(pace.next_at, pace.hold_until)

    def held(self, chat: int) -> bool:
        return self._pace(chat).hold_until > time.monotonic()

    async def _call(self, chat: int, call: Callable[[], Awaitable[T]], *,
                    wait: bool = True) -> T:
        """One call in its turn; flood control holds the chat, then waits and retries (or
        RetryLater when `wait` is false)."""
        pace = self._pace(chat)
        give_up = time.monotonic() + FINAL_DEADLINE_S
        failures = 0
        async with pace.lock:
            while True:
                if not wait and pace.hold_until > time.monotonic():
                    raise RetryLater(pace.hold_until - time.monotonic())
                if (delay := self.next_at(chat) - time.monotonic()) > 0:
                    await asyncio.sleep(delay)
                try:
                    return await call()
                except RetryAfter as exc:
                    seconds = _seconds(exc.retry_after)
                    pace.hold_until = max(pace.hold_until, time.monotonic() + seconds)
                    log.warning("Telegram: flood control in chat %s, holding %.0f s", chat,
                                seconds)
                    if not wait or time.monotonic() + seconds > give_up:
                        raise RetryLater(seconds) from None
                except NetworkError as exc:  # 5xx, connection trouble; a 400 is not
                    failures += 1          # retried, nor a timeout (it may have arrived)
                    if isinstance(exc, BadRequest | TimedOut) or failures > TRANSIENT_RETRIES:
                        raise
                    log.warning("Telegram: %s; retrying", type(exc).__name__)
                    await asyncio.sleep(min(4.0, 0.25 * 2**failures))
                finally:
                    pace.next_at = time.monotonic() + self.min_interval

    async def paced(self, chat: int, call: Callable[[], Awaitable[T]]) -> T:
        """Any call to `chat`, kept to the chat's pace and retried after flood control."""
        return await self._call(chat, call)

    async def typing(self, chat: int, thread: int | None) -> None:
        """The typing action (not a message: unpaced), unless the chat is held; a failure
        is only logged."""
        if not self.held(chat):
            try:
                await self.bot.send_chat_action(chat, ChatAction.TYPING,
                                                message_thread_id=thread)
            except TelegramError:
                log.debug("Telegram: typing action failed", exc_info=True)

    async def react(self, chat: int, message_id: int, emoji: str) -> None:
        await self._call(chat, lambda: self.bot.set_message_reaction(
            chat, message_id, [ReactionTypeEmoji(emoji)]))

    async def send_document(self, chat: int, thread: int | None, content: bytes,
                            filename: str, caption: str) -> Message:
        document = InputFile(content, filename=filename)
        return await self._call(chat, lambda: self.bot.send_document(
            chat, document, caption=caption, message_thread_id=thread,
            read_timeout=self.send_timeout))

    async def send(self, chat: int, thread: int | None, html_text: str, plain: str,
                   rows: Rows | None = None, reply_to: int | None = None, *,
                   wait: bool = True) -> Message:
        """Send HTML; if Telegram cannot parse it, the same text as plain text."""
        markup = _keyboard(rows)
        reply = ReplyParameters(reply_to, allow_sending_without_reply=True) if reply_to else None

        def send(text: str, mode: str | None) -> Callable[[], Awaitable[Message]]:
            return lambda: self.bot.send_message(
                chat, text, parse_mode=mode, reply_markup=markup, message_thread_id=thread,
                reply_parameters=reply, read_timeout=self.send_timeout)

        try:
            return await self._call(chat, send(html_text, ParseMode.HTML), wait=wait)
        except BadRequest as exc:
            if not _is(exc, "can't parse entities"):
                raise
            log.warning("Telegram: HTML rejected (%s); sending plain text", exc.message)
            return await self._call(chat, send(plain, None), wait=wait)

    async def edit(self, ref: Posted, html_text: str, plain: str | None, rows: Rows | None,
                   *, final: bool) -> bool:
        """Edit (a final edit waits out a hold; a streaming one raises RetryLater).
        False: the message is gone."""
        message_id, markup = ref.message_id, _keyboard(rows)

        def edit(text: str, mode: str | None) -> Callable[[], Awaitable[Any]]:
            return lambda: self.bot.edit_message_text(
                text, ref.chat, message_id, parse_mode=mode, reply_markup=markup)

        try:
            try:
                await self._call(ref.chat, edit(html_text, ParseMode.HTML), wait=final)
            except BadRequest as exc:
                if not _is(exc, "can't parse entities"):
                    raise
                log.warning("Telegram: HTML rejected (%s); editing as plain text", exc.message)
                await self._call(ref.chat, edit(plain or render.plain(html_text), None),
                                 wait=final)
        except BadRequest as exc:
            if _is(exc, "not modified"):
                return True
            if _is(exc, "message to edit not found", "message can't be edited"):
                return False
            raise
        return True

    async def draft(self, chat: int, thread: int | None, draft_id: int, html_text: str,
                    plain: str) -> None:
        """Show a draft (a private chat's preview of the answer being written); HTML
        Telegram cannot parse goes as plain text. Held chats raise RetryLater."""
        def draft(text: str, mode: str | None) -> Callable[[], Awaitable[bool]]:
            return lambda: self.bot.send_message_draft(
                chat, draft_id, text, message_thread_id=thread, parse_mode=mode)

        try:
            await self._call(chat, draft(html_text, ParseMode.HTML), wait=False)
        except BadRequest as exc:
            if not _is(exc, "can't parse entities"):
                raise
            await self._call(chat, draft(plain, None), wait=False)

    async def delete(self, ref: Posted) -> None:
        """Delete one of the bot's messages (a failure is only logged)."""
        if ref.message_id is None:
            return
        message_id = ref.message_id
        try:
            await self._call(ref.chat, lambda: self.bot.delete_message(ref.chat, message_id))
        except (TelegramError, RetryLater):
            log.info("Telegram: could not delete a message", exc_info=True)

    async def clear_buttons(self, chat: int, message_id: int) -> None:
        """Take the buttons off a message (a failure is only logged)."""
        try:
            await self._call(chat, lambda: self.bot.edit_message_reply_markup(
                chat, message_id, reply_markup=None), wait=False)
        except (TelegramError, RetryLater):
            log.info("Telegram: could not clear the buttons of a message", exc_info=True)
