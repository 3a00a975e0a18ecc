"""The fake Telegram server, exercised through the real python-telegram-bot."""

from __future__ import annotations

import asyncio
import io
import json
import socket
import time
import wave
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from PIL import Image
from telegram import (
    Bot,
    InlineKeyboardButton,
    InlineKeyboardMarkup,
    Message,
    ReactionTypeEmoji,
    Update,
)
from telegram.constants import ParseMode
from telegram.error import (
    BadRequest,
    Conflict,
    EndPointNotFound,
    InvalidToken,
    NetworkError,
    RetryAfter,
)
from telegram.ext import (
    Application,
    ApplicationBuilder,
    CallbackQueryHandler,
    CommandHandler,
    ContextTypes,
    MessageHandler,
    filters,
)

from tests.fakes import telegram_spec
from tests.fakes.telegram_server import (
    DRAFT_PLACEHOLDER,
    DRAFT_TTL,
    MAX_DOWNLOAD,
    MAX_PHOTO,
    MAX_REQUEST,
    MAX_UPLOAD,
    SECRET_HEADER,
    TOO_LARGE,
    ApiError,
    FakeTelegram,
    html_to_text,
    parse_text,
)

CHAT = 42
USER = 42
GROUP = -100555


@pytest.fixture
async def tg() -> AsyncIterator[FakeTelegram]:
    async with FakeTelegram() as fake:
        yield fake


def make_bot(fake: FakeTelegram, token: str | None = None) -> Bot:
    return Bot(
        token or fake.token,
        base_url=f"{fake.url}/bot",
        base_file_url=f"{fake.url}/file/bot",
    )


Seen = list[Update]


def build_app(fake: FakeTelegram, seen: Seen) -> Application[Any, Any, Any, Any, Any, Any]:
    async def echo(update: Update, context: ContextTypes.DEFAULT_TYPE) -> None:
        seen.append(update)
        assert update.message is not None
        await update.message.reply_text(f"echo: {update.message.text}")

    async def start(update: Update, context: ContextTypes.DEFAULT_TYPE) -> None:
        seen.append(update)
        assert update.message is not None
        await update.message.reply_text("started")

    async def pressed(update: Update, context: ContextTypes.DEFAULT_TYPE) -> None:
        seen.append(update)
        assert update.callback_query is not None
        await update.callback_query.answer(f"got {update.callback_query.data}")

    app = (
        ApplicationBuilder()
        .token(fake.token)
        .base_url(f"{fake.url}/bot")
        .base_file_url(f"{fake.url}/file/bot")
        .build()
    )
    app.add_handler(CommandHandler("start", start))
    app.add_handler(MessageHandler(filters.TEXT & ~filters.COMMAND, echo))
    app.add_handler(CallbackQueryHandler(pressed))
    return app


@asynccontextmanager
async def running(fake: FakeTelegram, seen: Seen) -> AsyncIterator[None]:
    app = build_app(fake, seen)
    async with app:
        assert app.updater is not None
        await app.updater.start_polling(timeout=1, poll_interval=0)
        await app.start()
        try:
            yield
        finally:
            await app.updater.stop()
            await app.stop()


def has(fake: FakeTelegram, chat_id: int, text: str) -> Callable[[], bool]:
    return lambda: text in fake.bot_texts(chat_id)


# --------------------------------------------------------------------------- with an Application


async def test_echo_roundtrip(tg: FakeTelegram) -> None:
    seen: Seen = []
    async with running(tg, seen):
        tg.push_message(CHAT, USER, "hello there")
        await tg.wait_for(has(tg, CHAT, "echo: hello there"))
    assert tg.bot_texts(CHAT) == ["echo: hello there"]
    assert [m.from_bot for m in tg.chat(CHAT)] == [False, True]
    assert [m.message_id for m in tg.chat(CHAT)] == [1, 2]
    assert tg.calls_to("getMe") and tg.calls_to("getMe")[0].ok
    assert tg.calls_to("deleteWebhook")
    send = tg.calls_to("sendMessage")[0]
    assert send.params["chat_id"] == CHAT  # decoded from the form string
    assert seen[0].effective_user is not None and seen[0].effective_user.first_name == "Ann"
    assert tg.pending_updates == []  # Updater.stop() confirmed it


async def test_confirmed_update_is_not_served_again(tg: FakeTelegram) -> None:
    seen: Seen = []
    async with running(tg, seen):
        first = tg.push_message(CHAT, USER, "one")
        await tg.wait_for(has(tg, CHAT, "echo: one"))
    assert first not in tg.pending_updates
    again: Seen = []
    async with running(tg, again):
        tg.push_message(CHAT, USER, "two")
        await tg.wait_for(has(tg, CHAT, "echo: two"))
    assert tg.bot_texts(CHAT) == ["echo: one", "echo: two"]
    assert [u.message.text for u in again if u.message] == ["two"]


async def test_unconfirmed_update_is_redelivered_after_crash(tg: FakeTelegram) -> None:
    update_id = tg.push_message(CHAT, USER, "survive me")
    async with make_bot(tg) as crashed:
        fetched = await crashed.get_updates(timeout=0)  # fetched, never confirmed
    assert [u.update_id for u in fetched] == [update_id]
    tg.redeliver_unconfirmed()
    seen: Seen = []
    async with running(tg, seen):
        await tg.wait_for(has(tg, CHAT, "echo: survive me"))
    assert [u.update_id for u in seen] == [update_id]
    assert tg.pending_updates == []


async def test_long_poll_waits_for_an_update(tg: FakeTelegram) -> None:
    async with make_bot(tg) as bot:
        started = time.monotonic()
        assert await bot.get_updates(timeout=0) == ()
        assert time.monotonic() - started < 0.5

        poll = asyncio.create_task(bot.get_updates(timeout=5))
        await tg.wait_for(lambda: len(tg.calls_to("getUpdates")) == 2)
        assert tg.calls_to("getUpdates")[1].status == 0  # the fake holds it, unanswered
        assert not poll.done()
        update_id = tg.push_message(CHAT, USER, "wake up")
        updates = await asyncio.wait_for(poll, 1)
        assert [u.update_id for u in updates] == [update_id]

        started = time.monotonic()
        again = await bot.get_updates(offset=update_id + 1, timeout=1)
        assert again == ()
        assert time.monotonic() - started >= 0.9
        assert tg.pending_updates == []


async def test_overlapping_get_updates_conflict(tg: FakeTelegram) -> None:
    async with make_bot(tg) as first, make_bot(tg) as second:
        older = asyncio.create_task(first.get_updates(timeout=5))
        await tg.wait_for(lambda: len(tg.calls_to("getUpdates")) == 1)
        newer = asyncio.create_task(second.get_updates(timeout=0))
        with pytest.raises(Conflict, match="terminated by other getUpdates request"):
            await older
        assert await newer == ()
    assert [c.status for c in tg.calls_to("getUpdates")] == [409, 200]


async def test_callback_query_answered_once(tg: FakeTelegram) -> None:
    seen: Seen = []
    tg.add_chat(CHAT)
    markup = InlineKeyboardMarkup([[InlineKeyboardButton("Approve", callback_data="ap:x1:a")]])
    async with running(tg, seen), make_bot(tg) as bot:
        sent = await bot.send_message(CHAT, "Run it?", reply_markup=markup)
        query_id = tg.push_callback(CHAT, USER, sent.message_id, "ap:x1:a")
        await tg.wait_for(lambda: query_id in tg.callback_answers)
        assert tg.callback_answers[query_id]["text"] == "got ap:x1:a"
        assert tg.callback_answers[query_id]["show_alert"] is False
        query = seen[0].callback_query
        assert query is not None and query.message is not None
        assert query.message.message_id == sent.message_id
        with pytest.raises(BadRequest, match="Query is too old"):
            await bot.answer_callback_query(query_id)
    with pytest.raises(ValueError, match="no button"):
        tg.push_callback(CHAT, USER, sent.message_id, "forged")


async def test_mention_and_command_entities_in_group(tg: FakeTelegram) -> None:
    seen: Seen = []
    async with running(tg, seen):
        tg.push_message(GROUP, USER, "@tandem_bot hi", chat_type="group", username="ann")
        tg.push_message(GROUP, USER, "/start@tandem_bot", chat_type="group")
        await tg.wait_for(lambda: tg.bot_texts(GROUP) == ["echo: @tandem_bot hi", "started"])
    mention = seen[0].message
    assert mention is not None and mention.chat.type == "group" and mention.chat.title
    assert mention.parse_entities(["mention"]) == {mention.entities[0]: "@tandem_bot"}
    command = seen[1].message
    assert command is not None
    assert [(e.type, e.offset, e.length) for e in command.entities] == [("bot_command", 0, 17)]


