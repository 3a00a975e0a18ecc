"""Small answers on Telegram that need no chat state: a reply to a user's message, the
answer to a button press, and which message of Tandem's is an approval's card."""

from __future__ import annotations

import logging
from typing import Any

from telegram import CallbackQuery, MaybeInaccessibleMessage, Message
from telegram.error import TelegramError

from adapters.telegram_inbound import shows_only

log = logging.getLogger(__name__)


async def reply(message: Message, text: str) -> None:
    try:
        await message.reply_text(text, do_quote=False)
    except TelegramError:
        log.warning("Telegram: could not reply in chat %s", message.chat.id, exc_info=True)


async def answer(query: CallbackQuery, text: str | None, *, alert: bool) -> None:
    try:
        await query.answer(text[:200] if text else None, show_alert=alert)
    except TelegramError:
        log.warning("Telegram: could not answer a button press", exc_info=True)


def card_of(message: MaybeInaccessibleMessage, bot_id: int,
            approval_id: str) -> dict[str, Any] | None:
    """Where an approval's card is, from a press on it: after a restart a card is known only
    from a decision the hub took, and only a message showing this approval's buttons is
    its card."""
    if not isinstance(message, Message) or not message.text \
            or not shows_only(message, bot_id, approval_id):
        return None
    return {"chat": message.chat.id, "message_id": message.message_id,
            "html": message.text_html}
