"""Telegram, on python-telegram-bot: updates in, events out.

Inbound: a handler decides whether a group message is for Tandem, normalizes it and
hands it to `hub.submit`. The hub checks access (`bot.access`, fails closed) before
anything else, and dedupes `tg:<update_id>` refs, so a redelivered update is answered
once; a stranger gets the hub's refusal, with their id, once per chat. A button
press changes nothing here until the hub took it: after a restart an approval card is
known only from a decision the hub accepted, pressed on a message of Tandem's that shows
that approval's buttons, so no other message is ever edited as the card. Outbound:
one `LiveMessage` per turn, at most one edit per second per chat; Markdown goes out as
Telegram HTML. Typing shows after `typing_delay`, the placeholder after
`placeholder_delay`: a quick answer arrives as one message rather than a placeholder and
an edit. The Bot API calls themselves (flood holds, edit pacing, the plain-text fallback,
the aiohttp transport) are in `adapters.telegram_api`. Updates come by long polling, or
in webhook mode (`telegram.mode`) from `adapters.telegram_webhook`; with `poll` false a
polling-mode adapter only sends (another worker, the elected one, polls).
"""

from __future__ import annotations

import asyncio
import logging
import re
import time
import weakref
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import aiohttp
from telegram import BotCommand, CallbackQuery, MaybeInaccessibleMessage, Message, Update
from telegram import User as TgUser
from telegram.constants import ChatType, MessageEntityType
from telegram.error import (
    BadRequest,
    Forbidden,
    InvalidToken,
    NetworkError,
    TelegramError,
    TimedOut,
)
from telegram.ext import (
    Application,
    ApplicationBuilder,
    CallbackQueryHandler,
    ContextTypes,
    MessageHandler,
    filters,
)

from adapters import telegram_render as render
from adapters.live import (
    QUEUED,
    THINKING,
    LiveMessage,
    Paused,
    RetryLater,
    paused_for_approval,
    split_text,
)
from adapters.telegram_api import AiohttpRequest, BotApi, Posted
from adapters.telegram_draft import STOP_HINT, Draft
from adapters.telegram_files import MEDIA, TelegramFiles, attachments
from adapters.telegram_webhook import ALLOWED_UPDATES, WebhookServer
from bot.app import Dispatch
from bot.buttons import STALE, ApprovalButton, CancelButton, ItemButton, pack, unpack
from bot.config import Config
from bot.errors import ConfigError, StoreError, TandemError, user_message
from bot.events import (
    ApprovalRequested,
    ApprovalResolved,
    Button,
    Cancel,
    Command,
    ConvKey,
    Decision,
    Event,
    Notice,
    Phase,
    Progress,
    Queued,
    Suspended,
    TurnEnded,
    TurnStarted,
    User,
    UserMessage,
    Verdict,
)
from bot.hub import Hub
from bot.llm.failures import cause

log = logging.getLogger(__name__)
PLATFORM = "telegram"
MAX_TEXT = 4096
COMMANDS = [("start", "Say hello"), ("help", "What Tandem can do"),
            ("new", "Start a fresh conversation"), ("stop", "Cancel what is running"),
            ("status", "Model, context and cost"), ("jobs", "Scheduled tasks here"),
            ("approvals", "Standing approval rules here"),
            ("audit", "Latest audit entries here (approvers)")]
PRESS_WAIT_S = 2.0
"""How long a press's answer waits for the core to settle the press."""


def cancel_keyboard(turn: int | None) -> list[list[tuple[str, str]]]:
    return [[("⏹ Cancel", pack(CancelButton(turn)))]]


class TelegramUnavailable(TandemError):
    """Telegram could not be reached at start."""


@dataclass(slots=True)
class _Turn:
    live: LiveMessage[Posted] | Draft
    status: str = THINKING
    tool: str | None = None
    tool_since: float = 0.0
    typing: asyncio.Task[None] | None = None


@dataclass(slots=True)
class _Card:
    chat: int
    message_id: int
    html: str


def _where(conv: ConvKey) -> tuple[int, int | None]:
    return int(conv.chat_id), int(conv.thread_id) if conv.thread_id else None