async def test_forum_thread_is_kept(tg: FakeTelegram) -> None:
    tg.me["can_read_all_group_messages"] = True  # privacy mode off: every message
    seen: Seen = []
    async with running(tg, seen):
        tg.push_message(GROUP, USER, "in a topic", chat_type="supergroup", thread_id=7)
        await tg.wait_for(has(tg, GROUP, "echo: in a topic"))
    incoming = seen[0].message
    assert incoming is not None and incoming.is_topic_message and incoming.message_thread_id == 7
    assert incoming.chat.is_forum
    assert tg.bot_texts(GROUP, thread_id=7) == ["echo: in a topic"]
    assert tg.bot_texts(GROUP, thread_id=8) == []
    assert tg.calls_to("sendMessage")[0].params["message_thread_id"] == 7


async def test_privacy_mode_shows_a_group_bot_only_what_is_addressed_to_it(
        tg: FakeTelegram) -> None:
    tg.add_chat(GROUP, "supergroup")
    async with make_bot(tg) as bot:
        answer = await bot.send_message(GROUP, "I am here")
        for text in ("just talk", "/help@other_bot", "/help", "hi @Tandem_Bot"):
            tg.push_message(GROUP, USER, text, chat_type="supergroup")
        tg.push_message(GROUP, USER, "thanks", chat_type="supergroup",
                        reply_to_message_id=answer.message_id)
        assert [m.text for m in await fetched(bot)] == ["/help", "hi @Tandem_Bot", "thanks"]
        tg.me["can_read_all_group_messages"] = True  # BotFather: /setprivacy → Disable
        tg.push_message(GROUP, USER, "more talk", chat_type="supergroup")
        assert [m.text for m in await fetched(bot)][-1] == "more talk"
        assert (await bot.get_me()).can_read_all_group_messages is True


async def test_edits_forwards_and_quotes_arrive_as_telegram_sends_them(
        tg: FakeTelegram) -> None:
    tg.push_message(CHAT, USER, "ship on Thursday")
    origin = {"type": "hidden_user", "date": 1_700_000_000, "sender_user_name": "Mallory"}
    tg.push_message(CHAT, USER, "forwarded words", forward_origin=origin)
    async with make_bot(tg) as bot:
        first, forward = await fetched(bot)
        tg.push_message(CHAT, USER, "which day?", reply_to_message_id=first.message_id,
                        quote="Thursday")
        tg.push_edit(CHAT, USER, first.message_id, "ship on Friday")
        updates = await bot.get_updates(timeout=0, allowed_updates=["message",
                                                                     "edited_message"])
    reply = updates[-2].message
    assert reply is not None
    assert forward.forward_origin is not None
    assert forward.forward_origin.type == "hidden_user"
    assert reply.reply_to_message is not None and reply.quote is not None
    assert (reply.quote.text, reply.quote.position) == ("Thursday", 8)
    edited = updates[-1].edited_message
    assert edited is not None and edited.text == "ship on Friday" and edited.edit_date
    assert edited.message_id == first.message_id
    with pytest.raises(ValueError, match="has no message"):
        tg.push_edit(CHAT, USER + 1, first.message_id, "not theirs")
    with pytest.raises(ValueError, match="quote"):
        tg.push_message(CHAT, USER, "x", reply_to_message_id=first.message_id, quote="Monday")


async def test_reply_to_a_stored_message(tg: FakeTelegram) -> None:
    seen: Seen = []
    tg.add_chat(CHAT)
    async with running(tg, seen), make_bot(tg) as bot:
        sent = await bot.send_message(CHAT, "<b>Question?</b>", parse_mode=ParseMode.HTML)
        tg.push_message(CHAT, USER, "answer", reply_to_message_id=sent.message_id)
        await tg.wait_for(has(tg, CHAT, "echo: answer"))
    incoming = seen[0].message
    assert incoming is not None and incoming.reply_to_message is not None
    assert incoming.reply_to_message.text == "Question?"
    assert incoming.reply_to_message.from_user is not None
    assert incoming.reply_to_message.from_user.is_bot


# --------------------------------------------------------------------------- limits, direct Bot


async def test_message_length_limits(tg: FakeTelegram) -> None:
    tg.add_chat(CHAT)
    async with make_bot(tg) as bot:
        await bot.send_message(CHAT, "x" * 4096)
        await bot.send_message(CHAT, "<b>" + "x" * 4096 + "</b>", parse_mode=ParseMode.HTML)
        await bot.send_message(CHAT, "&lt;" * 4096, parse_mode=ParseMode.HTML)
        with pytest.raises(BadRequest, match="Message is too long"):
            await bot.send_message(CHAT, "x" * 4097)
        with pytest.raises(BadRequest, match="Message is too long"):
            await bot.send_message(CHAT, "<i>" + "x" * 4097 + "</i>", parse_mode=ParseMode.HTML)
        with pytest.raises(BadRequest, match="Message text is empty"):
            await bot.send_message(CHAT, "   ")
        with pytest.raises(BadRequest, match="Message text is empty"):
            await bot.send_message(CHAT, "<b></b>", parse_mode=ParseMode.HTML)
        sent = await bot.send_message(CHAT, "short")
        with pytest.raises(BadRequest, match="Message is too long"):
            await bot.edit_message_text("y" * 4097, CHAT, sent.message_id)
    assert tg.bot_texts(CHAT)[2] == "<" * 4096
    assert tg.chat(CHAT)[1].raw_text.startswith("<b>")


@pytest.mark.parametrize(
    "bad",
    [
        "<foo>x</foo>",
        "1 < 2",
        "fish & chips",
        "<b>bold <i>both</b></i>",
        "<b>never closed",
        "closed</b>",
        '<span class="x">s</span>',
        "&bogus;",
    ],
)
async def test_bad_html_is_rejected(tg: FakeTelegram, bad: str) -> None:
    tg.add_chat(CHAT)
    async with make_bot(tg) as bot:
        with pytest.raises(BadRequest, match="Can't parse entities"):
            await bot.send_message(CHAT, bad, parse_mode=ParseMode.HTML)
    assert tg.bot_texts(CHAT) == []


@pytest.mark.parametrize(
    ("raw", "error"),
    [
        ("🏟 🏟&lt;<abacaba", "Unclosed start tag at byte offset 13"),
        ("🏟 🏟&lt;<abac>", 'Unsupported start tag "abac" at byte offset 13'),
        ("a < b", 'Unsupported start tag "" at byte offset 2'),
        ('<a ="x">y</a>', 'Empty attribute name in the tag "a" at byte offset 0'),
        ("<a href=x/>y</a>", "Unexpected end of name token at byte offset 8"),
        ("<b>x</i>", 'Unmatched end tag at byte offset 4, expected "</b>", found "</i>"'),
        ("<b>x", 'Can\'t find end tag corresponding to start tag "b"'),
        ("x</b>", "Unexpected end tag at byte offset 1"),
    ],
)
def test_html_error_descriptions(raw: str, error: str) -> None:
    with pytest.raises(ApiError) as caught:
        parse_text(raw, "HTML", None)
    assert caught.value.status == 400
    assert caught.value.description == f"Bad Request: can't parse entities: {error}"


async def test_html_visible_text_and_entities(tg: FakeTelegram) -> None:
    tg.add_chat(CHAT)
    raw = (
        '<b>a</b> &amp; <i>b</i> <a href="https://x.y/?q=1&amp;r=2">link</a> '
        '<pre><code class="language-py">x = 1</code></pre> <tg-spoiler>s</tg-spoiler>'
        " <blockquote expandable>q</blockquote> &#128512; &quot;"
    )
    async with make_bot(tg) as bot:
        sent = await bot.send_message(CHAT, raw, parse_mode=ParseMode.HTML)
    message = tg.chat(CHAT)[0]
    assert message.text == 'a & b link x = 1 s q \U0001f600 "'
    assert message.raw_text == raw
    kinds = {e["type"]: e for e in message.entities}
    assert set(kinds) == {
        "bold",
        "italic",
        "text_link",
        "pre",
        "spoiler",
        "expandable_blockquote",
    }
    assert kinds["text_link"]["url"] == "https://x.y/?q=1&r=2"
    assert kinds["pre"]["language"] == "py"
    assert sent.text == message.text
    assert sent.parse_entities(["text_link"]) == {sent.entities[2]: "link"}
    assert html_to_text("<b>x</b> &lt;y&gt;") == "x <y>"


