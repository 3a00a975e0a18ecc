"""Telegram, on python-telegram-bot: updates in, events out.

Inbound: a handler decides whether a group message is for Tandem
(`adapters.telegram_inbound`), normalizes it and hands it to `hub.submit`. The hub
checks access (`bot.serve.access`, fails closed) before anything else, and dedupes
`tg:<update_id>` refs, so a redelivered update is answered once; a stranger gets the
hub's refusal, with their id, once per chat. A button press changes nothing here until
the hub took it: after a restart an approval card is known only from a decision the hub
accepted, pressed on a message of Tandem's that shows that approval's buttons, so no
other message is ever edited as the card. Outbound: the shared edge (`adapters.edge`)
decides what the chat shows and calls Telegram's primitives (`adapters.telegram_chat`);
the Bot API calls themselves are in `adapters.telegram_api`. Updates come by long
polling, or in webhook mode (`telegram.mode`) from `adapters.telegram_webhook`; with
`poll` false a polling-mode adapter only sends (another worker, the elected one, polls).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from telegram import BotCommand, Update
from telegram import User as TgUser
from telegram.constants import ChatType
from telegram.error import InvalidToken, NetworkError, TelegramError
from telegram.ext import (
    Application,
    ApplicationBuilder,
    CallbackQueryHandler,
    ContextTypes,
    MessageHandler,
    filters,
)

from adapters import telegram_render as render
from adapters.edge import Edge, EdgeTimings
from adapters.telegram_api import AiohttpRequest, BotApi, Posted
from adapters.telegram_chat import PLATFORM, TelegramChat
from adapters.telegram_check import check, check_token
from adapters.telegram_files import MEDIA, TelegramFiles, attachments
from adapters.telegram_inbound import (
    addressed,
    aside_of,
    buttons_of,
    conv_of,
    edit_of,
    for_me,
    item_of,
    user_of,
)
from adapters.telegram_replies import answer, card_of, reply
from adapters.telegram_webhook import ALLOWED_UPDATES, WebhookServer
from bot.core.buttons import STALE, ApprovalButton, CancelButton, ItemButton, unpack
from bot.core.config import Config
from bot.core.errors import ConfigError, TandemError, user_message
from bot.core.events import Cancel, Command, ConvKey, Decision, Event, User
from bot.run.app import Dispatch
from bot.serve.hub import Hub

__all__ = ["TelegramAdapter", "check", "check_token", "create"]
log = logging.getLogger(__name__)
COMMANDS = [("start", "Say hello"), ("help", "What Tandem can do"),
            ("new", "Start a fresh conversation"), ("stop", "Cancel what is running"),
            ("status", "Model, context and cost"), ("jobs", "Scheduled tasks here"),
            ("rules", "Standing approval rules here"), ("model", "Switch the model here"),
            ("audit", "Latest audit entries here (approvers)")]


class TelegramUnavailable(TandemError):
    """Telegram could not be reached at start."""


class TelegramAdapter(EdgeTimings):
    def __init__(self, config: Config, hub: Hub, *, min_edit_interval: float = 1.0,
                 placeholder_delay: float = 0.5, typing_delay: float = 0.2,
                 typing_interval: float = 4.0, cancel_delay: float = 1.5,
                 poll: bool = True) -> None:
        tg = config.telegram
        if not tg.token:
            raise ConfigError("telegram.token", "is required when telegram.enabled is true")
        self.config, self.hub = config, hub
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
        self.chat = TelegramChat(self.api, hub, tg)
        self.edge: Edge[Posted] = Edge(
            self.chat, hub, placeholder_delay=placeholder_delay, cancel_delay=cancel_delay,
            typing_delay=typing_delay, typing_interval=typing_interval)
        self.app.add_handler(MessageHandler(filters.UpdateType.MESSAGE & (filters.TEXT | MEDIA),
                                            self._on_message))
        self.app.add_handler(MessageHandler(filters.UpdateType.EDITED_MESSAGE & filters.TEXT,
                                            self._on_edit))
        self.app.add_handler(CallbackQueryHandler(self._on_callback))
        self.app.add_error_handler(self._on_error)
        self.username, self.bot_id = "", 0
        self.poll = poll
        """Polling mode: fetch updates; false sends only (another worker polls)."""
        self.url: str | None = None
        """Webhook mode: the endpoint as bound (port 0 picks a free port)."""
        self._webhook: WebhookServer | None = None
        self._running = False

    @property
    def min_edit_interval(self) -> float:
        """Seconds between two calls in one chat (the pace `api` keeps)."""
        return self.api.min_interval

    @min_edit_interval.setter
    def min_edit_interval(self, value: float) -> None:
        self.api.min_interval = value

    @property
    def render(self) -> Callable[[str], str]:
        """Markdown to Telegram HTML."""
        return self.chat.render

    @render.setter
    def render(self, value: Callable[[str], str]) -> None:
        self.chat.render = value

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
        await self.edge.close()
        await self.app.shutdown()
        await self.files.close()
        for request in self._requests:  # also when start() failed half way
            await request.shutdown()

    async def _on_error(self, update: object, context: ContextTypes.DEFAULT_TYPE) -> None:
        log.error("Telegram: handling an update failed", exc_info=context.error)
        message = update.effective_message if isinstance(update, Update) else None
        if isinstance(context.error, TandemError) and message is not None:
            await reply(message, user_message(context.error))

    # -- inbound ----------------------------------------------------------------------

    def _stranger(self, note: str | None, user: User) -> bool:
        """The note says the hub refused the user (not on the allowed list), not the item."""
        return note is not None and note == self.hub.access.refusal(PLATFORM, user)

    def _served(self, user: TgUser) -> None:
        """The hub took this user's input: remember the name their approval cards show."""
        self.chat.names[str(user.id)] = str(user.first_name or user.id)

    async def _on_message(self, update: Update, _context: ContextTypes.DEFAULT_TYPE) -> None:
        message = update.message
        sender = message.from_user if message is not None else None
        if message is None or sender is None or sender.is_bot or not isinstance(sender.id, int):
            return
        files = attachments(message)
        raw = message.text if message.text is not None else message.caption
        if not isinstance(raw, str | None) or (raw is None and not files):
            return  # not something a real client sends: ignore
        raw, ref = raw or "", f"tg:{update.update_id}"
        conv, user = conv_of(message, self.config.telegram.groups, sender), user_of(sender)
        text = render.strip_mention(raw, self.username)
        if message.chat.type != ChatType.PRIVATE and self.config.telegram.groups.require_mention \
                and not addressed(message, raw, self.username, self.bot_id):
            if self.config.telegram.groups.context:  # kept as context, never answered
                async with self.edge.lock(conv):
                    await self.hub.submit(aside_of(message, user, text, ref, self.bot_id))
            return
        command = render.parse_command(text)
        if command is not None and not for_me(command[2], self.username):
            return
        async with self.edge.lock(conv):  # updates are handled concurrently: keep the order
            if command is not None and command[0] in ("stop", "cancel"):
                receipt = await self.hub.cancel(Cancel(conv, user, ref))
            else:
                self.chat.heard(ref, message.chat.id, message.message_id)
                receipt = await self.hub.submit(
                    item_of(message, conv, user, text, ref, files, self.bot_id))
                if not receipt.accepted and self._stranger(receipt.note, user):
                    self.chat.recent.pop(ref, None)
        if receipt.accepted:
            self._served(sender)
        elif receipt.note and self._stranger(receipt.note, user):
            if self.edge.first_time(conv.chat_id, user.id):  # the hub logs the refusal
                await reply(message, receipt.note)
        elif receipt.note:
            await reply(message, receipt.note)

    async def _on_edit(self, update: Update, _context: ContextTypes.DEFAULT_TYPE) -> None:
        """An edit: the core decides what it changes (`bot.serve.talk`)."""
        item = edit_of(update.edited_message, self.username, f"tg:{update.update_id}",
                       self.config.telegram.groups)
        if item is not None:
            async with self.edge.lock(item.conv):
                await self.hub.submit(item)

    async def _on_callback(self, update: Update, _context: ContextTypes.DEFAULT_TYPE) -> None:
        query = update.callback_query
        if query is None or query.from_user is None or not isinstance(query.from_user.id, int):
            return  # nothing a real client sends: ignore
        data = unpack(query.data or "")
        message = query.message
        if data is None or message is None:
            await answer(query, STALE, alert=True)
            return
        conv, user = conv_of(message), user_of(query.from_user)
        ref = f"tg:cb:{query.id}"
        match data:
            case ApprovalButton(approval_id, verdict):
                receipt = await self.hub.submit(Decision(conv, user, approval_id, verdict, ref))
                if receipt.accepted and not self.edge.cards.known(approval_id) \
                        and (card := card_of(message, self.bot_id, approval_id)) is not None:
                    await self.edge.cards.learn(approval_id, card)  # the press's own card
            case CancelButton(turn, session):
                receipt = await self.hub.cancel(Cancel(conv, user, ref, turn, session))
                if receipt.accepted and (query.data or "") in buttons_of(message, self.bot_id) \
                        and not self._live_here(conv, message.message_id):
                    # a placeholder whose reply was lost: its turn is over
                    await self.api.clear_buttons(message.chat.id, message.message_id)
            case ItemButton() as item:
                receipt = await self.hub.submit(Command(conv, user, item.command, item.item_id,
                                                        ref=ref))
        note, alert = receipt.note, not receipt.accepted and bool(receipt.note)
        if receipt.accepted:
            self._served(query.from_user)
            if not note and isinstance(data, ApprovalButton | CancelButton):
                note = await self.edge.settled(conv, user.id)
                alert = bool(note)
        # refused (a stranger too: the hub's text with their id): an alert, every press
        await answer(query, note, alert=alert)

    def _live_here(self, conv: ConvKey, message_id: int) -> bool:
        return self.edge.turns.shows(conv, lambda ref: ref.message_id == message_id)

    # -- outbound ---------------------------------------------------------------------

    async def emit(self, event: Event) -> None:
        if not self._running:
            log.debug("Telegram: stopped; %s dropped", type(event).__name__)
            return
        await self.edge.emit(event)


def create(config: Config, hub: Hub, dispatch: Dispatch) -> TelegramAdapter:
    adapter = TelegramAdapter(config, hub)
    dispatch.sinks[PLATFORM] = adapter
    dispatch.ports[PLATFORM] = adapter.files
    return adapter
