"""Telegram's updates read as the core sees them: pure functions, no calls.

Which conversation a message belongs to (a chat, or a forum topic of it), who sent it (the
numeric id decides access, never a name), whether a group message is addressed to Tandem,
and what buttons a message of Tandem's shows (Telegram's own copy: a forged press may name
any data on any message, but never changes the message).
"""

from __future__ import annotations

from telegram import (
    MaybeInaccessibleMessage,
    Message,
    MessageOrigin,
    MessageOriginChannel,
    MessageOriginChat,
    MessageOriginHiddenUser,
    MessageOriginUser,
)
from telegram import User as TgUser
from telegram.constants import ChatType, MessageEntityType

from adapters import telegram_render as render
from bot.core.buttons import ApprovalButton, unpack
from bot.core.chat_config import Groups
from bot.core.events import (
    Aside,
    Attachment,
    Command,
    ConvKey,
    Edit,
    Inbound,
    Quote,
    User,
    UserMessage,
)

PLATFORM = "telegram"


def conv_of(message: Message | MaybeInaccessibleMessage, groups: Groups | None = None,
            sender: TgUser | None = None) -> ConvKey:
    """The chat or forum topic; with `groups.sessions: per_user`, the sender's own
    conversation there."""
    thread = None
    shared = message.chat.type != ChatType.PRIVATE
    if shared and isinstance(message, Message) \
            and message.is_topic_message and message.message_thread_id:
        thread = str(message.message_thread_id)
    per_user = groups is not None and groups.sessions == "per_user"
    member = str(sender.id) if per_user and shared and sender is not None else None
    return ConvKey(PLATFORM, str(message.chat.id), thread, member)


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


# -- what a message carries besides its words --------------------------------------------


def _text(message: Message) -> str:
    text = message.text if message.text is not None else message.caption
    return text if isinstance(text, str) else ""


def _origin(origin: MessageOrigin) -> Quote:
    """Where a forward or an external reply came from."""
    match origin:
        case MessageOriginUser(sender_user=sender) if not sender.is_bot:
            return Quote("", user_of(sender))
        case MessageOriginUser(sender_user=sender):
            return Quote("", None, origin=f"the bot {sender.first_name}")
        case MessageOriginHiddenUser(sender_user_name=name):
            return Quote("", None, origin=f"{name} (who hides their account)")
        case MessageOriginChat(sender_chat=chat) | MessageOriginChannel(chat=chat):
            return Quote("", None, origin=f"the chat {chat.title or chat.id}")
    return Quote("", None)


def quote_of(message: Message, bot_id: int) -> Quote | None:
    """The message this one replies to (or the part of it quoted), with its author: a
    message of Tandem's, a person (whose access the core decides), or another sender."""
    reply, external = message.reply_to_message, message.external_reply
    part = message.quote.text if message.quote is not None else None
    if reply is not None and reply.forum_topic_created is None:
        text = part or _text(reply) or "(a message without text)"
        sender = reply.from_user
        if reply.sender_chat is not None:
            return Quote(text, None, origin=f"the chat {reply.sender_chat.title or ''}".strip())
        if sender is not None and sender.id == bot_id:
            return Quote(text, None, by_tandem=True)
        if sender is None or sender.is_bot:
            name = sender.first_name if sender is not None else "an unknown sender"
            return Quote(text, None, origin=f"the bot {name}" if sender else name)
        return Quote(text, user_of(sender))
    if external is not None:
        found = _origin(external.origin)
        return Quote(part or "(a message in another chat)", found.author, origin=found.origin)
    return None


def forward_of(message: Message) -> Quote | None:
    return _origin(message.forward_origin) if message.forward_origin is not None else None


def item_of(message: Message, conv: ConvKey, user: User, text: str, ref: str,
            files: tuple[Attachment, ...], bot_id: int) -> Inbound:
    """A message for Tandem as the core's item: a command or a message."""
    command = render.parse_command(text)
    if command is not None:
        return Command(conv, user, command[0], command[1], ref=ref)
    forward = forward_of(message)
    if forward is not None:  # its words are the forwarded message's, not the sender's
        forward, text = Quote(text, forward.author, origin=forward.origin), ""
    return UserMessage(conv, user, text, ref=ref, attachments=files,
                       message_id=str(message.message_id), quote=quote_of(message, bot_id),
                       forwarded=forward, around=conv.place if conv.member else None)


def aside_of(message: Message, user: User, text: str, ref: str, bot_id: int) -> Aside:
    """Group talk not addressed to Tandem, kept as context (by the group or topic)."""
    forward = forward_of(message)
    if forward is not None:
        text = f"(forwarded from {forward.author.name if forward.author else forward.origin}) " \
               + text
    return Aside(conv_of(message), user, text or "(a file)", str(message.message_id),
                 quote_of(message, bot_id), ref)


def edit_of(message: Message | None, username: str, ref: str, groups: Groups) -> Edit | None:
    """An edited message as the core's `Edit` (None without a person or text)."""
    sender = message.from_user if message is not None else None
    if message is None or sender is None or sender.is_bot or not isinstance(sender.id, int):
        return None
    text = render.strip_mention(_text(message), username)
    return Edit(conv_of(message, groups, sender), user_of(sender), str(message.message_id),
                text, ref=ref)