async def test_markdown_v2_reserved_characters(tg: FakeTelegram) -> None:
    tg.add_chat(CHAT)
    async with make_bot(tg) as bot:
        with pytest.raises(BadRequest, match="reserved and must be escaped"):
            await bot.send_message(CHAT, "Done.", parse_mode=ParseMode.MARKDOWN_V2)
        with pytest.raises(BadRequest, match="can't find end of bold entity at byte offset 0"):
            await bot.send_message(CHAT, "*open", parse_mode=ParseMode.MARKDOWN_V2)
        await bot.send_message(
            CHAT, "*Done* \\. see [docs](https://x.y/a\\)b)", parse_mode=ParseMode.MARKDOWN_V2
        )
    message = tg.chat(CHAT)[0]
    assert message.text == "Done . see docs"
    assert [e["type"] for e in message.entities] == ["bold", "text_link"]
    assert message.entities[1]["url"] == "https://x.y/a)b"


async def test_edit_not_modified_and_missing(tg: FakeTelegram) -> None:
    tg.add_chat(CHAT)
    markup = InlineKeyboardMarkup([[InlineKeyboardButton("Stop", callback_data="cx")]])
    async with make_bot(tg) as bot:
        sent = await bot.send_message(CHAT, "working", reply_markup=markup)
        with pytest.raises(BadRequest, match="not modified"):
            await bot.edit_message_text("working", CHAT, sent.message_id, reply_markup=markup)
        # Leaving reply_markup out removes the keyboard, so this is a modification.
        edited = await bot.edit_message_text("working", CHAT, sent.message_id)
        assert isinstance(edited, object) and tg.chat(CHAT)[0].reply_markup is None
        with pytest.raises(BadRequest, match="not modified"):
            await bot.edit_message_reply_markup(CHAT, sent.message_id)
        with pytest.raises(BadRequest, match="Message to edit not found"):
            await bot.edit_message_text("x", CHAT, 999)
        with pytest.raises(BadRequest, match="Message to edit not found"):
            await bot.edit_message_reply_markup(CHAT, 999, reply_markup=markup)
        tg.push_message(CHAT, USER, "mine")
        with pytest.raises(BadRequest, match="Message can't be edited"):
            await bot.edit_message_text("x", CHAT, 2)
        with pytest.raises(BadRequest, match="Chat not found"):
            await bot.send_message(12345, "nobody here")
        assert await bot.delete_message(CHAT, sent.message_id)
        with pytest.raises(BadRequest, match="Message to delete not found"):
            await bot.delete_message(CHAT, sent.message_id)
    message = tg.message(CHAT, sent.message_id)
    assert message.deleted and message.edits == 1
    assert tg.bot_texts(CHAT) == []


@pytest.mark.refused_calls
async def test_callback_data_limits(tg: FakeTelegram) -> None:
    tg.add_chat(CHAT)
    async with make_bot(tg) as bot:
        ok = InlineKeyboardMarkup([[InlineKeyboardButton("ok", callback_data="x" * 64)]])
        await bot.send_message(CHAT, "fits", reply_markup=ok)
        too_long = InlineKeyboardMarkup([[InlineKeyboardButton("no", callback_data="x" * 65)]])
        with pytest.raises(BadRequest, match="(?i)button_data_invalid"):
            await bot.send_message(CHAT, "too long", reply_markup=too_long)
        # 22 three-byte characters: 22 characters but 66 bytes.
        wide = InlineKeyboardMarkup([[InlineKeyboardButton("no", callback_data="€" * 22)]])
        with pytest.raises(BadRequest, match="(?i)button_data_invalid"):
            await bot.send_message(CHAT, "too wide", reply_markup=wide)
        blank = InlineKeyboardMarkup([[InlineKeyboardButton(" ", callback_data="a")]])
        with pytest.raises(BadRequest):
            await bot.send_message(CHAT, "blank", reply_markup=blank)
    assert tg.bot_texts(CHAT) == ["fits"]


async def test_fast_edits_hit_flood_control() -> None:
    async with FakeTelegram(edit_interval=1.0, burst=2, retry_after=1) as tg:
        tg.add_chat(CHAT)
        async with make_bot(tg) as bot:
            sent = await bot.send_message(CHAT, "0")
            for i in range(1, 4):  # one first edit + two quick ones are tolerated
                await bot.edit_message_text(str(i), CHAT, sent.message_id)
            with pytest.raises(RetryAfter) as caught:
                await bot.edit_message_text("4", CHAT, sent.message_id)
            assert caught.value.retry_after == 1
            assert "Retry in 1" in str(caught.value)
            with pytest.raises(RetryAfter):  # the hold covers sends to the chat as well
                await bot.send_message(CHAT, "meanwhile")
            # a fixed wait: the fake's hold lasts retry_after (1 s) by the clock
            await asyncio.sleep(1.05)
            await bot.edit_message_text("5", CHAT, sent.message_id)
        assert tg.rate_limited == [(CHAT, "editMessageText"), (CHAT, "sendMessage")]
        assert tg.max_edit_rate(CHAT) == 4
        assert tg.max_edit_rate(7) == 0
        assert tg.chat(CHAT)[0].history == ["0", "1", "2", "3", "5"]
        error = tg.calls_to("editMessageText")[3]
        assert (error.status, error.description) == (429, "Too Many Requests: retry after 1")


async def test_send_interval_and_placement_errors() -> None:
    async with FakeTelegram(send_interval=1.0, burst=1) as tg:
        tg.add_chat(CHAT)
        tg.add_chat(GROUP, "group")
        async with make_bot(tg) as bot:
            await bot.send_message(CHAT, "a")
            await bot.send_message(CHAT, "b")
            with pytest.raises(RetryAfter):
                await bot.send_message(CHAT, "c")
            await bot.send_message(GROUP, "other chats are not held")
            with pytest.raises(BadRequest, match="Message thread not found"):
                await bot.send_message(GROUP, "x", message_thread_id=3)
            with pytest.raises(BadRequest, match="Message to be replied not found"):
                await bot.send_message(GROUP, "x", reply_to_message_id=99)
        assert tg.rate_limited == [(CHAT, "sendMessage")]
        assert tg.bot_texts(CHAT) == ["a", "b"]


async def test_flood_can_be_switched_off() -> None:
    async with FakeTelegram(flood=False) as tg:
        tg.add_chat(CHAT)
        async with make_bot(tg) as bot:
            sent = await bot.send_message(CHAT, "0")
            for i in range(1, 8):
                await bot.edit_message_text(str(i), CHAT, sent.message_id)
        assert tg.rate_limited == []
        assert tg.max_edit_rate(CHAT) == 7


# --------------------------------------------------------------------------- message drafts


async def test_message_draft_is_shown_updated_and_replaced(
    tg: FakeTelegram, monkeypatch: pytest.MonkeyPatch
) -> None:
    tg.add_chat(CHAT)
    async with make_bot(tg) as bot:
        assert await bot.send_message_draft(CHAT, 7, "Hel") is True
        assert tg.draft_of(CHAT) == "Hel"
        await bot.send_message_draft(CHAT, 7, "Hello <b>world</b>", parse_mode=ParseMode.HTML)
        assert tg.draft_of(CHAT) == "Hello world"
        await bot.send_message_draft(CHAT, 8)  # no text: the "Thinking…" placeholder
        assert tg.draft_of(CHAT) == DRAFT_PLACEHOLDER
        await bot.send_message_draft(CHAT, 8, "x" * 4096, message_thread_id=5)
        assert tg.draft_of(CHAT) == "x" * 4096
        await bot.send_message(CHAT, "Hello world")  # the real message replaces the draft
        assert tg.draft_of(CHAT) is None
        await bot.send_message_draft(CHAT, 9, "next")
    assert [(d.chat_id, d.draft_id, d.text) for d in tg.drafts_in(CHAT)][:3] == [
        (CHAT, 7, "Hel"),
        (CHAT, 7, "Hello world"),
        (CHAT, 8, DRAFT_PLACEHOLDER),
    ]
    assert tg.drafts[1].entities == ({"type": "bold", "offset": 6, "length": 5},)
    assert tg.drafts[2].placeholder and not tg.drafts[1].placeholder
    assert tg.drafts[3].thread_id == 5
    assert tg.calls_to("sendMessageDraft")[0].params["draft_id"] == 7  # decoded from the form
    assert tg.bot_texts(CHAT) == ["Hello world"]  # drafts are not messages
    assert tg.draft_of(CHAT) == "next" and tg.draft_of(12345) is None
    now = time.monotonic()
    with monkeypatch.context() as later:
        later.setattr(time, "monotonic", lambda: now + DRAFT_TTL)
        assert tg.draft_of(CHAT) is None  # 30 s without an update: gone