class TelegramAdapter:
    def __init__(self, config: Config, hub: Hub, *, min_edit_interval: float = 1.0,
                 placeholder_delay: float = 0.5, typing_delay: float = 0.2,
                 typing_interval: float = 4.0, poll: bool = True) -> None:
        tg = config.telegram
        if not tg.token:
            raise ConfigError("telegram.token", "is required when telegram.enabled is true")
        self.config, self.hub = config, hub
        self.placeholder_delay, self.typing_delay = placeholder_delay, typing_delay
        self.typing_interval = typing_interval
        self.render: Callable[[str], str] = render.to_html
        self._base = tg.base_url.rstrip("/").rpartition("/bot")[0] or tg.base_url
        head, bot, tail = tg.base_url.rstrip("/").rpartition("/bot")
        files = f"{head}/file/bot{tail}" if bot else "https://api.telegram.org/file/bot"
        self._requests = (AiohttpRequest(watch=hub.d.watch), AiohttpRequest(connections=2))
        self.app: Application[Any, Any, Any, Any, Any, Any] = (
            ApplicationBuilder().token(tg.token).base_url(tg.base_url).base_file_url(files)
            .request(self._requests[0]).get_updates_request(self._requests[1])
            .concurrent_updates(True).job_queue(None).build())
        self.api = BotApi(self.app.bot, min_interval=min_edit_interval)
        self.files = TelegramFiles(self.api)
        self.app.add_handler(MessageHandler(filters.UpdateType.MESSAGE & (filters.TEXT | MEDIA),
                                            self._on_message))
        self.app.add_handler(CallbackQueryHandler(self._on_callback))
        self.app.add_error_handler(self._on_error)
        self.username, self.bot_id = "", 0
        self.poll = poll
        """Polling mode: fetch updates; false sends only (another worker polls)."""
        self.url: str | None = None
        """Webhook mode: the endpoint as bound (port 0 picks a free port)."""
        self._webhook: WebhookServer | None = None
        self._running = False
        self._turns: dict[ConvKey, _Turn] = {}
        self._cards: dict[str, _Card] = {}
        self._unshown: OrderedDict[str, str] = OrderedDict()
        """Outcome lines of approvals resolved while their card was unknown."""
        self._paused: Paused[ConvKey, Posted] = Paused(lambda _, ref: self.api.delete(ref))
        """A turn waiting for approval: its placeholder (saying so) and its text."""
        self._no_drafts: set[int] = set()
        """Private chats where Telegram refused a draft."""
        self._presses: dict[tuple[ConvKey, str], asyncio.Future[str | None]] = {}
        """Button presses the core took and has yet to settle: a refusal it sends the
        presser goes to them privately, as the press's answer."""
        self._names: dict[str, str] = {}
        self._refused: set[tuple[int, str]] = set()
        self._recent: OrderedDict[str, tuple[int, int]] = OrderedDict()
        self._locks: weakref.WeakValueDictionary[ConvKey, asyncio.Lock] = \
            weakref.WeakValueDictionary()

    @property
    def min_edit_interval(self) -> float:
        """Seconds between two calls in one chat (the pace `api` keeps)."""
        return self.api.min_interval

    @min_edit_interval.setter
    def min_edit_interval(self, value: float) -> None:
        self.api.min_interval = value

    # -- lifecycle --------------------------------------------------------------------

    async def start(self) -> None:
        if self.config.telegram.mode == "webhook":  # its settings checked before any call
            self._webhook = WebhookServer(self.app, self.config.telegram.webhook)
        try:
            await self.app.initialize()  # getMe
        except InvalidToken:
            raise ConfigError("telegram.token", "was rejected by Telegram") from None
        except NetworkError as exc:  # a timeout too: one line, no traceback
            raise TelegramUnavailable(f"telegram: cannot reach {self._base} "
                                      f"({type(exc).__name__}: {exc})") from None
        me = self.app.bot.bot
        self.username, self.bot_id = me.username or "", me.id
        try:
            await self.app.bot.set_my_commands([BotCommand(n, d) for n, d in COMMANDS])
        except TelegramError as exc:  # the menu is a convenience: start without it
            log.warning("Telegram: could not register the command menu (%s)", exc)
        if self.hub.access.nobody(PLATFORM):
            log.warning("telegram.allowed_users is empty: Tandem answers nobody on Telegram")
        assert self.app.updater is not None
        self._running = True  # before the first update can be handled
        if self._webhook is not None:
            await self.app.start()
            await self._webhook.start()
            self.url = self._webhook.url
            log.info("Telegram: receiving updates on %s as @%s", self.url, self.username)
            return
        if self.poll:
            await self.start_polling()
        await self.app.start()
        log.info("Telegram: %s as @%s", "polling" if self.poll else "sending only",
                 self.username)

    async def start_polling(self) -> None:
        """Polling mode: begin polling (as the worker just elected to), if not already;
        in webhook mode there is nothing to do (every worker receives)."""
        if self._webhook is not None or self.config.telegram.mode == "webhook":
            return
        assert self.app.updater is not None
        if not self.app.updater.running:
            self.poll = True
            await self.app.updater.start_polling(allowed_updates=ALLOWED_UPDATES)

    async def stop(self) -> None:
        if self._webhook is not None:
            await self._webhook.stop()  # no new updates; the webhook stays set
        if self.app.updater is not None and self.app.updater.running:
            await self.app.updater.stop()  # confirms every fetched update
        if self.app.running:
            await self.app.stop()  # handles the updates already fetched
        self._running = False
        for turn in self._turns.values():
            await self._end(turn)
        self._turns.clear()
        await self.app.shutdown()
        await self.files.close()
        for request in self._requests:  # also when start() failed half way
            await request.shutdown()

    async def _on_error(self, update: object, context: ContextTypes.DEFAULT_TYPE) -> None:
        log.error("Telegram: handling an update failed", exc_info=context.error)
        message = update.effective_message if isinstance(update, Update) else None
        if isinstance(context.error, TandemError) and message is not None:
            await self._reply(message, user_message(context.error))

    # -- inbound ----------------------------------------------------------------------

    def _conv(self, message: Message | MaybeInaccessibleMessage) -> ConvKey:
        thread = None
        if message.chat.type != ChatType.PRIVATE and isinstance(message, Message) \
                and message.is_topic_message and message.message_thread_id:
            thread = str(message.message_thread_id)
        return ConvKey(PLATFORM, str(message.chat.id), thread)

    def _user(self, user: TgUser) -> User:
        """Telegram's numeric id as the core's string id (names never decide access)."""
        suffix = f" (@{user.username})" if isinstance(user.username, str) and user.username \
            else ""
        return User(str(user.id), str(user.first_name or user.id) + suffix)

    def _served(self, user: TgUser) -> None:
        """The hub took this user's input: remember the name their approval cards show."""
        self._names[str(user.id)] = str(user.first_name or user.id)

    def _stranger(self, note: str | None, user: User) -> bool:
        """A refusal's note says the hub refused the user (not on the allowed list), rather
        than this item."""
        return note is not None and note == self.hub.access.refusal(PLATFORM, user)

    def _addressed(self, message: Message, text: str) -> bool:
        """In a group: a mention, a reply to Tandem, or a command not for another bot."""
        if not self.config.telegram.groups.require_mention:
            return True
        reply = message.reply_to_message
        if reply is not None and reply.from_user is not None \
                and reply.from_user.id == self.bot_id and reply.forum_topic_created is None:
            return True
        kinds: list[str | None] = [MessageEntityType.MENTION, MessageEntityType.TEXT_MENTION]
        found = message.parse_entities(kinds) if message.text is not None \
            else message.parse_caption_entities(kinds)
        for entity, value in found.items():
            if value.lower() == f"@{self.username.lower()}" or \
                    (entity.user is not None and entity.user.id == self.bot_id):
                return True
        command = render.parse_command(text)
        return command is not None and self._for_me(command[2])

    def _for_me(self, target: str | None) -> bool:
        return target is None or target.lower() == self.username.lower()

    async def _on_message(self, update: Update, _context: ContextTypes.DEFAULT_TYPE) -> None:
        message = update.message
        sender = message.from_user if message is not None else None
        if message is None or sender is None or sender.is_bot or not isinstance(sender.id, int):
            return
        files = attachments(message)
        raw = message.text if message.text is not None else message.caption
        if not isinstance(raw, str | None) or (raw is None and not files):
            return  # not something a real client sends: ignore
        raw = raw or ""
        if message.chat.type != ChatType.PRIVATE and not self._addressed(message, raw):
            return
        conv, user = self._conv(message), self._user(sender)
        text, ref = render.strip_mention(raw, self.username), f"tg:{update.update_id}"
        command = render.parse_command(text)
        if command is not None and not self._for_me(command[2]):
            return
        lock = self._locks.get(conv) or self._locks.setdefault(conv, asyncio.Lock())
        async with lock:  # updates are handled concurrently: keep one chat's order
            if command is not None and command[0] in ("stop", "cancel"):
                receipt = await self.hub.cancel(Cancel(conv, user, ref))
            else:
                self._recent[ref] = (message.chat.id, message.message_id)
                while len(self._recent) > 1000:
                    self._recent.popitem(last=False)
                item = Command(conv, user, command[0], command[1], ref=ref) if command \
                    else UserMessage(conv, user, text, ref=ref, attachments=files)
                receipt = await self.hub.submit(item)
                if not receipt.accepted and self._stranger(receipt.note, user):
                    self._recent.pop(ref, None)
        if receipt.accepted:
            self._served(sender)
        elif receipt.note and self._stranger(receipt.note, user):
            await self._refuse(message, user, receipt.note)
        elif receipt.note:
            await self._reply(message, receipt.note)

    async def _refuse(self, message: Message, user: User, note: str) -> None:
        """One answer per stranger and chat (per process): the hub's refusal, with the id
        an admin needs. The hub logs the refusal."""
        key = (message.chat.id, user.id)
        if key in self._refused or len(self._refused) > 10_000:
            return
        self._refused.add(key)
        await self._reply(message, note)

    async def _reply(self, message: Message, text: str) -> None:
        try:
            await message.reply_text(text, do_quote=False)
        except TelegramError:
            log.warning("Telegram: could not reply in chat %s", message.chat.id, exc_info=True)

    async def _on_callback(self, update: Update, _context: ContextTypes.DEFAULT_TYPE) -> None:
        query = update.callback_query
        if query is None or query.from_user is None or not isinstance(query.from_user.id, int):
            return  # nothing a real client sends: ignore
        data = unpack(query.data or "")
        if data is None or query.message is None:
            await self._answer(query, STALE, alert=True)
            return
        conv, user = self._conv(query.message), self._user(query.from_user)
        ref = f"tg:cb:{query.id}"
        match data:
            case ApprovalButton(approval_id, verdict):
                receipt = await self.hub.submit(Decision(conv, user, approval_id, verdict, ref))
                if receipt.accepted:  # the requester or an approver, in the card's chat
                    await self._learn_card(query.message, approval_id)
            case CancelButton(turn):
                receipt = await self.hub.cancel(Cancel(conv, user, ref, turn))
                if receipt.accepted and (query.data or "") in self._buttons(query.message) \
                        and not self._live_here(conv, query.message.message_id):
                    # a placeholder whose reply was lost: its turn is over
                    await self.api.clear_buttons(query.message.chat.id,
                                                 query.message.message_id)
            case ItemButton() as item:
                receipt = await self.hub.submit(Command(conv, user, item.command, item.item_id,
                                                        ref=ref))
        note, alert = receipt.note, not receipt.accepted and bool(receipt.note)
        if receipt.accepted:
            self._served(query.from_user)
            if not note and isinstance(data, ApprovalButton | CancelButton):
                note = await self._settled(conv, user.id)
                alert = bool(note)
        # refused (a stranger too: the hub's text with their id): an alert, every press
        await self._answer(query, note, alert=alert)

    async def _settled(self, conv: ConvKey, user_id: str) -> str | None:
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

    def _settle(self, conv: ConvKey, user_id: str, note: str | None) -> bool:
        future = self._presses.get((conv, user_id))
        if future is None or future.done():
            return False
        future.set_result(note)
        return True

    def _live_here(self, conv: ConvKey, message_id: int) -> bool:
        """The message is (or may be, while it is being posted) the running turn's."""
        turn = self._turns.get(conv)
        if turn is None:
            return False
        refs = turn.live.refs
        return not refs or any(r.message_id == message_id for r in refs)

    def _buttons(self, message: MaybeInaccessibleMessage) -> list[str]:
        """The button data of a message Tandem posted. The message is Telegram's own copy:
        a forged press may name any data on any message, but never changes the message."""
        if not isinstance(message, Message) or message.from_user is None \
                or message.from_user.id != self.bot_id or message.reply_markup is None:
            return []
        return [button.callback_data for row in message.reply_markup.inline_keyboard
                for button in row if isinstance(button.callback_data, str)]

    def _shows(self, message: MaybeInaccessibleMessage, approval_id: str) -> bool:
        """The message is Tandem's card for this approval (it has only its buttons)."""
        buttons = [unpack(data) for data in self._buttons(message)]
        return bool(buttons) and all(isinstance(b, ApprovalButton) and
                                     b.approval_id == approval_id for b in buttons)

    async def _learn_card(self, message: MaybeInaccessibleMessage, approval_id: str) -> None:
        """After a restart a card is known only from a decision the hub took, pressed on
        it: only a message showing this approval's buttons is its card. It is remembered
        before the first await, so before the lane can resolve the approval; one that a
        concurrent press resolved first shows its outcome now."""
        if approval_id in self._cards or not isinstance(message, Message) \
                or not message.text or not self._shows(message, approval_id):
            return
        card = _Card(message.chat.id, message.message_id, message.text_html)
        line = self._unshown.pop(approval_id, None)
        if line is None:
            self._cards[approval_id] = card
            return
        try:
            await self._show_outcome(card, line)
        except (TelegramError, RetryLater):
            log.warning("Telegram: could not show an approval's outcome", exc_info=True)

    async def _answer(self, query: CallbackQuery, text: str | None, *, alert: bool) -> None:
        try:
            await query.answer(text[:200] if text else None, show_alert=alert)
        except TelegramError:
            log.warning("Telegram: could not answer a button press", exc_info=True)

    # -- outbound ---------------------------------------------------------------------

    async def emit(self, event: Event) -> None:
        if not self._running:
            log.debug("Telegram: stopped; %s dropped", type(event).__name__)
            return
        try:
            match event:
                case TurnStarted():
                    await self._turn_started(event.conv, event.turn)
                case Progress():
                    self._progress(event)
                case TurnEnded():
                    await self._turn_ended(event.conv, event.text, event)
                case Suspended():
                    await self._suspended(event)
                case ApprovalRequested() if event.reminder:
                    pass  # the card is still on screen
                case ApprovalRequested():
                    await self._approval_requested(event)
                case ApprovalResolved():
                    await self._approval_resolved(event)
                case Notice():
                    await self._notice_event(event)
                case Queued():
                    await self._queued(event)
        except (TelegramError, RetryLater):
            log.warning("Telegram: could not show %s in %s", type(event).__name__, event.conv,
                        exc_info=True)

    async def _turn_started(self, conv: ConvKey, number: int) -> None:
        old = self._turns.pop(conv, None)
        if old is not None:
            await self._end(old)
        await self._paused.settle(conv)
        chat, thread = _where(conv)
        live = self._new_draft(conv, number) if self._drafts(chat) \
            else self._new_live(conv, number)
        turn = self._turns[conv] = _Turn(live)
        turn.typing = asyncio.get_running_loop().create_task(self._typing(chat, thread, turn))
        await live.open(turn.status, delay=self.placeholder_delay)

    def _drafts(self, chat: int) -> bool:
        """Stream as a draft: a private chat (a user's id is positive) that has them."""
        return self.config.telegram.drafts and chat > 0 and chat not in self._no_drafts

    def _new_draft(self, conv: ConvKey, number: int) -> Draft:
        chat, thread = _where(conv)

        async def send(text: str) -> Posted:
            sent = await self.api.send(chat, thread, self.render(text), text)
            return Posted(chat, thread, sent.message_id, number)

        return Draft(self.api, chat, thread, number, limit=MAX_TEXT, render=self.render,
                     send=send, fallback=lambda: self._new_live(conv, number),
                     refused=self._no_drafts.add)

    def _new_live(self, conv: ConvKey, number: int) -> LiveMessage[Posted]:
        """The turn's live message; where its placeholder lands is kept in the store."""
        chat, thread = _where(conv)
        kept = False

        async def post(text: str, on: bool) -> Posted:
            nonlocal kept
            posted = await self._live_post(chat, thread, text, on, number)
            if on and not kept and posted.message_id is not None:
                kept = True
                await self._remember_live(conv, number, {"message_id": posted.message_id})
            return posted

        return LiveMessage(post, self._live_edit, limit=MAX_TEXT,
                           min_interval=self.min_edit_interval,
                           hold=lambda: self.api.next_at(chat))

    async def _remember_live(self, conv: ConvKey, number: int, where: dict[str, Any]) -> None:
        try:
            await self.hub.remember_live(conv, number, where)
        except StoreError:  # only a later process's convenience: the turn goes on
            log.warning("Telegram: could not keep where turn %d's message is", number,
                        exc_info=True)

    def _progress(self, event: Progress) -> None:
        turn = self._turns.get(event.conv)
        if turn is None:
            return
        turn.tool = None
        if event.text:
            status = event.text
            if isinstance(turn.live, Draft):
                turn.live.answer = event.text
        elif event.phase is Phase.TOOL and event.tool:
            turn.tool, turn.tool_since = event.tool, time.monotonic()
            status = self._tool_status(turn, event.tool, "")
        else:
            status = THINKING
        if status != turn.status:
            turn.status = status
            turn.live.update(status)

    @staticmethod
    def _tool_status(turn: _Turn, tool: str, seconds: str) -> str:
        status = f"⚙️ Running `{tool}`" + (f" · {seconds}" if seconds else "…")
        return f"{status}\n{STOP_HINT}" if isinstance(turn.live, Draft) and \
            turn.live.live is None else status

    async def _typing(self, chat: int, thread: int | None, turn: _Turn) -> None:
        """Typing while the turn runs; also ticks the seconds of a running tool."""
        await asyncio.sleep(self.typing_delay)
        while True:
            await self.api.typing(chat, thread)
            await asyncio.sleep(self.typing_interval)
            if turn.tool is not None:
                seconds = render.duration(time.monotonic() - turn.tool_since)
                turn.status = self._tool_status(turn, turn.tool, seconds)
                turn.live.update(turn.status)

    @staticmethod
    async def _stop_typing(turn: _Turn) -> None:
        typing, turn.typing = turn.typing, None
        if typing is not None:
            typing.cancel()
            await asyncio.gather(typing, return_exceptions=True)

    async def _end(self, turn: _Turn) -> None:
        """A turn that will not finish (shutdown, or superseded): stop its tasks."""
        await self._stop_typing(turn)
        await turn.live.close()

    async def _turn_ended(self, conv: ConvKey, text: str,
                          ended: TurnEnded | None = None) -> None:
        turn = self._turns.pop(conv, None)
        if turn is None and ended is not None and ended.live \
                and isinstance(message_id := ended.live.get("message_id"), int):
            # another process ran the turn and died: its placeholder becomes the answer
            live = self._new_live(conv, ended.turn)
            live.adopt(Posted(*_where(conv), message_id, ended.turn))
            await live.finish(text)
            await live.close()
            return
        if turn is None:
            if not await self._paused.settle(conv, text):  # ended while waiting for approval
                await self._notice(conv, text, ())
            return
        await self._stop_typing(turn)
        await turn.live.finish(text)
        await turn.live.close()

    async def _suspended(self, event: Suspended) -> None:
        """The turn waits for approval: a placeholder says so until the turn goes on; a
        draft leaves only what the model said (the card says the rest)."""
        turn = self._turns.pop(event.conv, None)
        if turn is None:
            return
        await self._stop_typing(turn)
        live = turn.live
        if isinstance(live, Draft) and live.live is None:
            if event.text.strip() and not live.answered:
                await live.finish(event.text)
            await live.close()
            return
        placeholder = live.live if isinstance(live, Draft) else live
        assert placeholder is not None
        await placeholder.finish(paused_for_approval(event.text))
        await placeholder.close()
        self._paused.park(event.conv, placeholder, event.text)

    async def _approval_requested(self, event: ApprovalRequested) -> None:
        turn = self._turns.get(event.conv)
        if turn is not None:
            await turn.live.show()  # the placeholder goes above the card
        chat, thread = _where(event.conv)
        requester = self._names.get(event.requester.id) or event.requester.name \
            or event.requester.id
        file_name, reply_to = None, None
        if len(event.summary) > render.CARD_SUMMARY_LIMIT:
            file_name = "command.txt" if event.tool == "shell" else f"{event.tool}.txt"
            sent = await self.api.send_document(
                chat, thread, event.summary.encode(), file_name,
                f"The full {event.tool} call awaiting approval.")
            reply_to = sent.message_id
        card = render.approval_card(event.tool, event.summary, requester, event.expires_in_s,
                                    file_name, event.reason)
        ids = [(label, pack(ApprovalButton(event.approval_id, verdict))) for label, verdict in
               (("✅ Approve", Verdict.APPROVE), ("❌ Deny", Verdict.DENY),
                ("♾️ Always in this chat", Verdict.ALWAYS))]
        message = await self.api.send(chat, thread, card, render.plain(card),
                                      [ids[:2], ids[2:]], reply_to)
        self._cards[event.approval_id] = _Card(chat, message.message_id, card)
        await self.hub.remember_card(event.approval_id, {
            "chat": chat, "message_id": message.message_id, "html": card})

    async def _known_card(self, approval_id: str) -> _Card | None:
        """The card of `approval_id`: posted here, else where the store says (another
        worker, or this one before a restart, posted it)."""
        card = self._cards.pop(approval_id, None)
        if card is not None:
            return card
        found = await self.hub.card_of(approval_id)
        if found is None or not isinstance(found.get("message_id"), int):
            return None
        return _Card(int(found.get("chat") or 0), found["message_id"], str(found.get("html")))

    async def _approval_resolved(self, event: ApprovalResolved) -> None:
        if event.by is not None:
            self._settle(event.conv, event.by.id, None)
        by = (event.by.name or event.by.id) if event.by is not None else None
        line = render.outcome_line(event.outcome, by)
        card = await self._known_card(event.approval_id)
        if card is not None and await self._show_outcome(card, line):
            return
        if card is None:  # a press may show where it is later
            self._unshown[event.approval_id] = line
            while len(self._unshown) > 1000:
                self._unshown.popitem(last=False)
        chat, thread = _where(event.conv)
        await self.api.send(chat, thread, line, render.plain(line))

    async def _show_outcome(self, card: _Card, line: str) -> bool:
        """The card with its outcome and no buttons; False when it is gone."""
        edited = Posted(card.chat, None, card.message_id)
        return await self.api.edit(edited, render.decided(card.html, line), None, None,
                                   final=True)

    async def _notice_event(self, event: Notice) -> None:
        """A notice for the chat; one meant for a person who just pressed a button is
        their press's answer (an alert) instead: Telegram has no private messages in a
        group."""
        to = event.ephemeral_to
        if to is None or not self._settle(event.conv, to.id, event.text):
            await self._notice(event.conv, event.text, event.buttons)

    async def _notice(self, conv: ConvKey, text: str, buttons: tuple[Button, ...]) -> None:
        chat, thread = _where(conv)
        parts = split_text(text or " ", MAX_TEXT)
        rows = [[(b.label, b.data) for b in buttons[i : i + 3]] for i in range(0, len(buttons), 3)]
        for i, part in enumerate(parts):
            await self.api.send(chat, thread, self.render(part), part,
                                rows if i == len(parts) - 1 else None)

    async def _queued(self, event: Queued) -> None:
        where = self._recent.get(event.ref or "")
        if where is None:
            return
        try:
            await self.api.react(where[0], where[1], "👀")
        except (BadRequest, InvalidToken):  # reactions off here; a 404: not served at all
            await self.api.send(*_where(event.conv), QUEUED, QUEUED)

    async def _live_post(self, chat: int, thread: int | None, text: str, live: bool,
                         turn: int | None) -> Posted:
        """LiveMessage's `post`: a new message, with ⏹ Cancel (for its turn) while live."""
        try:
            message = await self.api.send(chat, thread, self.render(text), text,
                                          cancel_keyboard(turn) if live else None, wait=False)
        except (BadRequest, Forbidden):
            log.error("Telegram: could not post in chat %s", chat, exc_info=True)
            return Posted(chat, thread, None, turn)
        except TimedOut:  # it may have arrived: never post twice; the text follows later
            log.warning("Telegram: no reply to a post in chat %s within %g s", chat,
                        self.api.send_timeout)
            return Posted(chat, thread, None, turn)
        except NetworkError as exc:
            raise RetryLater(2.0) from exc
        return Posted(chat, thread, message.message_id, turn)

    async def _live_edit(self, ref: Posted, text: str, live: bool) -> None:
        """LiveMessage's `edit`; a message that vanished is posted again."""
        try:
            if ref.message_id is None or not await self.api.edit(
                    ref, self.render(text), text, cancel_keyboard(ref.turn) if live else None,
                    final=not live):
                ref.message_id = (await self._live_post(ref.chat, ref.thread, text, live,
                                                        ref.turn)).message_id
        except (BadRequest, Forbidden):
            log.error("Telegram: could not edit in chat %s", ref.chat, exc_info=True)
        except NetworkError as exc:
            if not live:
                raise RetryLater(2.0) from exc
            log.info("Telegram: a streaming edit failed: %s", exc)


