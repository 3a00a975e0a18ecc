"""The team's own conversation around Tandem: quotes, forwards, edits and group talk.

What the model reads of a message besides its words, each part with its author so that
the model never takes it for the sender's: the message it replies to (a quote of Tandem's
own answer, or of an allowed user, is theirs; anyone else's is outside content), where a
forward came from (always outside content), and what was said in the place since Tandem
last answered there (`groups.context`) together with edits and deletions of messages it
answered already. These wait in the store, bounded per place, until a turn reads them;
`/new` forgets them.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from bot.core.config import Config
from bot.core.events import Aside, ConvKey, Edit, Quote, User, UserMessage
from bot.core.history import outside
from bot.serve.access import Access
from bot.store import Store, TalkRow

log = logging.getLogger(__name__)

QUOTE_CHARS = 1_000
"""How much of a quoted or group message the model reads (the rest is cut, marked)."""
SAID_KEPT = 200
"""Messages addressed to Tandem remembered per place, for edits of them to find."""
NOTES_KEPT = 50
"""Edits and deletions waiting for the next turn, per place."""
TALK_HEADER = "[Said here since you last answered, not addressed to you]"


def cut(text: str, limit: int = QUOTE_CHARS) -> str:
    text = text.strip()
    if len(text) <= limit:
        return text
    return text[:limit].rstrip() + f" …[cut: {len(text):,} characters in all]"


def author(user: User | None) -> str:
    return (user.name or user.id) if user is not None else "someone"


class Talk:
    def __init__(self, config: Config, store: Store, access: Access) -> None:
        self.config = config
        self.store = store
        self.access = access

    def keep(self, platform: str) -> int:
        """How many unaddressed messages a group place keeps (0: none)."""
        section = getattr(self.config, platform, None)
        groups = getattr(section, "groups", None)
        return int(getattr(groups, "context", 0) or 0)

    def allowed(self, platform: str, user: User | None) -> bool:
        return user is not None and self.access.allows(platform, user)

    # -- kept as they arrive ------------------------------------------------------------

    async def said(self, message: UserMessage) -> None:
        """A message for Tandem: remembered, so that an edit of it is known."""
        if message.message_id is not None:
            await self.store.keep_talk(TalkRow(
                str(message.conv), message.message_id, "said", message.user.id,
                author(message.user), False, message.text), SAID_KEPT)

    async def aside(self, item: Aside) -> bool:
        """Group talk not addressed to Tandem: kept as context (never answered)."""
        keep = self.keep(item.conv.platform)
        if keep <= 0:
            return False
        text = item.text
        if item.quote is not None:
            quoted = cut(item.quote.text, 200)
            text = f"(replying to {author(item.quote.author)}: «{quoted}») {text}"
        await self.store.keep_talk(TalkRow(
            str(item.conv), item.message_id, "aside", item.user.id, author(item.user),
            not self.allowed(item.conv.platform, item.user), cut(text)), keep)
        return True

    async def edited(self, item: Edit) -> bool:
        """An edit that needs no turn: of group talk not read yet (its text is replaced), or
        of a message Tandem never saw (ignored). False when it must wait its turn on the
        conversation's lane (its message was, or is being, answered)."""
        place = str(item.conv)
        row = await self.store.talk_of(place, item.message_id)
        if row is None:
            log.info("an edit of message %s, which Tandem never saw, is ignored",
                     item.message_id)
            return True
        if row.kind == "aside":
            if item.deleted or not await self.store.edit_talk(place, item.message_id,
                                                              cut(item.text)):
                await self._note(item, row)
            return True
        return False

    async def after_turn(self, item: Edit) -> None:
        """An edit of a message that was answered, or is being answered: a note for the
        next turn (never a second answer)."""
        row = await self.store.talk_of(str(item.conv), item.message_id)
        if row is not None:
            await self._note(item, row)

    async def _note(self, item: Edit, row: TalkRow) -> None:
        who = row.author if item.user.id == row.author_id else author(item.user)
        await self.store.keep_talk(TalkRow(
            str(item.conv), item.message_id, "deleted" if item.deleted else "edit",
            item.user.id, who, row.outside, cut(item.text), before=row.text), NOTES_KEPT)
        if not item.deleted:
            await self.store.edit_talk(str(item.conv), item.message_id, item.text)

    async def forget(self, conv: ConvKey) -> None:
        await self.store.forget_talk([str(conv)])

    # -- what a turn reads --------------------------------------------------------------

    async def since_last(self, batch: Sequence[UserMessage]) -> str:
        """What was said around these messages since Tandem last answered there (read
        once: the next turn starts after it)."""
        places = dict.fromkeys(str(p) for m in batch for p in (m.conv, m.around) if p)
        rows = await self.store.take_talk(list(places))
        if not rows:
            return ""
        return "\n".join([TALK_HEADER, *(_line(row) for row in rows)]) + "\n\n"

    def words(self, message: UserMessage, text: str) -> str:
        """The message as the model reads it: its author, what it quotes or forwards."""
        who = author(message.user)
        platform = message.conv.platform
        if message.forwarded is not None:
            origin = _origin(message.forwarded, allowed=True)
            forwarded = message.forwarded.text
            lines = [outside(f"a message {who} forwarded from {origin}", forwarded)] \
                if forwarded else []
            said = f"[{who} forwarded the message above from {origin}]" if forwarded \
                else f"[{who} forwarded a message from {origin}]"
            return "\n".join([*lines, f"{said} {text}".rstrip()])
        quote = message.quote
        if quote is None:
            return f"[{who}] {text}"
        quoted = cut(quote.text)
        if quote.by_tandem:
            return f"[{who}, replying to your earlier message: «{quoted}»] {text}"
        if self.allowed(platform, quote.author):
            return f"[{who}, replying to {author(quote.author)}: «{quoted}»] {text}"
        label = f"the message {who} replies to, by {_origin(quote, allowed=False)}"
        return f"{outside(label, quoted)}\n[{who}, replying to the message above] {text}"


def _origin(quote: Quote, *, allowed: bool) -> str:
    """Who a quoted or forwarded message came from, in words."""
    if quote.by_tandem:
        return "you"
    if quote.author is not None:
        return author(quote.author) + ("" if allowed else ", who is not an allowed user")
    return quote.origin or "a sender the platform does not name"


def _line(row: TalkRow) -> str:
    """One kept row as the model reads it."""
    before = cut(row.before, 300)
    if row.kind == "edit":
        line = f"[{row.author} edited an earlier message; it now reads: «{row.text}» " \
               f"(it read: «{before}»)]"
    elif row.kind == "deleted":
        line = f"[{row.author} deleted an earlier message (it read: «{before}»)]"
    else:
        line = f"[{row.author}] {row.text}"
    if row.outside:
        return outside(f"a message by {row.author}, who is not an allowed user", line)
    return line