async def test_message_draft_refusals(tg: FakeTelegram) -> None:
    tg.add_chat(CHAT)
    tg.add_chat(GROUP, "supergroup", is_forum=True)
    async with make_bot(tg) as bot:
        with pytest.raises(BadRequest, match="(?i)textdraft_peer_invalid"):
            await bot.send_message_draft(GROUP, 1, "groups take no drafts")
        with pytest.raises(BadRequest, match="(?i)draft_id must be non-zero"):
            await bot.send_message_draft(CHAT, 0, "zero")
        with pytest.raises(BadRequest, match="(?i)text is too long"):
            await bot.send_message_draft(CHAT, 1, "x" * 4097)
        with pytest.raises(BadRequest, match="(?i)text is too long"):
            await bot.send_message_draft(CHAT, 1, "<i>" + "x" * 4097 + "</i>", parse_mode="HTML")
        with pytest.raises(BadRequest, match="Can't parse entities"):
            await bot.send_message_draft(CHAT, 1, "fish & chips", parse_mode=ParseMode.HTML)
        with pytest.raises(BadRequest, match="Chat not found"):
            await bot.send_message_draft(12345, 1, "nobody here")
        tg.refuse_drafts = True
        with pytest.raises(BadRequest, match="(?i)method is not available"):
            await bot.send_message_draft(CHAT, 1, "refused")
        tg.refuse_drafts = False
        assert await bot.send_message_draft(CHAT, 1, "fine again")
    assert [d.text for d in tg.drafts] == ["fine again"]
    refused = tg.calls_to("sendMessageDraft")[-2]
    assert (refused.status, refused.description) == (400, "Bad Request: method is not available")
    assert tg.calls_to("sendMessageDraft")[0].description == "Bad Request: TEXTDRAFT_PEER_INVALID"


async def quick_calls_in_one_chat(bot: Bot) -> None:
    """send, edit, draft, reaction, send: five calls to CHAT in quick succession."""
    sent = await bot.send_message(CHAT, "0")
    await bot.edit_message_text("1", CHAT, sent.message_id)
    await bot.send_message_draft(CHAT, 1, "drafting")
    await bot.set_message_reaction(CHAT, sent.message_id, ReactionTypeEmoji("👀"))
    await bot.send_message(CHAT, "5")


async def test_chat_interval_counts_every_call_to_a_chat() -> None:
    async with FakeTelegram(chat_interval=1.0, burst=3, retry_after=1) as tg:
        tg.add_chat(CHAT)
        tg.add_chat(USER + 1)
        async with make_bot(tg) as bot:
            with pytest.raises(RetryAfter) as caught:  # 1 first call + 3 quick ones pass
                await quick_calls_in_one_chat(bot)
            assert caught.value.retry_after == 1
            with pytest.raises(RetryAfter):  # the hold covers drafts and reactions too
                await bot.send_message_draft(CHAT, 1, "held")
            with pytest.raises(RetryAfter):
                await bot.set_message_reaction(CHAT, 1, ReactionTypeEmoji("👍"))
            assert await bot.send_chat_action(CHAT, "typing")  # not counted, not held
            await bot.send_message(USER + 1, "another chat has its own stream")
            # a fixed wait: the fake's hold lasts retry_after (1 s) by the clock
            await asyncio.sleep(1.05)
            await bot.send_message(CHAT, "after the hold")
        assert tg.rate_limited == [
            (CHAT, "sendMessage"),
            (CHAT, "sendMessageDraft"),
            (CHAT, "setMessageReaction"),
        ]
        assert tg.bot_texts(CHAT) == ["1", "after the hold"]
    async with FakeTelegram(burst=3) as tg:  # chat_interval off: the same calls all pass
        tg.add_chat(CHAT)
        async with make_bot(tg) as bot:
            await quick_calls_in_one_chat(bot)
        assert tg.rate_limited == []


async def test_chat_interval_spaced_calls_never_hit_flood_control() -> None:
    async with FakeTelegram(chat_interval=0.2, edit_interval=0.2, burst=0) as tg:
        tg.add_chat(CHAT)
        async with make_bot(tg) as bot:
            sent = await bot.send_message(CHAT, "0")
            for i in range(1, 6):
                await asyncio.sleep(0.25)  # a fixed wait: the pace is the point, by the clock
                if i % 3 == 1:
                    await bot.edit_message_text(str(i), CHAT, sent.message_id)
                elif i % 3 == 2:
                    await bot.send_message_draft(CHAT, 1, f"draft {i}")
                else:
                    await bot.send_message(CHAT, str(i))
            with pytest.raises(RetryAfter):  # burst 0: any quick call is one too many
                await bot.send_message_draft(CHAT, 1, "too soon")
        assert tg.rate_limited == [(CHAT, "sendMessageDraft")]


async def test_document_action_commands_reaction(tg: FakeTelegram) -> None:
    tg.add_chat(CHAT)
    async with make_bot(tg) as bot:
        sent = await bot.send_document(
            CHAT,
            document=b"col\n1\n",
            filename="report.csv",
            caption="<b>Report</b>",
            parse_mode=ParseMode.HTML,
        )
        assert sent.document is not None and sent.document.file_name == "report.csv"
        assert sent.caption == "Report"
        with pytest.raises(BadRequest, match="Message caption is too long"):
            await bot.send_document(CHAT, document=b"x", filename="a.txt", caption="c" * 1025)
        again = await bot.send_document(CHAT, document=sent.document.file_id)
        assert again.document is not None and again.document.file_id == sent.document.file_id
        file = await bot.get_file(sent.document.file_id)
        assert bytes(await file.download_as_bytearray()) == b"col\n1\n"

        assert await bot.send_chat_action(CHAT, "typing")
        with pytest.raises(BadRequest):
            await bot.send_chat_action(CHAT, "dancing")

        assert await bot.set_my_commands([("start", "Start"), ("help", "Help")])
        assert [c.command for c in await bot.get_my_commands()] == ["start", "help"]
        with pytest.raises(BadRequest, match="(?i)bot_command_invalid"):
            await bot.set_my_commands([("Bad-Name", "x")])

        assert await bot.set_message_reaction(CHAT, sent.message_id, ReactionTypeEmoji("👀"))
        with pytest.raises(BadRequest, match="(?i)reaction_invalid"):
            await bot.set_message_reaction(CHAT, sent.message_id, ReactionTypeEmoji("✅"))
    upload = tg.calls_to("sendDocument")[0].params["document"]
    assert upload.filename == "report.csv" and upload.data == b"col\n1\n"
    message = tg.chat(CHAT)[0]
    assert message.document is not None and message.document.data == b"col\n1\n"
    assert message.text == "Report" and message.raw_text == "<b>Report</b>"
    assert [(chat, action) for chat, action, _ in tg.chat_actions] == [(CHAT, "typing")]
    assert tg.commands == [
        {"command": "start", "description": "Start"},
        {"command": "help", "description": "Help"},
    ]
    assert tg.reactions == [(CHAT, sent.message_id, [{"type": "emoji", "emoji": "👀"}])]


async def test_token_method_and_wire_formats(tg: FakeTelegram) -> None:
    with pytest.raises(InvalidToken, match="rejected by the server"):
        async with make_bot(tg, token="123:WRONG"):
            pass  # initialize() calls getMe
    assert (tg.calls[0].status, tg.calls[0].description) == (401, "Unauthorized")
    async with make_bot(tg) as bot:
        with pytest.raises(EndPointNotFound):
            await bot.do_api_request("noSuchMethod")
    tg.add_chat(CHAT)
    async with aiohttp.ClientSession() as http:
        url = f"{tg.url}/bot{tg.token}/sendMessage"
        body = {"chat_id": CHAT, "text": "<b>json</b>", "parse_mode": "HTML"}
        async with http.post(url, json=body) as response:
            reply = await response.json()
        assert response.status == 200 and reply["result"]["text"] == "json"
        async with http.post(f"{tg.url}/bot{tg.token}/nope") as response:
            reply = await response.json()
        assert (response.status, reply) == (
            404,
            {"ok": False, "error_code": 404, "description": "Not Found"},
        )
        markup = json.dumps({"inline_keyboard": [[{"text": "a", "callback_data": "b"}]]})
        form = {"chat_id": str(CHAT), "text": "form", "reply_markup": markup}
        async with http.post(url, data=form) as response:
            reply = await response.json()
        assert reply["result"]["reply_markup"]["inline_keyboard"][0][0]["callback_data"] == "b"
    assert tg.calls_to("sendMessage")[1].params["reply_markup"] == json.loads(markup)
    assert tg.bot_texts(CHAT) == ["json", "form"]