def create(config: Config, hub: Hub, dispatch: Dispatch) -> TelegramAdapter:
    adapter = TelegramAdapter(config, hub)
    dispatch.sinks[PLATFORM] = adapter
    dispatch.ports[PLATFORM] = adapter.files
    return adapter


# -- checked live, for `tandem doctor` and `tandem init` --------------------------------

TOKEN_SHAPE = re.compile(r"[0-9]+:[A-Za-z0-9_-]+")
CHECK_TIMEOUT_S = 5.0


async def check_token(token: str, base_url: str) -> tuple[str, str]:
    """Ask Telegram whose `token` is (getMe), the way `start` does. One of ("ok",
    "@username"), ("malformed", why), ("refused", Telegram's words, e.g. "401
    Unauthorized") or ("unreachable", "cannot reach <base_url> (why)"); never the token."""
    if not TOKEN_SHAPE.fullmatch(token):
        return "malformed", ("not a bot token (@BotFather's look like 123456789:AAF…: "
                             "digits, a colon, then letters)")
    try:
        async with aiohttp.ClientSession(trust_env=True) as session, session.get(
                f"{base_url}{token}/getMe",
                timeout=aiohttp.ClientTimeout(total=CHECK_TIMEOUT_S)) as reply:
            status, body = reply.status, await reply.json(content_type=None)
    except (aiohttp.ClientError, TimeoutError) as exc:
        return "unreachable", f"cannot reach {base_url} ({cause(exc, CHECK_TIMEOUT_S)})"
    except ValueError:
        return "unreachable", f"{base_url} did not answer as Telegram's Bot API does"
    result = body.get("result") if isinstance(body, dict) else None
    if status == 200 and isinstance(result, dict):
        return "ok", f"@{result.get('username')}"
    said = body.get("description") if isinstance(body, dict) else None
    words = f"{status} {said}" if said else f"HTTP {status}"
    if status in (401, 403, 404):
        return "refused", words
    return "unreachable", f"{base_url} answered {words}"


async def check(config: Config) -> list[tuple[str, str, str]]:
    """`tandem doctor`: whether Telegram takes telegram.token, and whose it is."""
    tg = config.telegram
    if not tg.token:
        return []  # the doctor says so itself
    outcome, text = await check_token(tg.token, tg.base_url)
    if outcome == "ok":
        return [("telegram", "ok", f"signed in as {text} (getMe)")]
    if outcome == "refused":
        return [("telegram", "fail", f"Telegram refused telegram.token ({text})")]
    if outcome == "malformed":
        return [("telegram", "fail", f"telegram.token is {text}")]
    return [("telegram", "fail", text)]
