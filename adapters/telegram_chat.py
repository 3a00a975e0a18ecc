"""How Telegram shows what the edge decides: Tandem's `Chat` primitives on the Bot API.

Every call goes through `BotApi` (paced per chat, flood holds, the plain-text fallback).
Markdown goes out as Telegram HTML. A turn's live surface is a message draft in a private
chat that has them (`telegram.drafts`), else a placeholder with ⏹ Cancel edited at most
once a second (`LiveMessage`); where the placeholder lands is kept in the store, so that
another process can finish it. Telegram has no private message in a group: `tell` says
no, and the edge answers a presser through the press itself.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import Any

from telegram.error import (
    BadRequest,
    Forbidden,
    InvalidToken,
    NetworkError,
    TelegramError,
    TimedOut,
)

from adapters import telegram_render as render
from adapters.edge import Where
from adapters.live import THINKING, LiveMessage, RetryLater, split_text
from adapters.telegram_api import BotApi, Posted, Rows
from adapters.telegram_draft import Draft
from bot.core.buttons import ApprovalButton, CancelButton, pack
from bot.core.config import TelegramConfig
from bot.core.errors import StoreError
from bot.core.events import ApprovalRequested, Button, ConvKey, Phase, Progress, User, Verdict
from bot.serve.hub import Hub

log = logging.getLogger(__name__)
PLATFORM = "telegram"
MAX_TEXT = 4096
RECENT = 1000
"""Inbound messages remembered, for a 👀 on the one that is queued."""
VERDICTS = (("✅ Approve once", Verdict.APPROVE), ("❌ Deny", Verdict.DENY),
            ("💬 This conversation", Verdict.SESSION), ("♾️ Always in this chat", Verdict.ALWAYS))


def where_of(conv: ConvKey) -> tuple[int, int | None]:
    return int(conv.chat_id), int(conv.thread_id) if conv.thread_id else None


def cancel_keyboard(turn: int | None, session: int | None = None) -> Rows:
    return [[("⏹ Cancel", pack(CancelButton(turn, session)))]]


class TelegramChat:
    platform = PLATFORM
    failures: tuple[type[BaseException], ...] = (TelegramError, RetryLater)

    def __init__(self, api: BotApi, hub: Hub, config: TelegramConfig) -> None:
        self.api, self.hub, self.config = api, hub, config
        self.render: Callable[[str], str] = render.to_html
        self.names: dict[str, str] = {}
        """Names of the people served, as their approval cards show them."""
        self.recent: OrderedDict[str, tuple[int, int]] = OrderedDict()
        """Inbound refs of recent messages: (chat, message id), for the 👀 of a queued one."""
        self.no_drafts: set[int] = set()
        """Private chats where Telegram refused a draft."""

    def heard(self, ref: str, chat: int, message_id: int) -> None:
        """Inbound `ref` is this message (it may get a 👀 if it has to wait)."""
        self.recent[ref] = (chat, message_id)
        while len(self.recent) > RECENT:
            self.recent.popitem(last=False)

    # -- a turn's live surface ------------------------------------------------------------

    def new_live(self, conv: ConvKey, turn: int,
                 lost_cancel: Callable[[], None]) -> Draft | LiveMessage[Posted]:
        chat, thread = where_of(conv)
        if not (self.config.drafts and chat > 0 and chat not in self.no_drafts):
            return self._placeholder(conv, turn)  # drafts: a private chat (a positive id)

        async def send(text: str) -> Posted:
            sent = await self.api.send(chat, thread, self.render(text), text)
            return Posted(chat, thread, sent.message_id, turn)

        return Draft(self.api, chat, thread, turn, limit=MAX_TEXT, render=self.render,
                     send=send, fallback=lambda: self._placeholder(conv, turn),
                     refused=self.no_drafts.add)

    def adopt_live(self, conv: ConvKey, turn: int, where: Where) -> LiveMessage[Posted] | None:
        message_id = where.get("message_id")
        if not isinstance(message_id, int):
            return None
        live = self._placeholder(conv, turn)
        live.adopt(Posted(*where_of(conv), message_id, turn))
        return live

    def _placeholder(self, conv: ConvKey, turn: int) -> LiveMessage[Posted]:
        """The turn's edited placeholder; where it lands is kept in the store."""
        chat, thread = where_of(conv)
        kept = False
        session = self.hub.session_of(conv)

        async def post(text: str, on: bool) -> Posted:
            nonlocal kept
            posted = await self._live_post(chat, thread, text, on, turn, session)
            if on and not kept and posted.message_id is not None:
                kept = True
                try:
                    await self.hub.remember_live(conv, turn, {"message_id": posted.message_id})
                except StoreError:  # only a later process's convenience: the turn goes on
                    log.warning("Telegram: could not keep where turn %d's message is", turn,
                                exc_info=True)
            return posted

        return LiveMessage(post, self._live_edit, limit=MAX_TEXT,
                           min_interval=self.api.min_interval,
                           hold=lambda: self.api.next_at(chat))

    async def _live_post(self, chat: int, thread: int | None, text: str, live: bool,
                         turn: int | None, session: int | None = None) -> Posted:
        """A new message, with ⏹ Cancel (for its turn) while live."""
        try:
            message = await self.api.send(chat, thread, self.render(text), text,
                                          cancel_keyboard(turn, session) if live else None,
                                          wait=False)
        except (BadRequest, Forbidden):
            log.error("Telegram: could not post in chat %s", chat, exc_info=True)
            return Posted(chat, thread, None, turn, session)
        except TimedOut:  # it may have arrived: never post twice; the text follows later
            log.warning("Telegram: no reply to a post in chat %s within %g s", chat,
                        self.api.send_timeout)
            return Posted(chat, thread, None, turn, session)
        except NetworkError as exc:
            raise RetryLater(2.0) from exc
        return Posted(chat, thread, message.message_id, turn, session)

    async def _live_edit(self, ref: Posted, text: str, live: bool) -> None:
        """An edit of the placeholder; a message that vanished is posted again."""
        try:
            if ref.message_id is None or not await self.api.edit(
                    ref, self.render(text), text,
                    cancel_keyboard(ref.turn, ref.session) if live else None, final=not live):
                ref.message_id = (await self._live_post(ref.chat, ref.thread, text, live,
                                                        ref.turn, ref.session)).message_id
        except (BadRequest, Forbidden):
            log.error("Telegram: could not edit in chat %s", ref.chat, exc_info=True)
        except NetworkError as exc:
            if not live:
                raise RetryLater(2.0) from exc
            log.info("Telegram: a streaming edit failed: %s", exc)

    def status(self, event: Progress, running_for: float | None) -> str:
        if event.phase is Phase.TOOL and event.tool:
            seconds = render.duration(running_for) if running_for is not None else ""
            return f"⚙️ Running `{event.tool}`" + (f" · {seconds}" if seconds else "…")
        return THINKING

    async def typing(self, conv: ConvKey) -> None:
        await self.api.typing(*where_of(conv))

    # -- messages ---------------------------------------------------------------------

    async def post(self, conv: ConvKey, text: str,
                   buttons: Sequence[Button] = ()) -> list[Posted]:
        chat, thread = where_of(conv)
        parts = split_text(text or " ", MAX_TEXT)
        rows = [[(b.label, b.data) for b in buttons[i : i + 3]] for i in range(0, len(buttons), 3)]
        posted = []
        for i, part in enumerate(parts):
            sent = await self.api.send(chat, thread, self.render(part), part,
                                       rows if i == len(parts) - 1 else None)
            posted.append(Posted(chat, thread, sent.message_id))
        return posted

    async def post_line(self, conv: ConvKey, line: str) -> None:
        chat, thread = where_of(conv)
        await self.api.send(chat, thread, line, render.plain(line))

    async def delete(self, conv: ConvKey, ref: Posted) -> None:
        await self.api.delete(ref)

    async def tell(self, conv: ConvKey, user: User, text: str) -> bool:
        return False  # no private messages in a group: a press's answer says it instead

    async def react(self, conv: ConvKey, ref: str | None) -> bool:
        where = self.recent.get(ref or "")
        if where is None:
            return True  # not a message of this process's: nothing to mark
        try:
            await self.api.react(where[0], where[1], "👀")
        except (BadRequest, InvalidToken):  # reactions off here; a 404: not served at all
            return False
        return True

    # -- approval cards ---------------------------------------------------------------

    async def show_card(self, event: ApprovalRequested) -> Where:
        chat, thread = where_of(event.conv)
        requester = self.names.get(event.requester.id) or event.requester.name \
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
        ids = [(label, pack(ApprovalButton(event.approval_id, verdict)))
               for label, verdict in VERDICTS]
        message = await self.api.send(chat, thread, card, render.plain(card),
                                      [ids[:2], ids[2:]], reply_to)
        return {"chat": chat, "message_id": message.message_id, "html": card}

    def outcome_line(self, outcome: str, by: User | None) -> str:
        return render.outcome_line(outcome, (by.name or by.id) if by is not None else None)

    async def decide_card(self, approval_id: str, where: Where, line: str) -> bool:
        message_id: Any = where.get("message_id")
        if not isinstance(message_id, int):
            return False
        edited = Posted(int(where.get("chat") or 0), None, message_id)
        return await self.api.edit(edited, render.decided(str(where.get("html")), line),
                                   None, None, final=True)