async def test_wait_for_times_out_with_a_dump(tg: FakeTelegram) -> None:
    tg.push_message(CHAT, USER, "nobody answers")
    with pytest.raises(AssertionError, match="unconfirmed updates") as caught:
        await tg.wait_for(lambda: False, timeout=0.1)
    assert "nobody answers" in str(caught.value)


# --------------------------------------------------------------------------- media


def png(width: int, height: int, mode: str = "RGB") -> bytes:
    out = io.BytesIO()
    Image.new(mode, (width, height), 1 if mode == "1" else (30, 120, 200)).save(out, "PNG")
    return out.getvalue()


def wav(seconds: float = 0.25) -> bytes:
    out = io.BytesIO()
    with wave.open(out, "wb") as writer:
        writer.setnchannels(1)
        writer.setsampwidth(2)
        writer.setframerate(8000)
        writer.writeframes(bytes(int(8000 * seconds) * 2))
    return out.getvalue()


def tail(file_path: str | None) -> str:
    """The part of a file URL PTB built that the fake's getFile gave as ``file_path``."""
    assert file_path is not None
    return "/".join(file_path.split("/")[-2:])


async def fetched(bot: Bot) -> list[Message]:
    messages = [u.message for u in await bot.get_updates(timeout=0)]
    assert all(m is not None for m in messages)
    return [m for m in messages if m is not None]


async def test_inbound_photo_sizes_and_downloads(tg: FakeTelegram, tmp_path: Path) -> None:
    data = png(1000, 600)
    tg.push_photo(CHAT, USER, data, caption="see https://x.y")
    async with make_bot(tg) as bot:
        (message,) = await fetched(bot)
        sizes = [(p.width, p.height) for p in message.photo]
        assert sizes == [(90, 54), (320, 192), (800, 480), (1000, 600)]
        assert message.photo[-1].file_size == len(data) and message.text is None
        assert message.caption == "see https://x.y"
        assert [e.type for e in message.caption_entities] == ["url"]
        largest = await bot.get_file(message.photo[-1].file_id)
        assert tail(largest.file_path) == "photos/file_0.jpg" and largest.file_size == len(data)
        path = await largest.download_to_drive(tmp_path / "photo.png")
        assert path.read_bytes() == data
        thumb = await bot.get_file(message.photo[0].file_id)
        small = Image.open(io.BytesIO(bytes(await thumb.download_as_bytearray())))
        assert (small.format, small.size) == ("JPEG", (90, 54))
    assert tg.downloads(message.photo[-1].file_id) == 1
    assert tg.downloads(message.photo[1].file_id) == 0
    assert tg.chat(CHAT)[0].photo[-1].data is data  # kept, not copied
    with pytest.raises(ValueError, match="IMAGE_PROCESS_FAILED"):
        tg.push_photo(CHAT, USER, b"not an image")
    with pytest.raises(TypeError, match="thred_id"):
        tg.push_message(CHAT, USER, "typo", thred_id=3)  # type: ignore[call-arg]


async def test_inbound_voice_audio_video_note_document(tg: FakeTelegram) -> None:
    tg.me["can_read_all_group_messages"] = True  # privacy mode off: every message
    sound, clip, sheet = wav(), b"\x00\x00\x00\x18ftypmp42" + bytes(64), b"a,b\n1,2\n"
    tg.push_voice(CHAT, USER, sound, duration=1, caption="hear this")
    tg.push_audio(CHAT, USER, sound, duration=2)
    tg.push_video_note(CHAT, USER, clip, duration=4)
    tg.push_document(
        GROUP,
        USER,
        sheet,
        file_name="t.csv",
        mime_type="text/csv",
        thread_id=7,
        chat_type="supergroup",
    )
    async with make_bot(tg) as bot:
        voice, audio, note, document = await fetched(bot)
        assert voice.voice is not None and voice.caption == "hear this"
        assert (voice.voice.duration, voice.voice.mime_type) == (1, "audio/ogg")
        assert audio.audio is not None and audio.audio.duration == 2
        assert (audio.audio.file_name, audio.audio.mime_type) == ("song.mp3", "audio/mpeg")
        assert note.video_note is not None and note.caption is None
        assert (note.video_note.length, note.video_note.duration) == (240, 4)
        assert document.document is not None and document.document.file_name == "t.csv"
        assert document.is_topic_message and document.message_thread_id == 7
        expected = [
            (voice.voice, sound, "voice/file_0.oga"),
            (audio.audio, sound, "music/file_1.mp3"),
            (note.video_note, clip, "video_notes/file_2.mp4"),
            (document.document, sheet, "documents/file_3.csv"),
        ]
        for media, data, file_path in expected:
            assert media.file_size == len(data)
            file = await bot.get_file(media.file_id)
            assert tail(file.file_path) == file_path
            assert bytes(await file.download_as_bytearray()) == data
    assert [m.media.kind for m in tg.chat(CHAT) if m.media] == ["voice", "audio", "video_note"]
    assert tg.chat(GROUP)[0].document is not None


async def test_get_file_size_limit_and_streamed_download(tg: FakeTelegram, tmp_path: Path) -> None:
    fifteen = bytes(range(256)) * (15 * 4096)  # 15 MB, real bytes
    thirty = bytes(30 * 1024 * 1024)
    pdf, octets = "application/pdf", "application/octet-stream"
    tg.push_document(CHAT, USER, b"%PDF", file_name="a.pdf", mime_type=pdf, declared_size=21 << 20)
    tg.push_voice(CHAT, USER, b"OggS", declared_size=25 << 20)
    tg.push_document(CHAT, USER, b"%PDF", file_name="b.pdf", mime_type=pdf, declared_size=20 << 20)
    tg.push_document(CHAT, USER, thirty, file_name="30.bin", mime_type=octets)
    tg.push_document(CHAT, USER, fifteen, file_name="15.bin", mime_type=octets)
    async with make_bot(tg) as bot:
        big, voice, edge, huge, fine = await fetched(bot)
        assert big.document is not None and big.document.file_size == 21 << 20
        for media in (big.document, voice.voice, huge.document):
            assert media is not None
            with pytest.raises(BadRequest, match="^File is too big$"):
                await bot.get_file(media.file_id)
        assert edge.document is not None
        assert (await bot.get_file(edge.document.file_id)).file_size == MAX_DOWNLOAD
        with pytest.raises(BadRequest, match="^Invalid file_id$"):
            await bot.get_file("BQACAgIAAxkDAAI999999")
        assert fine.document is not None
        file = await bot.get_file(fine.document.file_id)
        assert (await file.download_to_drive(tmp_path / "15.bin")).read_bytes() == fifteen
    assert file.file_path is not None
    async with aiohttp.ClientSession() as http:
        async with http.get(file.file_path) as response:
            assert response.content_length == len(fifteen)
            chunks = [chunk async for chunk in response.content.iter_chunked(1 << 20)]
        assert len(chunks) > 1 and b"".join(chunks) == fifteen
        async with http.get(f"{tg.url}/file/bot{tg.token}/documents/file_99.bin") as response:
            assert response.status == 404
        async with http.get(file.file_path.replace(tg.token, "123:WRONG")) as response:
            assert response.status == 401
    assert tg.downloads(fine.document.file_id) == 2
    assert [call.status for call in tg.calls_to("getFile")] == [400, 400, 400, 200, 400, 200]
    assert tg.calls_to("getFile")[0].description == "Bad Request: file is too big"
    with pytest.raises(ValueError, match="declared_size"):
        tg.push_voice(CHAT, USER, b"OggS" * 4, declared_size=8)


async def test_send_photo(tg: FakeTelegram) -> None:
    tg.add_chat(CHAT)
    chart = png(800, 400)
    async with make_bot(tg) as bot:
        sent = await bot.send_photo(
            CHAT, chart, caption="<b>Chart</b>", parse_mode=ParseMode.HTML, filename="chart.png"
        )
        assert sent.caption == "Chart" and sent.caption_entities[0].type == "bold"
        assert [(p.width, p.height) for p in sent.photo] == [(90, 45), (320, 160), (800, 400)]
        assert sent.photo[-1].file_size == len(chart)
        again = await bot.send_photo(CHAT, sent.photo[0].file_id, reply_to_message_id=1)
        assert [p.file_id for p in again.photo] == [p.file_id for p in sent.photo]
        assert again.reply_to_message is not None and again.caption is None
        file = await bot.get_file(sent.photo[-1].file_id)
        assert tail(file.file_path) == "photos/file_0.jpg"
        assert bytes(await file.download_as_bytearray()) == chart
        with pytest.raises(BadRequest, match="(?i)^can't use file of type photo as document$"):
            await bot.send_document(CHAT, sent.photo[-1].file_id)
        await bot.send_document(CHAT, b"x" * 10, filename="notes.txt", caption="notes")
        with pytest.raises(BadRequest, match="There is no text in the message to edit"):
            await bot.edit_message_text("x", CHAT, sent.message_id)
    uploads = tg.uploads(CHAT)
    assert [(u.kind, u.file_name, u.caption) for u in uploads] == [
        ("photo", "chart.png", "Chart"),
        ("photo", "chart.png", ""),
        ("document", "notes.txt", "notes"),
    ]
    assert uploads[0].data == chart and uploads[2].data == b"x" * 10
    assert tg.chat(CHAT)[1].reply_to_message_id == 1
    assert "#1 bot: [photo] 'Chart'" in tg.dump()


