"""Telegram's updates read as the core sees them: pure functions, no calls.

Which conversation a message belongs to (a chat, or a forum topic of it), who sent it (the
numeric id decides access, never a name), whether a group message is addressed to Tandem,
and what buttons a message of Tandem's shows (Telegram's own copy: a forged press may name
any data on any message, but never changes the message).
"""

from __future__ import annotations

from telegram import MaybeInaccessibleMessage, Message
from telegram import User as TgUser
from telegram.constants import ChatType, MessageEntityType

from adapters import telegram_render as render
from bot.core.buttons import ApprovalButton, unpack
from bot.core.events import ConvKey, User

PLATFORM = "telegram"


def conv_of(message: Message | MaybeInaccessibleMessage) -> ConvKey:
    thread = None
    if message.chat.type != ChatType.PRIVATE and isinstance(message, Message) \
            and message.is_topic_message and message.message_thread_id:
        thread = str(message.message_thread_id)
    return ConvKey(PLATFORM, str(message.chat.id), thread)


def user_of(user: TgUser) -> User:
    """Telegram's numeric id as the core's string id (names never decide access)."""
    suffix = f" (@{user.username})" if isinstance(user.username, str) and user.username \
        else ""
    return User(str(user.id), str(user.first_name or user.id) + suffix)


def for_me(target: str | None, username: str) -> bool:
    """A command with no @bot, or with Tandem's."""
    return target is None or target.lower() == username.lower()


def addressed(message: Message, text: str, username: str, bot_id: int) -> bool:
    """In a group: a mention, a reply to Tandem, or a command not for another bot."""
    reply = message.reply_to_message
    if reply is not None and reply.from_user is not None \
            and reply.from_user.id == bot_id and reply.forum_topic_created is None:
        return True
    kinds: list[str | None] = [MessageEntityType.MENTION, MessageEntityType.TEXT_MENTION]
    found = message.parse_entities(kinds) if message.text is not None \
        else message.parse_caption_entities(kinds)
    for entity, value in found.items():
        if value.lower() == f"@{username.lower()}" or \
                (entity.user is not None and entity.user.id == bot_id):
            return True
    command = render.parse_command(text)
    return command is not None and for_me(command[2], username)


def buttons_of(message: MaybeInaccessibleMessage, bot_id: int) -> list[str]:
    """The button data of a message Tandem posted (none for anyone else's)."""
    if not isinstance(message, Message) or message.from_user is None \
            or message.from_user.id != bot_id or message.reply_markup is None:
        return []
    return [button.callback_data for row in message.reply_markup.inline_keyboard
            for button in row if isinstance(button.callback_data, str)]


def shows_only(message: MaybeInaccessibleMessage, bot_id: int, approval_id: str) -> bool:
    """The message is Tandem's card for this approval (it has only its buttons)."""
    buttons = [unpack(data) for data in buttons_of(message, bot_id)]
    return bool(buttons) and all(isinstance(b, ApprovalButton) and
                                 b.approval_id == approval_id for b in buttons)