async def test_send_photo_refusals(tg: FakeTelegram) -> None:
    tg.add_chat(CHAT)
    noise = io.BytesIO()
    Image.effect_noise((300, 300), 64).save(noise, "PNG")
    refused = [
        (png(2100, 100), "PHOTO_INVALID_DIMENSIONS"),  # ratio 21
        (png(9000, 1001, "1"), "PHOTO_INVALID_DIMENSIONS"),  # width + height 10001
        (b"definitely not an image", "IMAGE_PROCESS_FAILED"),
        (noise.getvalue()[:400], "IMAGE_PROCESS_FAILED"),  # a header, then cut off
        (
            bytes(MAX_PHOTO + 1),
            f"file of size {MAX_PHOTO + 1} bytes is too big for a photo; "
            f"the maximum size is {MAX_PHOTO} bytes",
        ),
    ]
    async with make_bot(tg) as bot:
        for data, error in refused:
            with pytest.raises(BadRequest) as caught:
                await bot.send_photo(CHAT, data)
            assert caught.value.message == error.capitalize()
        await bot.send_photo(CHAT, png(2000, 100))  # ratio 20 is allowed
        await bot.send_photo(CHAT, png(9000, 1000, "1"))  # so is 10000 in total
        with pytest.raises(BadRequest, match="^File must be non-empty$"):
            await bot.send_photo(CHAT, b"")
    descriptions = [call.description for call in tg.calls_to("sendPhoto")]
    assert descriptions == [f"Bad Request: {e}" for _, e in refused] + [
        None,
        None,
        "Bad Request: file must be non-empty",
    ]
    assert [u.data for u in tg.uploads(CHAT)] == [png(2000, 100), png(9000, 1000, "1")]


async def test_send_document_size_limits(tg: FakeTelegram) -> None:
    tg.add_chat(CHAT)
    async with make_bot(tg) as bot:
        sent = await bot.send_document(CHAT, bytes(MAX_UPLOAD), filename="edge.bin")
        assert sent.document is not None and sent.document.file_size == MAX_UPLOAD
        for size in (MAX_UPLOAD + 1, MAX_REQUEST + 1):  # the second is refused mid-body
            with pytest.raises(NetworkError) as caught:
                await bot.send_document(CHAT, bytes(size), filename="big.bin")
            assert type(caught.value) is NetworkError and caught.value.message == TOO_LARGE
    calls = tg.calls_to("sendDocument")
    assert [(c.status, c.description) for c in calls] == [(200, None)] + [(413, TOO_LARGE)] * 2
    assert [u.file_name for u in tg.uploads(CHAT)] == ["edge.bin"]


# --------------------------------------------------------------------------- webhooks


class Receiver:
    """A bot's webhook endpoint: records each POST and answers the next status given
    (then 200)."""

    def __init__(self, *statuses: int) -> None:
        self.statuses = list(statuses)
        self.got: list[tuple[dict[str, str], Any]] = []
        self.url = ""
        self._runner: web.AppRunner | None = None

    async def __aenter__(self) -> Receiver:
        app = web.Application()
        app.router.add_post("/hook", self._post)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        self.url = f"http://127.0.0.1:{self._runner.addresses[0][1]}/hook"
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._runner is not None
        await self._runner.cleanup()

    async def _post(self, request: web.Request) -> web.Response:
        self.got.append((dict(request.headers), json.loads(await request.read())))
        return web.Response(status=self.statuses.pop(0) if self.statuses else 200)

    @property
    def ids(self) -> list[int]:
        return [body["update_id"] for _, body in self.got]


def closed_url() -> str:
    """An address nothing listens on (connection refused)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{sock.getsockname()[1]}/hook"


@pytest.mark.refused_calls
async def test_set_get_delete_webhook(tg: FakeTelegram) -> None:
    tg.webhook_targets = []  # hold deliveries: the URL is not reachable
    async with make_bot(tg) as bot:
        info = await bot.get_webhook_info()
        assert (info.url, info.pending_update_count) == ("", 0)
        tg.push_message(CHAT, USER, "waiting")
        assert await bot.set_webhook(
            "https://bot.example/tg", secret_token="s3cret_-X", allowed_updates=["message"]
        )
        assert tg.webhook == {
            "url": "https://bot.example/tg",
            "secret_token": "s3cret_-X",
            "allowed_updates": ["message"],
            "max_connections": 40,
        }
        info = await bot.get_webhook_info()
        assert info.url == "https://bot.example/tg" and info.pending_update_count == 1
        assert info.allowed_updates == ("message",) and info.max_connections == 40
        assert info.last_error_date is None and info.last_error_message is None
        refusals = {
            "http://bot.example/tg": "(?i)an https url must be provided",
            "https://bot.example:8080/tg": "only on ports 80, 88, 443 or 8443",
        }
        for url, error in refusals.items():
            with pytest.raises(BadRequest, match=error):
                await bot.set_webhook(url)
        for secret in ("has:colon", "x" * 257):
            with pytest.raises(BadRequest, match="(?i)secret token contains unallowed"):
                await bot.set_webhook("https://bot.example/tg", secret_token=secret)
        assert await bot.set_webhook("https://bot.example:8443/tg", secret_token="x" * 256)
        assert await bot.delete_webhook()
        assert tg.webhook is None
        info = await bot.get_webhook_info()
        assert (info.url, info.pending_update_count) == ("", 1)
        assert await bot.set_webhook("http://127.0.0.1:1/tg", drop_pending_updates=True)
        assert tg.pending_updates == []
        assert await bot.set_webhook("")  # an empty URL removes the webhook
        assert tg.webhook is None
    assert tg.deliveries == []


async def test_get_updates_conflicts_with_a_webhook(tg: FakeTelegram) -> None:
    tg.webhook_targets = []
    async with make_bot(tg) as bot, make_bot(tg) as poller:
        waiting = asyncio.create_task(poller.get_updates(timeout=5))
        await tg.wait_for(lambda: len(tg.calls_to("getUpdates")) == 1)
        await bot.set_webhook("https://bot.example/tg")
        with pytest.raises(Conflict, match="can't use getUpdates method while webhook is active"):
            await waiting
        update_id = tg.push_message(CHAT, USER, "held")
        with pytest.raises(Conflict, match="use deleteWebhook to delete the webhook first"):
            await bot.get_updates(timeout=0)
        await bot.delete_webhook()
        assert [u.update_id for u in await bot.get_updates(timeout=0)] == [update_id]
    assert [c.status for c in tg.calls_to("getUpdates")] == [409, 409, 200]


async def test_webhook_delivery_in_order_with_the_secret(tg: FakeTelegram) -> None:
    async with Receiver() as hook, make_bot(tg) as bot:
        sent = await bot.send_message(tg.add_chat(CHAT)["id"], "pick one")
        first = tg.push_message(CHAT, USER, "one")
        tg.push_callback(CHAT, USER, sent.message_id, "x", forged=True)  # not allowed below
        third = tg.push_message(CHAT, USER, "three")
        await bot.set_webhook(hook.url, secret_token="topsecret", allowed_updates=["message"])
        await tg.wait_for(lambda: hook.ids == [first, third] and not tg.pending_updates)
        await bot.delete_webhook()
    headers, body = hook.got[0]
    assert headers["X-Telegram-Bot-Api-Secret-Token"] == "topsecret"
    assert headers["Content-Type"] == "application/json"
    update = Update.de_json(body, bot)
    assert update.message is not None and update.message.text == "one"
    assert [(d.update_id, d.status, d.ok) for d in tg.deliveries] == [
        (first, 200, True),
        (third, 200, True),
    ]


async def test_webhook_retries_a_failed_delivery_with_backoff(tg: FakeTelegram) -> None:
    async with Receiver(500, 502) as hook, make_bot(tg) as bot:
        await bot.set_webhook(hook.url)
        first = tg.push_message(CHAT, USER, "one")
        second = tg.push_message(CHAT, USER, "two")
        await tg.wait_for(lambda: not tg.pending_updates)
        info = await bot.get_webhook_info()
    assert hook.ids == [first, first, first, second]  # the second waits for the first
    assert "X-Telegram-Bot-Api-Secret-Token" not in hook.got[0][0]  # none was set
    assert [d.error for d in tg.deliveries[:2]] == [
        "Wrong response from the webhook: 500 Internal Server Error",
        "Wrong response from the webhook: 502 Bad Gateway",
    ]
    times = [d.time for d in tg.deliveries]
    assert times[1] - times[0] >= 0.19 and times[2] - times[1] >= 0.39  # 0.2 s, doubling
    assert info.pending_update_count == 0
    assert info.last_error_message == "Wrong response from the webhook: 502 Bad Gateway"
    assert info.last_error_date is not None


async def test_webhook_connection_refused_and_lost_answers(tg: FakeTelegram) -> None:
    dead = closed_url()
    async with Receiver() as hook, make_bot(tg) as bot:
        await bot.set_webhook(dead)
        update_id = tg.push_message(CHAT, USER, "hello?")
        await tg.wait_for(lambda: len(tg.deliveries) >= 2)
        info = await bot.get_webhook_info()
        assert info.last_error_message == "Connection refused"
        assert info.pending_update_count == 1
        tg.lose_webhook_answers(1)
        await bot.set_webhook(hook.url)  # a new URL: the old error is forgotten
        await tg.wait_for(lambda: not tg.pending_updates)
        info = await bot.get_webhook_info()
    assert {d.error for d in tg.deliveries if d.url == dead} == {"Connection refused"}
    assert hook.ids == [update_id, update_id]  # it arrived, then came again
    assert [d.error for d in tg.deliveries if d.url == hook.url] == ["Read timeout expired", None]
    assert info.last_error_message == "Read timeout expired"


async def test_webhook_targets_round_robin(tg: FakeTelegram) -> None:
    async with Receiver() as a, Receiver(500) as b, make_bot(tg) as bot:
        tg.webhook_targets = [a.url, b.url]
        await bot.set_webhook("https://bot.example/tg", secret_token="lb")
        ids = [tg.push_message(CHAT, USER, str(n)) for n in range(3)]
        await tg.wait_for(lambda: not tg.pending_updates)
        # a gets ids[0]; b fails ids[1]; a gets its retry; b gets ids[2]
        assert (a.ids, b.ids) == ([ids[0], ids[1]], [ids[1], ids[2]])
        dead = closed_url()
        tg.webhook_targets = [dead, a.url]
        last = tg.push_message(CHAT, USER, "again")
        await tg.wait_for(lambda: not tg.pending_updates)
        assert a.ids[-1] == last
        assert (await bot.get_webhook_info()).url == "https://bot.example/tg"
    assert all(headers[SECRET_HEADER] == "lb" for headers, _ in a.got + b.got)
    assert [(d.update_id, d.url, d.ok) for d in tg.deliveries] == [
        (ids[0], a.url, True),
        (ids[1], b.url, False),
        (ids[1], a.url, True),
        (ids[2], b.url, True),
        (last, dead, False),  # the turn goes on: the dead target, then a
        (last, a.url, True),
    ]


async def test_deliveries_stop_on_delete_and_close() -> None:
    async with Receiver(*[500] * 100) as hook:
        fake = FakeTelegram()
        await fake.start()
        async with make_bot(fake) as bot:
            await bot.set_webhook(hook.url)
            fake.push_message(CHAT, USER, "never")
            await fake.wait_for(lambda: len(hook.got) >= 2)
            await bot.delete_webhook()
            assert not fake.delivering  # stopped before deleteWebhook answered
            count = len(hook.got)
            fake.push_message(CHAT, USER, "polled instead")
            assert len(hook.got) == count and len(fake.pending_updates) == 2
            await bot.set_webhook(hook.url)
            await fake.wait_for(lambda: len(hook.got) > count)
        await fake.close()
        assert not fake.delivering  # stopped before close returned
        count = len(hook.got)
        assert len(hook.got) == count


# --------------------------------------------------------------------------- the Bot API spec


async def call_raw(
    fake: FakeTelegram, method: str, *, form: bool = False, **params: Any
) -> tuple[int, str]:
    """One call as JSON (or form-encoded, every value a string); (status, description)."""
    url = f"{fake.url}/bot{fake.token}/{method}"
    async with aiohttp.ClientSession() as http:
        if form:
            data = {k: v if isinstance(v, str) else json.dumps(v) for k, v in params.items()}
            response = await http.post(url, data=data)
        else:
            response = await http.post(url, json=params)
        async with response:
            reply = await response.json()
    assert reply["ok"] is (response.status == 200)
    return response.status, str(reply.get("description", ""))


def button(**fields: Any) -> dict[str, Any]:
    return {"inline_keyboard": [[{"text": "press", **fields}]]}


async def test_the_vendored_spec_is_bot_api_10_1_with_its_licence() -> None:
    data = telegram_spec.spec()
    assert data["version"] == "Bot API 10.1"
    licence = (telegram_spec.SPEC_FILE.parent / "LICENSE.telegram-bot-api").read_text()
    assert licence.startswith("MIT License")
    assert telegram_spec.visible_range("sendMessage", "text") == (1, 4096)
    assert telegram_spec.visible_range("sendPhoto", "caption") == (0, 1024)
    assert telegram_spec.fields_of("InlineKeyboardButton")["callback_data"]["range"] == [
        1, 64, "bytes"
    ]


@pytest.mark.refused_calls
async def test_spec_refuses_unknown_methods_and_parameters(tg: FakeTelegram) -> None:
    tg.add_chat(CHAT)
    assert await call_raw(tg, "sendMesage", chat_id=CHAT, text="hi") == (404, "Not Found")
    assert await call_raw(tg, "sendmessage", chat_id=CHAT, text="hi") == (200, "")
    status, text = await call_raw(tg, "sendMessage", chat_id=CHAT, text="hi", reply_to=3)
    assert (status, text) == (
        400, 'Bad Request: unknown parameter "reply_to" for method sendMessage'
    )
    # a parameter Bot API 7.0 replaced by reply_parameters is unknown to 10.1
    status, text = await call_raw(tg, "sendMessage", chat_id=CHAT, text="hi",
                                  reply_to_message_id=1)
    assert status == 400 and "reply_to_message_id" in text
    status, text = await call_raw(tg, "sendMessage", chat_id=CHAT, text="hi",
                                  reply_markup=button(callback_data="a", colour="red"))
    assert (status, text) == (
        400, 'Bad Request: can\'t parse inline keyboard button: unknown field "colour"'
    )
    assert tg.bot_texts(CHAT) == ["hi"]


@pytest.mark.refused_calls
async def test_spec_refuses_missing_required_parameters(tg: FakeTelegram) -> None:
    tg.add_chat(CHAT)
    assert await call_raw(tg, "sendMessage", text="hi") == (400, "Bad Request: chat_id is empty")
    assert await call_raw(tg, "sendMessage", chat_id=CHAT) == (
        400, "Bad Request: message text is empty"
    )
    assert await call_raw(tg, "sendChatAction", chat_id=CHAT) == (
        400, "Bad Request: action is empty"
    )
    assert await call_raw(tg, "answerCallbackQuery") == (400, "Bad Request: QUERY_ID_INVALID")
    status, text = await call_raw(tg, "sendMessage", chat_id=CHAT, text="hi",
                                  reply_parameters={"quote": "hi"})
    assert (status, text) == (
        400,
        'Bad Request: can\'t parse reply_parameters: Field "message_id" must be of type Integer',
    )
    assert tg.bot_texts(CHAT) == []


@pytest.mark.refused_calls
async def test_spec_refuses_wrong_types(tg: FakeTelegram) -> None:
    tg.add_chat(CHAT)
    [sent] = [await call_raw(tg, "sendMessage", chat_id=CHAT, text="x")]
    assert sent == (200, "")
    refused = [
        ("deleteMessage", {"chat_id": CHAT, "message_id": "first"}, "message_id", "Integer"),
        ("sendMessage", {"chat_id": CHAT, "text": 5}, "text", "String"),
        ("sendMessage", {"chat_id": [CHAT], "text": "x"}, "chat_id", "Integer or String"),
        ("sendMessage", {"chat_id": CHAT, "text": "x", "disable_notification": "maybe"},
         "disable_notification", "Boolean"),
        ("sendMessage", {"chat_id": CHAT, "text": "x",
                         "entities": [{"type": "bold", "offset": "0", "length": 1}]},
         "offset", "Integer"),
        ("sendMessage", {"chat_id": CHAT, "text": "x", "entities": {"type": "bold"}},
         "entities", "Array of MessageEntity"),
        ("sendMessage", {"chat_id": CHAT, "text": "x",
                         "reply_markup": {"inline_keyboard": [[{"text": 7, "url": "https://a.b"}]]}},
         "text", "String"),
        ("sendMessage", {"chat_id": CHAT, "text": "x", "reply_markup": {"buttons": []}},
         "reply_markup",
         "InlineKeyboardMarkup or ReplyKeyboardMarkup or ReplyKeyboardRemove or ForceReply"),
    ]
    for method, params, field, kind in refused:
        for form in (False, True) if "String" not in kind else (False,):
            status, text = await call_raw(tg, method, form=form, **params)
            assert status == 400 and text.endswith(f'Field "{field}" must be of type {kind}'), (
                method, params, form, text
            )
    # the same values in the right types pass, form-encoded as PTB sends them
    ok = {"chat_id": str(CHAT), "text": "y", "disable_notification": "true",
          "entities": [{"type": "bold", "offset": 0, "length": 1}]}
    assert await call_raw(tg, "sendMessage", form=True, **ok) == (200, "")
    assert tg.calls_to("sendMessage")[-1].params["disable_notification"] is True
    assert tg.bot_texts(CHAT) == ["x", "y"]


@pytest.mark.refused_calls
async def test_spec_refuses_text_and_caption_lengths_after_entity_parsing(
    tg: FakeTelegram,
) -> None:
    tg.add_chat(CHAT)
    markup = "<b>" + "a" * 4096 + "</b>"  # 4,103 characters sent, 4,096 shown
    assert await call_raw(tg, "sendMessage", chat_id=CHAT, text=markup, parse_mode="HTML") == (
        200, ""
    )
    assert await call_raw(tg, "sendMessage", chat_id=CHAT, text="a" * 4097) == (
        400, "Bad Request: message is too long"
    )
    assert await call_raw(tg, "sendMessage", chat_id=CHAT, text="<b> </b>", parse_mode="HTML") == (
        400, "Bad Request: message text is empty"
    )
    [message] = tg.chat(CHAT)
    edit = {"chat_id": CHAT, "message_id": message.message_id}
    assert await call_raw(tg, "editMessageText", **edit, text="b" * 4097) == (
        400, "Bad Request: message is too long"
    )
    assert await call_raw(tg, "sendMessageDraft", chat_id=CHAT, draft_id=1, text="c" * 4097) == (
        400, "Bad Request: text is too long"
    )
    async with make_bot(tg) as bot:
        with pytest.raises(BadRequest, match="(?i)message caption is too long"):
            await bot.send_document(CHAT, b"data", filename="a.txt", caption="d" * 1025)
        await bot.send_document(CHAT, b"data", filename="a.txt",
                                caption="<i>" + "d" * 1024 + "</i>", parse_mode=ParseMode.HTML)
    assert len(tg.uploads(CHAT)) == 1


@pytest.mark.refused_calls
async def test_spec_refuses_string_value_and_array_ranges(tg: FakeTelegram) -> None:
    tg.add_chat(CHAT)
    ok = await call_raw(tg, "sendMessage", chat_id=CHAT, text="x",
                        reply_markup=button(callback_data="é" * 32))  # 64 bytes
    assert ok == (200, "")
    refused = [
        ("sendMessage", {"chat_id": CHAT, "text": "x",
                         "reply_markup": button(callback_data="€" * 22)}),  # 22 chars, 66 bytes
        ("sendMessage", {"chat_id": CHAT, "text": "x", "reply_markup": button(callback_data="")}),
    ]
    for method, params in refused:
        assert await call_raw(tg, method, **params) == (400, "Bad Request: BUTTON_DATA_INVALID")
    long_command = [{"command": "a" * 33, "description": "d"}]
    assert await call_raw(tg, "setMyCommands", commands=long_command) == (
        400, "Bad Request: BOT_COMMAND_INVALID"
    )
    long_description = [{"command": "a", "description": "d" * 257}]
    assert await call_raw(tg, "setMyCommands", commands=long_description) == (
        400, "Bad Request: BOT_COMMAND_DESCRIPTION_INVALID"
    )
    assert await call_raw(tg, "getUpdates", limit=101) == (
        400, "Bad Request: limit must be 1-100"
    )
    assert await call_raw(tg, "getUpdates", limit=0, timeout=0) == (
        400, "Bad Request: limit must be 1-100"
    )
    status, text = await call_raw(tg, "setWebhook", url="https://example.org/hook",
                                  secret_token="s" * 257)
    assert (status, text) == (400, "Bad Request: secret token contains unallowed characters")
    copy = button(copy_text={"text": "t" * 257})
    assert await call_raw(tg, "sendMessage", chat_id=CHAT, text="x", reply_markup=copy) == (
        400, "Bad Request: COPY_TEXT_INVALID"
    )
    placeholder = {"force_reply": True, "input_field_placeholder": "p" * 65}
    status, text = await call_raw(tg, "sendMessage", chat_id=CHAT, text="x",
                                  reply_markup=placeholder)
    assert (status, text) == (400, "Bad Request: input_field_placeholder must have chars in 1-64")
    assert tg.bot_texts(CHAT) == ["x"]


@pytest.mark.refused_calls
async def test_spec_refuses_answer_text_over_200_characters(tg: FakeTelegram) -> None:
    tg.add_chat(CHAT)
    async with make_bot(tg) as bot:
        sent = await bot.send_message(CHAT, "pick", reply_markup=InlineKeyboardMarkup(
            [[InlineKeyboardButton("a", callback_data="a")]]))
        query = tg.push_callback(CHAT, USER, sent.message_id, "a")
        with pytest.raises(BadRequest, match="(?i)MESSAGE_TOO_LONG"):
            await bot.answer_callback_query(query, text="t" * 201)
        assert await bot.answer_callback_query(query, text="t" * 200)
    assert tg.callback_answers[query]["text"] == "t" * 200


@pytest.mark.refused_calls
async def test_spec_refuses_button_shapes(tg: FakeTelegram) -> None:
    tg.add_chat(CHAT)
    text_only = (
        "Bad Request: can't parse inline keyboard button: "
        "Text buttons are unallowed in the inline keyboard"
    )
    no_action, two_actions = button(), button(callback_data="a", url="https://example.org")
    for markup in (no_action, two_actions):
        assert await call_raw(tg, "sendMessage", chat_id=CHAT, text="x", reply_markup=markup) == (
            400, text_only
        )
    styled = button(callback_data="a", style="danger", icon_custom_emoji_id="5")  # no actions
    assert await call_raw(tg, "sendMessage", chat_id=CHAT, text="x", reply_markup=styled) == (
        200, ""
    )
    keyboard = {"keyboard": [["plain", {"text": "both", "request_contact": True,
                                        "request_location": True}]]}
    status, text = await call_raw(tg, "sendMessage", chat_id=CHAT, text="x", reply_markup=keyboard)
    assert (status, text) == (
        400, "Bad Request: can't parse keyboard button: exactly one button action may be used"
    )
    keyboard["keyboard"][0][1].pop("request_location")
    assert await call_raw(tg, "sendMessage", chat_id=CHAT, text="y", reply_markup=keyboard) == (
        200, ""
    )
    # editMessageReplyMarkup takes inline keyboards only
    message = tg.chat(CHAT)[0]
    status, text = await call_raw(tg, "editMessageReplyMarkup", chat_id=CHAT,
                                  message_id=message.message_id, reply_markup=keyboard)
    assert (status, text) == (
        400, 'Bad Request: can\'t parse inline keyboard markup: unknown field "keyboard"'
    )
    assert tg.bot_texts(CHAT) == ["x", "y"]


@pytest.mark.refused_calls
async def test_spec_refuses_subtypes_the_spec_does_not_have(tg: FakeTelegram) -> None:
    tg.add_chat(CHAT)
    async with make_bot(tg) as bot:
        sent = await bot.send_message(CHAT, "react to me")
    status, text = await call_raw(tg, "setMessageReaction", chat_id=CHAT,
                                  message_id=sent.message_id,
                                  reaction=[{"type": "sticker", "emoji": "👍"}])
    assert status == 400 and "unsupported ReactionType type 'sticker'" in text
    status, text = await call_raw(tg, "setMyCommands", commands=[{"command": "a",
                                  "description": "b"}], scope={"type": "everyone"})
    assert status == 400 and "unsupported BotCommandScope type 'everyone'" in text
    status, text = await call_raw(tg, "setMyCommands", commands=[{"command": "a",
                                  "description": "b"}], scope={"type": "chat"})
    assert (status, text) == (
        400, 'Bad Request: can\'t parse scope: Field "chat_id" must be of type Integer or String'
    )
    assert tg.reactions == [] and tg.commands == []
