"""A strict, in-process fake of the Telegram Bot API for tests.

The fake is a small aiohttp server on 127.0.0.1 (random port) that the real
python-telegram-bot (PTB) talks to over HTTP::

    async with FakeTelegram() as tg:
        app = (
            ApplicationBuilder()
            .token(tg.token)
            .base_url(f"{tg.url}/bot")
            .base_file_url(f"{tg.url}/file/bot")
            .build()
        )
        tg.push_message(chat_id=42, user_id=42, text="hi")
        ...
        await tg.wait_for(lambda: tg.bot_texts(42) == ["echo: hi"])

Requests arrive as ``POST /bot{token}/{method}``, form-encoded (PTB's default:
every value is a string, nested objects are JSON strings), multipart (uploads)
or JSON; all three are accepted, as is ``GET`` with a query string.  Replies
have the real envelope: ``{"ok": true, "result": ...}`` or ``{"ok": false,
"error_code": N, "description": "...", "parameters": {...}}`` with the same
HTTP status.

Where the real service is strict, this fake is too: message length after
entity parsing, HTML/MarkdownV2 parsing errors, "message is not modified",
callback data size, one answer per callback query, flood control on edits,
``getUpdates`` offset confirmation and the 409 conflict between overlapping
long polls.  Behaviour worth knowing when writing tests:

* Updates are delivered at least once.  An update stays queued until a
  ``getUpdates`` call passes an ``offset`` above its id; a consumer that fetched
  it and then died leaves it to be served again to the next poller.
* ``editMessageText`` / ``editMessageReplyMarkup`` without ``reply_markup``
  remove the message's inline keyboard, as Telegram does.
* A newer ``getUpdates`` terminates an older one still waiting: the older one
  gets 409 ``Conflict``.  (PTB's ``Updater.stop()`` abandons its long poll and
  then confirms with a ``timeout=0`` poll; the abandoned one gets the 409.)
* Visible text is trimmed of surrounding whitespace, as Telegram shows it.
* Messages in a forum topic carry ``reply_to_message`` pointing at the topic's
  "topic created" service message unless they reply to something else.
* Sending to a chat the fake has never seen gives 400 ``chat not found``:
  call :meth:`FakeTelegram.push_message` or :meth:`FakeTelegram.add_chat` first.
* HTML errors use Telegram's wording and byte offsets.  One deliberate extra:
  a bare ``&`` that does not start ``&lt;``, ``&gt;``, ``&amp;``, ``&quot;`` or a
  numeric reference is rejected (Telegram keeps it as text), so unescaped
  output is caught.  Lengths are counted in characters (code points).
* :meth:`FakeTelegram.max_edit_rate` counts edit requests of any outcome.
* Files: ``push_photo`` / ``push_voice`` / ``push_audio`` / ``push_video_note`` /
  ``push_document`` queue a user's media (a photo comes as PhotoSizes, smallest
  first, made with Pillow).  ``getFile`` gives Telegram's ``file_path`` shapes
  (``photos/file_0.jpg``, ``voice/file_1.oga``, ...), refuses files over 20 MB with
  ``file is too big`` (``declared_size`` fakes a big file without its bytes), and a
  download is served only at a path ``getFile`` gave.  ``sendPhoto`` refuses photos
  over 10 MB, with bad dimensions or undecodable; any upload over 50 MB gets 413.
  :meth:`FakeTelegram.uploads` and :meth:`FakeTelegram.downloads` report both ways.
* Times (:attr:`Call.time`, chat actions) come from :func:`time.monotonic`.

Webhooks, as Telegram runs them:

* ``setWebhook`` takes an ``https://`` URL on port 443, 80, 88 or 8443; plain
  ``http://`` (any port) only on a loopback host, as a local Bot API server allows.
  ``secret_token`` is 1-256 characters of ``A-Za-z0-9_-``; ``allowed_updates`` is the
  bot's one setting, shared with ``getUpdates``.  An empty ``url`` removes the webhook,
  as ``deleteWebhook`` does; ``drop_pending_updates`` empties the queue in both.
* While a webhook is set, ``getUpdates`` gets 409 (:data:`WEBHOOK_CONFLICT`), a long
  poll already waiting too.
* Queued updates are POSTed as JSON to the webhook, with the
  ``X-Telegram-Bot-Api-Secret-Token`` header when a secret is set: one at a time, in
  order, each waiting for its answer.  An update leaves the queue on a 2xx answer;
  any other answer, a connection error or no answer within ``webhook_timeout`` is
  recorded (``getWebhookInfo``'s ``last_error_date``/``last_error_message``, in
  Telegram's wording) and the same update is tried again after ``webhook_retry``
  (seconds, doubling up to the second value).  Telegram gives up on an update after
  a while; the fake never does.  Every attempt is in :attr:`FakeTelegram.deliveries`.
* :attr:`FakeTelegram.webhook_targets` plays a load balancer: when it is a list, the
  deliveries go to its URLs in turn (each attempt to the next one, so a retry goes
  to another target); an empty list holds them.  The webhook URL is still what
  ``getWebhookInfo`` shows.  :meth:`FakeTelegram.lose_webhook_answers` makes the next
  deliveries arrive but count as failed, as when a proxy times out: the update comes
  again.  Deliveries stop on :meth:`FakeTelegram.close`.

Message drafts (``sendMessageDraft``, Bot API 9.3+, text optional since 10.0):

* Only private chats take drafts: a group, supergroup or channel gets 400
  ``TEXTDRAFT_PEER_INVALID`` (:data:`DRAFT_PEER_INVALID`, what Telegram answers there).
  ``draft_id`` must be a non-zero integer (400 ``draft_id must be non-zero``); ``text``
  is parsed like sendMessage's (same "can't parse entities" errors) and may be empty or
  missing, which shows a "Thinking…" placeholder (:data:`DRAFT_PLACEHOLDER`); over 4096
  visible characters is 400 ``text is too long``.  Returns True.
* Every accepted draft is in :attr:`FakeTelegram.drafts` (:class:`Draft` records).
  :meth:`FakeTelegram.draft_of` is what the chat shows now: the latest draft, until 30 s
  (:data:`DRAFT_TTL`) pass without an update or the bot sends a message to the chat
  (sendMessage, sendDocument or sendPhoto: the client replaces the draft by it).
* ``refuse_drafts = True`` makes every sendMessageDraft fail with 400
  ``method is not available`` (:data:`DRAFTS_UNAVAILABLE`, the fake's own wording), as for
  a bot or server without drafts: the bot must fall back to sending and editing.
* Drafts respect a flood hold on the chat (429) and count in the ``chat_interval``
  stream (see :class:`FakeTelegram`), but not in the per-kind edit/send counting.
"""

from __future__ import annotations

import asyncio
import contextlib
import html
import io
import itertools
import json
import math
import re
import socket
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from http import HTTPStatus
from pathlib import PurePosixPath
from types import TracebackType
from typing import Any, TypedDict, Unpack
from urllib.parse import urlsplit

import aiohttp
from aiohttp import web
from PIL import Image

from tests.fakes import telegram_spec

JSONDict = dict[str, Any]
Handler = Callable[[JSONDict], Awaitable[Any]]

MAX_TEXT = telegram_spec.visible_range("sendMessage", "text")[1]
MAX_CAPTION = telegram_spec.visible_range("sendPhoto", "caption")[1]
MAX_CALLBACK_DATA = 64
MAX_CALLBACK_ANSWER = 200
MAX_BUTTONS = 100
MAX_UPLOAD = 50 * 1024 * 1024  # a bot's upload; bigger: 413
MAX_DOWNLOAD = 20 * 1024 * 1024  # getFile refuses bigger files
MAX_PHOTO = 10 * 1024 * 1024
MAX_PHOTO_SIDES = 10_000  # width + height
MAX_PHOTO_RATIO = 20
MAX_REQUEST = 64 * 1024 * 1024  # aiohttp's client_max_size; a bigger body gets 413 as well
PHOTO_THUMBS = (90, 320, 800)  # boxes of the smaller PhotoSizes Telegram adds
DOWNLOAD_CHUNK = 1024 * 1024
TOO_LARGE = "Request Entity Too Large"

NOT_MODIFIED = (
    "message is not modified: specified new message content and reply markup are exactly "
    "the same as a current content and reply markup of the message"
)
QUERY_TOO_OLD = "query is too old and response timeout expired or query ID is invalid"
CONFLICT = (
    "Conflict: terminated by other getUpdates request; "
    "make sure that only one bot instance is running"
)
WEBHOOK_CONFLICT = (
    "Conflict: can't use getUpdates method while webhook is active; "
    "use deleteWebhook to delete the webhook first"
)
SECRET_HEADER = "X-Telegram-Bot-Api-Secret-Token"
DRAFT_TTL = 30.0  # seconds a draft stays shown after its last update
DRAFT_PLACEHOLDER = "Thinking…"  # what an empty draft shows
DRAFT_PEER_INVALID = "TEXTDRAFT_PEER_INVALID"
DRAFTS_UNAVAILABLE = "method is not available"  # the refuse_drafts answer (fake's wording)
CHAT_STREAM = "any"  # the flood kind that counts every call to a chat (chat_interval)
WEBHOOK_PORTS = frozenset({443, 80, 88, 8443})
LOOPBACK_HOSTS = frozenset({"127.0.0.1", "localhost", "::1"})
_SECRET_TOKEN = re.compile(r"[A-Za-z0-9_-]{1,256}")

CHAT_ACTIONS = frozenset(
    {
        "typing",
        "upload_photo",
        "record_video",
        "upload_video",
        "record_voice",
        "upload_voice",
        "upload_document",
        "choose_sticker",
        "find_location",
        "record_video_note",
        "upload_video_note",
    }
)
# The emoji a bot may use with setMessageReaction (ReactionTypeEmoji in the Bot API docs).
REACTION_EMOJI = frozenset(
    (
        "👍 👎 ❤ 🔥 🥰 👏 😁 🤔 🤯 😱 🤬 😢 🎉 🤩 🤮 💩 🙏 👌 🕊 🤡 "
        "🥱 🥴 😍 🐳 ❤‍🔥 🌚 🌭 💯 🤣 ⚡ 🍌 🏆 💔 🤨 😐 🍓 🍾 💋 🖕 😈 "
        "😴 😭 🤓 👻 👨‍💻 👀 🎃 🙈 😇 😨 🤝 ✍ 🤗 🫡 🎅 🎄 ☃ 💅 🤪 🗿 "
        "🆒 💘 🙉 🦄 😘 💊 🙊 😎 👾 🤷‍♂ 🤷 🤷‍♀ 😡"
    ).split()
)
ENTITY_TYPES = frozenset(
    {
        "mention",
        "hashtag",
        "cashtag",
        "bot_command",
        "url",
        "email",
        "phone_number",
        "bold",
        "italic",
        "underline",
        "strikethrough",
        "spoiler",
        "blockquote",
        "expandable_blockquote",
        "code",
        "pre",
        "text_link",
        "text_mention",
        "custom_emoji",
    }
)
BUTTON_ACTIONS = (
    "url",
    "callback_data",
    "web_app",
    "login_url",
    "switch_inline_query",
    "switch_inline_query_current_chat",
    "switch_inline_query_chosen_chat",
    "copy_text",
    "callback_game",
    "pay",
)

class ApiError(Exception):
    """An error reply: HTTP status, description and optional ``parameters``."""

    def __init__(self, status: int, description: str, parameters: JSONDict | None = None) -> None:
        super().__init__(description)
        self.status = status
        self.description = description
        self.parameters = parameters

    def body(self) -> JSONDict:
        out: JSONDict = {"ok": False, "error_code": self.status, "description": self.description}
        if self.parameters:
            out["parameters"] = self.parameters
        return out


def bad_request(text: str) -> ApiError:
    return ApiError(400, f"Bad Request: {text}")


def utf16_len(text: str) -> int:
    """Length in UTF-16 code units, the unit of Telegram entity offsets."""
    return len(text.encode("utf-16-le")) // 2


# --------------------------------------------------------------------------- records


@dataclass
class UploadedFile:
    """A file part of a multipart request."""

    filename: str
    content_type: str
    data: bytes

    def __repr__(self) -> str:
        return f"UploadedFile({self.filename!r}, {len(self.data)} bytes)"


@dataclass
class Call:
    """One API request as the fake saw it; ``status`` is 0 while still in flight."""

    method: str
    params: JSONDict
    time: float
    status: int = 0
    description: str | None = None
    result: Any = None

    @property
    def ok(self) -> bool:
        return self.status == 200


@dataclass(frozen=True)
class Delivery:
    """One POST of an update to a webhook; ``status`` is 0 when no HTTP answer came."""

    update_id: int
    url: str
    status: int
    error: str | None  # Telegram's last_error_message for a failed attempt
    time: float

    @property
    def ok(self) -> bool:
        return self.error is None


@dataclass(frozen=True)
class _Kind:
    """How Telegram names and describes one kind of file."""

    id_prefix: str
    folder: str  # of the file_path getFile gives
    extension: str  # of the file_path, unless ``named`` and the file name has one
    named: bool
    fields: tuple[str, ...]  # of the JSON object besides ids and size
    title: str  # in "can't use file of type X as Y"


FILE_KINDS = {
    "photo": _Kind("AgACAgIAAxkBAAI", "photos", ".jpg", False, ("width", "height"), "Photo"),
    "voice": _Kind(
        "AwACAgIAAxkBAAI", "voice", ".oga", False, ("duration", "mime_type"), "VoiceNote"
    ),
    "audio": _Kind(
        "CQACAgIAAxkBAAI", "music", ".mp3", True, ("duration", "file_name", "mime_type"), "Audio"
    ),
    "video_note": _Kind(
        "DQACAgIAAxkBAAI", "video_notes", ".mp4", False, ("length", "duration"), "VideoNote"
    ),
    "document": _Kind(
        "BQACAgIAAxkDAAI", "documents", "", True, ("file_name", "mime_type"), "Document"
    ),
}


@dataclass
class FakeFile:
    """A file in the fake's store: one photo size, a voice note, audio, video note or document.

    ``size`` is the size Telegram reports: ``len(data)`` unless the test declared
    more (a download serves ``data`` as it is).  ``file_path`` is set by the first
    getFile; ``downloads`` counts the downloads served.
    """

    kind: str
    file_id: str
    file_unique_id: str
    data: bytes = field(repr=False)
    size: int
    file_name: str = ""
    mime_type: str = ""
    width: int = 0
    height: int = 0
    duration: int = 0
    length: int = 0
    file_path: str | None = None
    downloads: int = 0

    @property
    def name(self) -> str:
        return self.file_name

    def as_json(self) -> JSONDict:
        out: JSONDict = {"file_id": self.file_id, "file_unique_id": self.file_unique_id}
        out.update((key, getattr(self, key)) for key in FILE_KINDS[self.kind].fields)
        out["file_size"] = self.size
        return out


FakeDocument = FakeFile  # the name from before photos and voice notes


@dataclass(frozen=True)
class Upload:
    """A photo (its largest size) or document the bot sent; see :meth:`FakeTelegram.uploads`."""

    kind: str
    file_name: str
    data: bytes = field(repr=False)
    caption: str
    thread_id: int | None
    message_id: int


@dataclass(frozen=True)
class Draft:
    """One accepted sendMessageDraft: the visible text (:data:`DRAFT_PLACEHOLDER` for an
    empty one) and when it arrived (:func:`time.monotonic`)."""

    chat_id: int
    draft_id: int
    text: str
    time: float
    thread_id: int | None = None
    entities: tuple[JSONDict, ...] = ()

    @property
    def placeholder(self) -> bool:
        return self.text == DRAFT_PLACEHOLDER and not self.entities


@dataclass
class FakeMessage:
    """A message as currently shown in the chat (after edits).

    ``text`` is the visible plain text (for media: the caption), ``raw_text``
    what was sent, ``entities`` the parsed formatting, ``history`` every visible
    text the message has had, oldest first.
    """

    message_id: int
    chat_id: int
    thread_id: int | None
    from_bot: bool
    text: str
    raw_text: str
    parse_mode: str | None = None
    entities: list[JSONDict] = field(default_factory=list)
    reply_markup: JSONDict | None = None
    document: FakeFile | None = None
    photo: list[FakeFile] = field(default_factory=list)  # sizes, smallest first
    media: FakeFile | None = None  # a voice note, audio or video note
    edits: int = 0
    deleted: bool = False
    sender: JSONDict = field(default_factory=dict)
    date: int = 0
    edit_date: int | None = None
    reply_to_message_id: int | None = None
    reactions: list[JSONDict] = field(default_factory=list)
    history: list[str] = field(default_factory=list)
    forward_origin: JSONDict | None = None  # a MessageOrigin: the message is a forward
    quote: JSONDict | None = None  # a TextQuote: the part of the replied message quoted

    @property
    def files(self) -> list[FakeFile]:
        """Every file the message carries (all photo sizes)."""
        single = self.document or self.media
        return [*self.photo, *([single] if single else [])]


@dataclass
class _Flood:
    """Per chat and kind (edit/send/any): time of the last accepted request and quick streak."""

    last: float | None = None
    streak: int = 0

    def next_streak(self, now: float, interval: float) -> int:
        """The streak a request arriving at ``now`` would make (nothing is changed)."""
        quick = self.last is not None and now - self.last < interval
        return self.streak + 1 if quick else 0


class _Signal:
    """Broadcast wake-up: every waiter holding the current event is woken by ``fire``."""

    def __init__(self) -> None:
        self._event = asyncio.Event()

    def current(self) -> asyncio.Event:
        return self._event

    def fire(self) -> None:
        self._event.set()
        self._event = asyncio.Event()


async def _wait_event(event: asyncio.Event, seconds: float) -> None:
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(seconds):
            await event.wait()


# --------------------------------------------------------------------------- text parsing


class _Builder:
    """Accumulates visible text and entities with UTF-16 offsets."""

    def __init__(self) -> None:
        self.parts: list[str] = []
        self.pos = 0
        self.entities: list[JSONDict] = []

    def add(self, text: str) -> None:
        self.parts.append(text)
        self.pos += utf16_len(text)

    def entity(self, kind: str, start: int, **extra: Any) -> None:
        if self.pos > start:
            self.entities.append(
                {"type": kind, "offset": start, "length": self.pos - start, **extra}
            )

    def result(self) -> tuple[str, list[JSONDict]]:
        entities = sorted(self.entities, key=lambda e: (e["offset"], -e["length"]))
        return "".join(self.parts), entities


@dataclass
class _Open:
    tag: str
    start: int  # UTF-16 offset in the visible text
    byte: int  # byte offset of the opening markup in the source
    extra: JSONDict


class _Parser:
    def __init__(self, raw: str) -> None:
        self.raw = raw
        self.i = 0
        self.out = _Builder()
        self.stack: list[_Open] = []

    def byte_at(self, index: int) -> int:
        return len(self.raw[:index].encode())

    @staticmethod
    def fail(message: str) -> ApiError:
        return bad_request(f"can't parse entities: {message}")

    def parse(self) -> tuple[str, list[JSONDict]]:
        raise NotImplementedError


_HTML_TAGS = {
    "b": "bold",
    "strong": "bold",
    "i": "italic",
    "em": "italic",
    "u": "underline",
    "ins": "underline",
    "s": "strikethrough",
    "strike": "strikethrough",
    "del": "strikethrough",
    "a": "text_link",
    "code": "code",
    "pre": "pre",
    "blockquote": "blockquote",
    "tg-spoiler": "spoiler",
    "span": "spoiler",
}
_UNQUOTED_VALUE = re.compile(r"[A-Za-z0-9.-]*")
_HTML_ENTITY = re.compile(r"&(?:(lt|gt|amp|quot)|#([0-9]{1,7})|#[xX]([0-9a-fA-F]{1,6}));")
_HTML_TEXT = re.compile(r"[^<&]+")
_NAMED_ENTITIES = {"lt": "<", "gt": ">", "amp": "&", "quot": '"'}


class _HtmlParser(_Parser):
    """Telegram's HTML subset; anything else is a parse error."""

    def parse(self) -> tuple[str, list[JSONDict]]:
        while self.i < len(self.raw):
            ch = self.raw[self.i]
            if ch == "<":
                if self.raw.startswith("</", self.i):
                    self.end_tag()
                else:
                    self.start_tag()
            elif ch == "&":
                self.entity()
            else:
                match = _HTML_TEXT.match(self.raw, self.i)
                assert match is not None
                self.out.add(match.group(0))
                self.i = match.end()
        if self.stack:
            raise self.fail(
                f'Can\'t find end tag corresponding to start tag "{self.stack[-1].tag}"'
            )
        return self.out.result()

    def entity(self) -> None:
        match = _HTML_ENTITY.match(self.raw, self.i)
        if match is None:
            raise self.fail(
                f'Unescaped "&" at byte offset {self.byte_at(self.i)}: write it as &amp;'
            )
        named, decimal, hexadecimal = match.groups()
        if named:
            self.out.add(_NAMED_ENTITIES[named])
        else:
            code = int(decimal) if decimal else int(hexadecimal, 16)
            if not 0 < code <= 0x10FFFF or 0xD800 <= code <= 0xDFFF:
                raise self.fail(
                    "Text contains invalid Unicode characters after decoding HTML entities, "
                    "check for unmatched surrogate code units"
                )
            self.out.add(chr(code))
        self.i = match.end()

    def name_token(self, pos: int, stops: str) -> int:
        """End of a token that runs until whitespace or one of ``stops``."""
        raw = self.raw
        while pos < len(raw) and not raw[pos].isspace() and raw[pos] not in stops:
            pos += 1
        return pos

    def skip_spaces(self, pos: int) -> int:
        while pos < len(self.raw) and self.raw[pos].isspace():
            pos += 1
        return pos

    def start_tag(self) -> None:
        begin = self.i
        end = self.name_token(begin + 1, ">")
        if end >= len(self.raw):
            raise self.fail(f"Unclosed start tag at byte offset {self.byte_at(begin)}")
        name = self.raw[begin + 1 : end].lower()
        if name not in _HTML_TAGS:
            raise self.fail(f'Unsupported start tag "{name}" at byte offset {self.byte_at(begin)}')
        attributes: dict[str, str] = {}
        pos = self.skip_spaces(end)
        while pos < len(self.raw) and self.raw[pos] != ">":
            pos = self.skip_spaces(self.attribute(name, begin, pos, attributes))
        if pos >= len(self.raw):
            raise self.fail(f"Unclosed start tag at byte offset {self.byte_at(begin)}")
        self.i = pos + 1
        self.open(name, attributes, begin)

    def attribute(self, tag: str, begin: int, pos: int, found: dict[str, str]) -> int:
        """Parse one ``name="value"`` into ``found``; returns the position after it."""
        where = f'the tag "{tag}" at byte offset {self.byte_at(begin)}'
        end = self.name_token(pos, "=>")
        name = self.raw[pos:end].lower()
        if not name:
            raise self.fail(f"Empty attribute name in {where}")
        unclosed = self.fail(f'Unclosed start tag "{tag}" at byte offset {self.byte_at(begin)}')
        pos = self.skip_spaces(end)
        if pos >= len(self.raw):
            raise unclosed
        if tag == "blockquote" and name == "expandable" and self.raw[pos] != "=":
            found[name] = ""
            return pos
        if self.raw[pos] != "=":
            raise self.fail(f"Expected equal sign in declaration of an attribute of {where}")
        pos = self.skip_spaces(pos + 1)
        if pos >= len(self.raw):
            raise unclosed
        quote = self.raw[pos]
        if quote in "\"'":
            close = self.raw.find(quote, pos + 1)
            if close < 0:
                raise self.fail(f"Unclosed start tag at byte offset {self.byte_at(begin)}")
            found[name] = html.unescape(self.raw[pos + 1 : close])
            return close + 1
        match = _UNQUOTED_VALUE.match(self.raw, pos)
        assert match is not None
        after = self.raw[match.end() : match.end() + 1]
        if not match.group(0) or not (after == ">" or after.isspace()):
            raise self.fail(f"Unexpected end of name token at byte offset {self.byte_at(pos)}")
        found[name] = match.group(0)
        return match.end()

    def open(self, name: str, attributes: dict[str, str], begin: int) -> None:
        extra: JSONDict = {}
        if name == "span" and attributes.get("class") != "tg-spoiler":
            raise self.fail(
                f'Tag "span" must have class "tg-spoiler" at byte offset {self.byte_at(begin)}'
            )
        if name == "a" and attributes.get("href"):
            extra["url"] = attributes["href"]
        if name == "blockquote" and "expandable" in attributes:
            extra["expandable"] = True
        language = attributes.get("class", "")
        if name == "code" and language.startswith("language-"):
            extra["language"] = language.removeprefix("language-")
        self.stack.append(_Open(name, self.out.pos, self.byte_at(begin), extra))

    def end_tag(self) -> None:
        begin = self.i
        where = f"at byte offset {self.byte_at(begin)}"
        if not self.stack:
            raise self.fail(f"Unexpected end tag {where}")
        end = self.name_token(begin + 2, ">")
        name = self.raw[begin + 2 : end].lower()
        pos = self.skip_spaces(end)
        if self.raw[pos : pos + 1] != ">":
            raise self.fail(f"Unclosed end tag {where}")
        top = self.stack.pop()
        if name != top.tag:
            raise self.fail(
                f'Unmatched end tag {where}, expected "</{top.tag}>", found "</{name}>"'
            )
        self.i = pos + 1
        self.close(top)

    def close(self, top: _Open) -> None:
        kind = _HTML_TAGS[top.tag]
        extra = dict(top.extra)
        if kind == "text_link" and "url" not in extra:
            return
        if kind == "blockquote" and extra.pop("expandable", False):
            kind = "expandable_blockquote"
        if kind == "code" and "language" in extra:
            language = extra.pop("language")
            if self.stack and self.stack[-1].tag == "pre":
                self.stack[-1].extra["language"] = language
                return
        self.out.entity(kind, top.start, **extra)


_MD2_MARKS = (
    ("||", "spoiler"),
    ("__", "underline"),
    ("*", "bold"),
    ("_", "italic"),
    ("~", "strikethrough"),
)
_MD2_RESERVED = frozenset("_*[]()~`>#+-=|{}.!")
_KIND_NAMES = {
    "spoiler": "Spoiler",
    "underline": "Underline",
    "bold": "Bold",
    "italic": "Italic",
    "strikethrough": "Strikethrough",
}


class _MarkdownV2Parser(_Parser):
    """MarkdownV2: reserved characters must be escaped, entities must be closed."""

    def __init__(self, raw: str) -> None:
        super().__init__(raw)
        self.quote: int | None = None

    def parse(self) -> tuple[str, list[JSONDict]]:
        while self.i < len(self.raw):
            self.step()
        self.end_quote()
        if self.stack:
            raise self.unclosed(self.stack[-1])
        return self.out.result()

    def unclosed(self, top: _Open) -> ApiError:
        name = _KIND_NAMES.get(top.extra.get("kind", ""), "TextUrl")
        return self.fail(f"Can't find end of {name} entity at byte offset {top.byte}")

    def reserved(self, ch: str) -> ApiError:
        return self.fail(
            f"Character '{ch}' is reserved and must be escaped with the preceding '\\'"
        )

    def step(self) -> None:
        raw, i = self.raw, self.i
        ch = raw[i]
        if ch == ">" and (i == 0 or raw[i - 1] == "\n"):
            if self.quote is None:
                self.quote = self.out.pos
            self.i += 1
        elif ch == "\n":
            if not raw.startswith(">", i + 1):
                self.end_quote()
            self.out.add(ch)
            self.i += 1
        elif ch == "\\":
            self.escape()
        elif ch == "`":
            self.code()
        elif ch == "[":
            self.stack.append(_Open("[", self.out.pos, self.byte_at(i), {}))
            self.i += 1
        elif ch == "]":
            self.link_end()
        elif not self.marker():
            if ch in _MD2_RESERVED:
                raise self.reserved(ch)
            self.out.add(ch)
            self.i += 1

    def end_quote(self) -> None:
        if self.quote is not None:
            self.out.entity("blockquote", self.quote)
            self.quote = None

    def escape(self) -> None:
        nxt = self.raw[self.i + 1 : self.i + 2]
        if nxt and 1 <= ord(nxt) <= 126:
            self.out.add(nxt)
            self.i += 2
        else:
            self.out.add("\\")
            self.i += 1

    def until(self, pos: int, stop: str, failure: ApiError) -> tuple[str, int]:
        """Text up to the first unescaped ``stop``; a backslash escapes the next character."""
        raw = self.raw
        parts: list[str] = []
        while pos < len(raw):
            ch = raw[pos]
            if ch == stop:
                return "".join(parts), pos
            if ch == "\\" and pos + 1 < len(raw):
                parts.append(raw[pos + 1])
                pos += 2
                continue
            parts.append(ch)
            pos += 1
        raise failure

    def code(self) -> None:
        begin = self.byte_at(self.i)
        start = self.out.pos
        if not self.raw.startswith("```", self.i):
            failure = self.fail(f"Can't find end of Code entity at byte offset {begin}")
            body, end = self.until(self.i + 1, "`", failure)
            self.out.add(body)
            self.out.entity("code", start)
            self.i = end + 1
            return
        failure = self.fail(f"Can't find end of Pre entity at byte offset {begin}")
        body, end = self.until(self.i + 3, "`", failure)
        if not self.raw.startswith("```", end):
            raise failure
        first, newline, rest = body.partition("\n")
        extra: JSONDict = {}
        if newline and first and not any(c.isspace() for c in first):
            extra["language"], body = first, rest
        self.out.add(body)
        self.out.entity("pre", start, **extra)
        self.i = end + 3

    def link_end(self) -> None:
        if not self.stack or self.stack[-1].tag != "[":
            raise self.reserved("]")
        top = self.stack.pop()
        failure = self.fail(f"Can't find end of a URL for TextUrl entity at byte offset {top.byte}")
        if not self.raw.startswith("(", self.i + 1):
            raise failure
        url, end = self.until(self.i + 2, ")", failure)
        self.out.entity("text_link", top.start, url=url)
        self.i = end + 1

    def marker(self) -> bool:
        for mark, kind in _MD2_MARKS:
            if self.raw.startswith(mark, self.i):
                self.toggle(mark, kind)
                self.i += len(mark)
                return True
        return False

    def toggle(self, mark: str, kind: str) -> None:
        if all(o.tag != mark for o in self.stack):
            self.stack.append(_Open(mark, self.out.pos, self.byte_at(self.i), {"kind": kind}))
            return
        top = self.stack[-1]
        if top.tag != mark:
            raise self.unclosed(top)
        self.stack.pop()
        self.out.entity(kind, top.start)


_MD_LINK = re.compile(r"\[([^\]]*)\]\(([^)]*)\)")
_MD_KINDS = {"*": "bold", "_": "italic", "`": "code"}


class _MarkdownParser(_Parser):
    """Legacy Markdown: *bold*, _italic_, `code`, ```pre```, [text](url); no nesting."""

    def parse(self) -> tuple[str, list[JSONDict]]:
        while self.i < len(self.raw):
            self.step()
        return self.out.result()

    def unclosed(self) -> ApiError:
        return self.fail(
            f"Can't find end of the entity starting at byte offset {self.byte_at(self.i)}"
        )

    def step(self) -> None:
        raw, i = self.raw, self.i
        ch = raw[i]
        start = self.out.pos
        if ch == "\\" and raw[i + 1 : i + 2] in ("_", "*", "`", "["):
            self.out.add(raw[i + 1])
            self.i += 2
        elif raw.startswith("```", i):
            end = raw.find("```", i + 3)
            if end < 0:
                raise self.unclosed()
            self.out.add(raw[i + 3 : end])
            self.out.entity("pre", start)
            self.i = end + 3
        elif ch in _MD_KINDS:
            end = raw.find(ch, i + 1)
            if end < 0:
                raise self.unclosed()
            self.out.add(raw[i + 1 : end])
            self.out.entity(_MD_KINDS[ch], start)
            self.i = end + 1
        elif ch == "[":
            match = _MD_LINK.match(raw, i)
            if match is None:
                raise self.unclosed()
            self.out.add(match.group(1))
            self.out.entity("text_link", start, url=match.group(2))
            self.i = match.end()
        else:
            self.out.add(ch)
            self.i += 1


_PARSERS: dict[str, type[_Parser]] = {
    "html": _HtmlParser,
    "markdownv2": _MarkdownV2Parser,
    "markdown": _MarkdownParser,
}


def _check_entity(entity: Any, size: int) -> JSONDict:
    if not isinstance(entity, dict) or entity.get("type") not in ENTITY_TYPES:
        raise _Parser.fail(f"unsupported entity {entity!r}")
    offset, length = entity.get("offset"), entity.get("length")
    if not isinstance(offset, int) or not isinstance(length, int):
        raise _Parser.fail(f"entity offset and length must be integers: {entity!r}")
    if offset < 0 or length < 1 or offset + length > size:
        raise _Parser.fail(f"entity {entity!r} is outside the text (length {size})")
    if entity["type"] == "text_link" and not entity.get("url"):
        raise _Parser.fail("text_link entity without url")
    return dict(entity)


def _trim(text: str, entities: list[JSONDict]) -> tuple[str, list[JSONDict]]:
    stripped = text.strip()
    if stripped == text:
        return text, entities
    shift = utf16_len(text[: len(text) - len(text.lstrip())])
    limit = utf16_len(stripped)
    out: list[JSONDict] = []
    for entity in entities:
        start = max(entity["offset"] - shift, 0)
        end = min(entity["offset"] + entity["length"] - shift, limit)
        if end > start:
            out.append({**entity, "offset": start, "length": end - start})
    return stripped, out


def parse_text(text: str, parse_mode: Any, entities: Any) -> tuple[str, list[JSONDict]]:
    """Visible text and entities, as Telegram would show ``text``.

    Explicit ``entities`` win over ``parse_mode``.  Raises :class:`ApiError`.
    """
    if entities is not None:
        if not isinstance(entities, list):
            raise _Parser.fail("entities must be an array")
        size = utf16_len(text)
        checked = [_check_entity(entity, size) for entity in entities]
        visible, found = text, sorted(checked, key=lambda e: (e["offset"], -e["length"]))
    elif not parse_mode:
        visible, found = text, []
    else:
        parser = _PARSERS.get(str(parse_mode).lower())
        if parser is None:
            raise bad_request(f"unsupported parse_mode {parse_mode!r}")
        visible, found = parser(text).parse()
    return _trim(visible, found)


def html_to_text(raw: str) -> str:
    """Visible plain text of Telegram HTML (raises :class:`ApiError` if it is invalid)."""
    return parse_text(raw, "HTML", None)[0]


# --------------------------------------------------------------------------- markup


def _check_button(button: Any) -> None:
    if not isinstance(button, dict) or not isinstance(button.get("text"), str):
        raise bad_request(
            'can\'t parse inline keyboard button: Field "text" must be of type String'
        )
    if not button["text"].strip():
        raise bad_request("BUTTON_TEXT_INVALID")
    actions = [key for key in BUTTON_ACTIONS if key in button]
    if len(actions) != 1:
        raise bad_request(
            "can't parse inline keyboard button: Text buttons are unallowed in the inline keyboard"
        )
    if "callback_data" in button:
        data = button["callback_data"]
        if not isinstance(data, str) or not 1 <= len(data.encode()) <= MAX_CALLBACK_DATA:
            raise bad_request("BUTTON_DATA_INVALID")
    if "url" in button and not re.fullmatch(r"(https?|tg)://\S+", str(button["url"])):
        raise bad_request("BUTTON_URL_INVALID")


def check_markup(markup: Any, *, inline_only: bool) -> JSONDict | None:
    """Validated reply_markup; an inline keyboard without buttons counts as none."""
    if markup is None:
        return None
    if not isinstance(markup, dict):
        raise bad_request("can't parse reply keyboard markup JSON object")
    if "inline_keyboard" in markup:
        rows = markup["inline_keyboard"]
        if not isinstance(rows, list) or not all(isinstance(row, list) for row in rows):
            raise bad_request("can't parse inline keyboard markup: expected an Array of Arrays")
        buttons = [button for row in rows for button in row]
        if len(buttons) > MAX_BUTTONS:
            raise bad_request("REPLY_MARKUP_TOO_LONG")
        for button in buttons:
            _check_button(button)
        return markup if buttons else None
    if inline_only:
        raise bad_request("inline keyboard expected")
    if any(key in markup for key in ("keyboard", "remove_keyboard", "force_reply")):
        return markup
    raise bad_request("can't parse reply keyboard markup JSON object")


def _callback_datas(markup: JSONDict | None) -> set[str]:
    if not markup:
        return set()
    rows = markup.get("inline_keyboard", [])
    return {b["callback_data"] for row in rows for b in row if "callback_data" in b}


# --------------------------------------------------------------------------- incoming entities

_COMMAND = re.compile(r"(?<!\S)/[A-Za-z0-9_]{1,32}(?:@[A-Za-z0-9_]{3,32})?(?![A-Za-z0-9_/@])")
_URL = re.compile(r"https?://[^\s<>\"]+")
_MENTION = re.compile(r"(?<![A-Za-z0-9_@])@[A-Za-z0-9_]{5,32}(?![A-Za-z0-9_])")


def auto_entities(text: str) -> list[JSONDict]:
    """Entities Telegram detects in a user's text: bot commands, URLs, @mentions."""
    found: list[JSONDict] = []
    taken: list[tuple[int, int]] = []
    for pattern, kind in ((_COMMAND, "bot_command"), (_URL, "url"), (_MENTION, "mention")):
        for match in pattern.finditer(text):
            start, end = match.span()
            if any(start < b and a < end for a, b in taken):
                continue
            taken.append((start, end))
            offset = utf16_len(text[:start])
            found.append({"type": kind, "offset": offset, "length": utf16_len(match.group(0))})
    return sorted(found, key=lambda e: e["offset"])


# --------------------------------------------------------------------------- request decoding


async def _read_params(request: web.Request) -> JSONDict:
    try:
        return await _read_body(request)
    except web.HTTPRequestEntityTooLarge:
        raise ApiError(413, TOO_LARGE) from None


async def _read_body(request: web.Request) -> JSONDict:
    raw: JSONDict = dict(request.query)
    if request.content_type == "application/json":
        body = await request.read()
        if body:
            try:
                data = json.loads(body)
            except ValueError:
                raise bad_request("can't parse JSON request body") from None
            if not isinstance(data, dict):
                raise bad_request("JSON request body must be an object")
            raw.update(data)
    elif request.content_type in ("application/x-www-form-urlencoded", "multipart/form-data"):
        form = await request.post()
        for key, value in form.items():
            if isinstance(value, web.FileField):
                raw[key] = UploadedFile(value.filename, value.content_type, value.file.read())
            elif isinstance(value, bytes | bytearray):
                raw[key] = bytes(value).decode()
            else:
                raw[key] = value
    return raw


def _require_int(params: JSONDict, key: str) -> int:
    value = params.get(key)
    if value is None or value == "":
        raise bad_request(f"{key} is empty")
    if isinstance(value, bool) or not isinstance(value, int):
        raise bad_request(f"invalid {key} {value!r}")
    return value


def _short(value: Any, limit: int = 160) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


# --------------------------------------------------------------------------- media


def _open_image(data: bytes) -> Image.Image:
    """The decoded image, or Telegram's error for bytes it cannot take as a photo."""
    try:
        image = Image.open(io.BytesIO(data))
    except (Image.DecompressionBombError, Image.DecompressionBombWarning):
        raise bad_request("PHOTO_INVALID_DIMENSIONS") from None
    except Exception:
        raise bad_request("IMAGE_PROCESS_FAILED") from None
    width, height = image.size
    if width + height > MAX_PHOTO_SIDES or max(width, height) > MAX_PHOTO_RATIO * min(
        width, height
    ):
        raise bad_request("PHOTO_INVALID_DIMENSIONS")
    try:
        image.load()
    except Exception:
        raise bad_request("IMAGE_PROCESS_FAILED") from None
    return image


def _jpeg_thumbnail(image: Image.Image, box: int) -> tuple[bytes, int, int]:
    """A JPEG copy of ``image`` that fits a ``box``-pixel square, and its width and height."""
    small = image.copy()
    small.thumbnail((box, box))
    out = io.BytesIO()
    small.convert("RGB").save(out, "JPEG", quality=85)
    return out.getvalue(), small.width, small.height


class Origin(TypedDict, total=False):
    """Where a user's message comes from (the keyword arguments of the ``push_*`` helpers)."""

    chat_type: str  # "private" unless given
    thread_id: int | None
    reply_to_message_id: int | None
    first_name: str  # "Ann" unless given
    username: str | None
    forward_origin: JSONDict | None  # a MessageOrigin (user, hidden_user, chat or channel)
    quote: str | None  # part of the replied message's text, quoted (needs a reply)


_ORIGIN_KEYS = Origin.__optional_keys__


# --------------------------------------------------------------------------- the server


class FakeTelegram:
    """The fake Bot API server plus the helpers tests drive it with.

    Flood control (when ``flood`` is true): per chat, an edit (editMessageText or
    editMessageReplyMarkup) that arrives less than ``edit_interval`` seconds after
    the previous accepted edit is "quick"; after ``burst`` quick edits in a row the
    next quick one gets 429 ``retry after N`` (N = ``retry_after``) and opens a hold
    of N seconds during which every send and edit to that chat gets 429 too, with
    the seconds left.  ``send_interval`` (off when 0) applies the same rule to
    sendMessage/sendDocument/sendPhoto.

    ``chat_interval`` (off when 0) is a stricter mode for load tests: every call that
    targets a chat (sendMessage, editMessageText, editMessageReplyMarkup, sendDocument,
    sendPhoto, setMessageReaction and sendMessageDraft; not sendChatAction,
    answerCallbackQuery or deleteMessage) counts in one per-chat stream (kind
    :data:`CHAT_STREAM`) with the same rule: after ``burst`` quick calls in a row (each
    less than ``chat_interval`` after the previous accepted one) the next quick one gets
    429 and opens the hold, which then covers all these methods (reactions too).  The
    per-kind edit/send counting runs as before alongside it; a call refused by either
    counts in neither.

    Webhooks (see the module docstring): ``webhook_targets`` stands for a load balancer
    (None: deliver to the URL setWebhook gave), ``webhook_retry`` is the first and the
    longest pause before a failed delivery is tried again, ``webhook_timeout`` how long
    a delivery waits for its answer.
    """

    def __init__(
        self,
        *,
        token: str = "123:ABC",
        bot_username: str = "tandem_bot",
        edit_interval: float = 1.0,
        burst: int = 3,
        retry_after: int = 1,
        flood: bool = True,
        send_interval: float = 0.0,
        chat_interval: float = 0.0,
        webhook_targets: list[str] | None = None,
        webhook_retry: tuple[float, float] = (0.2, 2.0),
        webhook_timeout: float = 10.0,
    ) -> None:
        if retry_after < 1:
            raise ValueError("retry_after must be at least 1 (PTB ignores a zero retry_after)")
        self.token = token
        self.bot_username = bot_username
        self.edit_interval = edit_interval
        self.send_interval = send_interval
        self.chat_interval = chat_interval
        self.burst = burst
        self.retry_after = retry_after
        self.flood = flood
        self.me: JSONDict = {
            "id": 999,
            "is_bot": True,
            "first_name": "Tandem",
            "username": bot_username,
            "can_join_groups": True,
            "can_read_all_group_messages": False,
            "supports_inline_queries": False,
        }
        self.url = ""
        self.calls: list[Call] = []
        self.callback_answers: dict[str, dict[str, Any]] = {}
        self.rate_limited: list[tuple[int, str]] = []
        self.chat_actions: list[tuple[int, str, float]] = []
        self.reactions: list[tuple[int, int, list[JSONDict]]] = []
        self.drafts: list[Draft] = []
        """Every accepted sendMessageDraft, oldest first."""
        self.refuse_drafts = False
        """When true, sendMessageDraft answers 400 :data:`DRAFTS_UNAVAILABLE`."""
        self._shown_drafts: dict[int, Draft] = {}  # chat -> the draft it shows now
        self.internal_errors: list[BaseException] = []
        self._commands: dict[str, list[JSONDict]] = {}
        self._chats: dict[int, JSONDict] = {}
        self._messages: dict[int, list[FakeMessage]] = {}
        self._next_message_id: dict[int, int] = {}
        self._updates: list[JSONDict] = []
        self._update_ids = itertools.count(10_001)
        self._query_ids = itertools.count(4_815_162_342_000_001)
        self._file_ids = itertools.count(1)
        self._open_queries: set[str] = set()
        self._files: dict[str, FakeFile] = {}
        self._photos: dict[str, list[FakeFile]] = {}  # any size's file_id -> all sizes
        self._paths: dict[str, FakeFile] = {}
        self._path_ids = itertools.count(0)
        self._edit_times: dict[int, list[float]] = {}
        self._flood_state: dict[tuple[int, str], _Flood] = {}
        self._hold_until: dict[int, float] = {}
        self._allowed_updates: list[str] | None = None
        self._poll_generation = 0
        self._signal = _Signal()
        self._closing = False
        self._runner: web.AppRunner | None = None
        self.webhook_retry = webhook_retry
        self.webhook_timeout = webhook_timeout
        self.deliveries: list[Delivery] = []
        """Every attempt to deliver an update to a webhook, oldest first."""
        self._webhook_targets = list(webhook_targets) if webhook_targets is not None else None
        self._webhook: JSONDict | None = None
        self._webhook_error: tuple[int, str] | None = None
        self._webhook_task: asyncio.Task[None] | None = None
        self._target_turn = 0
        self._lost_answers = 0
        handlers: dict[str, Handler] = {
            "getMe": self._get_me,
            "setWebhook": self._set_webhook,
            "deleteWebhook": self._delete_webhook,
            "getWebhookInfo": self._get_webhook_info,
            "getUpdates": self._get_updates,
            "sendMessage": self._send_message,
            "editMessageText": self._edit_message_text,
            "editMessageReplyMarkup": self._edit_message_reply_markup,
            "deleteMessage": self._delete_message,
            "answerCallbackQuery": self._answer_callback_query,
            "sendChatAction": self._send_chat_action,
            "sendDocument": self._send_document,
            "sendPhoto": self._send_photo,
            "getFile": self._get_file,
            "setMyCommands": self._set_my_commands,
            "getMyCommands": self._get_my_commands,
            "deleteMyCommands": self._delete_my_commands,
            "setMessageReaction": self._set_message_reaction,
            "sendMessageDraft": self._send_message_draft,
        }
        self._methods = {name.lower(): (name, handler) for name, handler in handlers.items()}

    # ------------------------------------------------------------------ lifecycle

    async def start(self) -> None:
        app = web.Application(client_max_size=MAX_REQUEST)
        app.router.add_route("*", "/bot{token}/{method}", self._handle)
        app.router.add_get("/file/bot{token}/{path:.+}", self._download)
        self._runner = web.AppRunner(app, access_log=None, shutdown_timeout=1.0)
        await self._runner.setup()
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.bind(("127.0.0.1", 0))
        site = web.SockSite(self._runner, sock)
        await site.start()
        self.url = f"http://127.0.0.1:{sock.getsockname()[1]}"

    async def close(self) -> None:
        self._closing = True
        self._signal.fire()
        await self._stop_deliveries()
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    async def __aenter__(self) -> FakeTelegram:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    # ------------------------------------------------------------------ test helpers

    def add_chat(
        self,
        chat_id: int,
        chat_type: str = "private",
        *,
        title: str | None = None,
        first_name: str = "Ann",
        username: str | None = None,
        is_forum: bool = False,
    ) -> JSONDict:
        """Make a chat known (the bot can only talk in chats it has seen)."""
        chat = self._chats.get(chat_id)
        if chat is None:
            chat = {"id": chat_id, "type": chat_type}
            if chat_type == "private":
                chat["first_name"] = first_name
                if username:
                    chat["username"] = username
            else:
                chat["title"] = title or f"Group {chat_id}"
            self._chats[chat_id] = chat
        elif chat["type"] != chat_type:
            raise ValueError(f"chat {chat_id} is a {chat['type']}, not a {chat_type}")
        if is_forum and chat_type == "supergroup":
            chat["is_forum"] = True
        return chat

    def push_message(self, chat_id: int, user_id: int, text: str, **origin: Unpack[Origin]) -> int:
        """Queue a user's text message as an update; returns the update_id."""
        return self._push_user(chat_id, user_id, text, origin)

    def push_photo(
        self,
        chat_id: int,
        user_id: int,
        data: bytes,
        *,
        caption: str = "",
        **origin: Unpack[Origin],
    ) -> int:
        """Queue a user's photo: ``photo`` lists sizes smallest first, the largest is ``data``.

        The smaller sizes (90, 320 and 800 pixel boxes, those smaller than the photo)
        are JPEG copies made with Pillow; ``data`` must be an image Pillow opens.
        """
        try:
            image = _open_image(data)
        except ApiError as exc:
            raise ValueError(
                f"push_photo needs an image Telegram takes: {exc.description}"
            ) from None
        photo = self._store_photo(data, image, "photo.jpg")
        return self._push_user(chat_id, user_id, caption, origin, photo=photo)

    def push_voice(
        self,
        chat_id: int,
        user_id: int,
        data: bytes,
        *,
        duration: int = 3,
        mime_type: str = "audio/ogg",
        caption: str = "",
        declared_size: int | None = None,
        **origin: Unpack[Origin],
    ) -> int:
        """Queue a user's voice note.  ``declared_size``: the size Telegram reports, if bigger."""
        voice = self._store("voice", data, declared_size, duration=duration, mime_type=mime_type)
        return self._push_user(chat_id, user_id, caption, origin, media=voice)

    def push_audio(
        self,
        chat_id: int,
        user_id: int,
        data: bytes,
        *,
        file_name: str = "song.mp3",
        mime_type: str = "audio/mpeg",
        duration: int = 3,
        caption: str = "",
        declared_size: int | None = None,
        **origin: Unpack[Origin],
    ) -> int:
        """Queue a user's audio file (music)."""
        audio = self._store(
            "audio",
            data,
            declared_size,
            duration=duration,
            file_name=file_name,
            mime_type=mime_type,
        )
        return self._push_user(chat_id, user_id, caption, origin, media=audio)

    def push_video_note(
        self,
        chat_id: int,
        user_id: int,
        data: bytes,
        *,
        duration: int = 3,
        length: int = 240,
        declared_size: int | None = None,
        **origin: Unpack[Origin],
    ) -> int:
        """Queue a user's round video note (these have no caption)."""
        note = self._store("video_note", data, declared_size, duration=duration, length=length)
        return self._push_user(chat_id, user_id, "", origin, media=note)

    def push_document(
        self,
        chat_id: int,
        user_id: int,
        data: bytes,
        *,
        file_name: str,
        mime_type: str,
        caption: str = "",
        declared_size: int | None = None,
        **origin: Unpack[Origin],
    ) -> int:
        """Queue a user's document; ``data`` is kept as given (it may be large)."""
        document = self._store(
            "document", data, declared_size, file_name=file_name, mime_type=mime_type
        )
        return self._push_user(chat_id, user_id, caption, origin, document=document)

    def _push_user(
        self, chat_id: int, user_id: int, text: str, origin: Origin, **media: Any
    ) -> int:
        """Queue a user's message (``text`` is the caption when ``media`` is given)."""
        unknown = set(origin) - _ORIGIN_KEYS
        if unknown:
            raise TypeError(f"unexpected keyword arguments {sorted(unknown)}")
        first_name, username = origin.get("first_name", "Ann"), origin.get("username")
        thread_id = origin.get("thread_id")
        self.add_chat(
            chat_id,
            origin.get("chat_type", "private"),
            first_name=first_name,
            username=username,
            is_forum=thread_id is not None,
        )
        reply_to_message_id = origin.get("reply_to_message_id")
        if reply_to_message_id is not None:
            target = self._find(chat_id, reply_to_message_id)
            if target is None:
                raise ValueError(f"no message {reply_to_message_id} in chat {chat_id} to reply to")
            if thread_id is None:
                thread_id = target.thread_id
        quote = origin.get("quote")
        quoted: JSONDict | None = None
        if quote is not None:
            target = self._find(chat_id, reply_to_message_id) if reply_to_message_id else None
            if target is None or quote not in target.text:
                raise ValueError("a quote needs a reply to a message whose text holds it")
            quoted = {"text": quote, "position": target.text.index(quote), "is_manual": True}
        sender: JSONDict = {"id": user_id, "is_bot": False, "first_name": first_name}
        if username:
            sender["username"] = username
        sender["language_code"] = "en"
        message = self._new_message(
            chat_id,
            thread_id=thread_id,
            from_bot=False,
            sender=sender,
            text=text,
            raw_text=text,
            entities=auto_entities(text),
            reply_to_message_id=reply_to_message_id,
            forward_origin=origin.get("forward_origin"),
            quote=quoted,
            **media,
        )
        if self._private_to_others(message):
            return 0  # privacy mode: the bot never sees it
        return self._push_update({"message": self._message_json(message)})

    def _private_to_others(self, message: FakeMessage) -> bool:
        """Privacy mode (``can_read_all_group_messages`` false, BotFather's default): in a
        group the bot receives only commands (none for another bot), mentions of it and
        replies to its messages."""
        chat = self._chats[message.chat_id]
        if chat["type"] not in ("group", "supergroup") or self.me["can_read_all_group_messages"]:
            return False
        name = f"@{self.me['username']}".lower()
        text = message.text.lower()
        command = re.match(r"/\w+(@\w+)?", text)
        if command is not None:
            return command.group(1) not in (None, name)
        target = self._find(message.chat_id, message.reply_to_message_id or 0)
        return name not in text and not (target is not None and target.from_bot)

    def push_edit(self, chat_id: int, user_id: int, message_id: int, text: str) -> int:
        """Queue an ``edited_message`` update: the user changed the text of their message
        (Telegram lets only its sender edit it); returns the update_id."""
        message = self._find(chat_id, message_id)
        if message is None or message.from_bot or message.sender.get("id") != user_id:
            raise ValueError(f"user {user_id} has no message {message_id} in chat {chat_id}")
        message.text = message.raw_text = text
        message.entities = auto_entities(text)
        message.edit_date = int(time.time())
        message.history.append(text)
        if self._private_to_others(message):
            return 0
        return self._push_update({"edited_message": self._message_json(message)})

    def push_callback(
        self,
        chat_id: int,
        user_id: int,
        message_id: int,
        data: str,
        *,
        first_name: str = "Ann",
        forged: bool = False,
    ) -> str:
        """Queue a button press on a stored message; returns the callback query id.

        ``data`` must be on one of the message's buttons unless ``forged`` is true.
        """
        message = self._find(chat_id, message_id)
        if message is None:
            raise ValueError(f"no message {message_id} in chat {chat_id}")
        if not forged and data not in _callback_datas(message.reply_markup):
            raise ValueError(
                f"message {message_id} has no button with callback_data {data!r}; "
                f"it has {sorted(_callback_datas(message.reply_markup))}"
            )
        query_id = str(next(self._query_ids))
        self._open_queries.add(query_id)
        query = {
            "id": query_id,
            "from": {
                "id": user_id,
                "is_bot": False,
                "first_name": first_name,
                "language_code": "en",
            },
            "message": self._message_json(message),
            "chat_instance": str(abs(chat_id) * 7919 + 13),
            "data": data,
        }
        self._push_update({"callback_query": query})
        return query_id

    def redeliver_unconfirmed(self) -> None:
        """No-op, kept for readability in tests.

        Unconfirmed updates are never dropped: every ``getUpdates`` whose offset
        does not confirm them serves them again, as after a bot crash.
        """

    @property
    def pending_updates(self) -> list[int]:
        """Ids of updates not yet confirmed by an offset."""
        return [update["update_id"] for update in self._updates]

    def chat(self, chat_id: int, thread_id: int | None = None) -> list[FakeMessage]:
        """Messages currently shown in the chat (deleted ones left out), oldest first."""
        return [
            m
            for m in self._messages.get(chat_id, [])
            if not m.deleted and (thread_id is None or m.thread_id == thread_id)
        ]

    def message(self, chat_id: int, message_id: int) -> FakeMessage:
        found = self._find(chat_id, message_id, include_deleted=True)
        if found is None:
            raise KeyError(f"no message {message_id} in chat {chat_id}")
        return found

    def bot_texts(self, chat_id: int, thread_id: int | None = None) -> list[str]:
        """Visible texts (captions for media) of the bot's messages, oldest first."""
        return [m.text for m in self.chat(chat_id, thread_id) if m.from_bot]

    def draft_of(self, chat_id: int) -> str | None:
        """The draft text the chat shows now (:data:`DRAFT_PLACEHOLDER` for an empty draft),
        or None: no draft, the last one expired (:data:`DRAFT_TTL`) or a message replaced it."""
        draft = self._shown_drafts.get(chat_id)
        if draft is None or time.monotonic() - draft.time >= DRAFT_TTL:
            return None
        return draft.text

    def drafts_in(self, chat_id: int) -> list[Draft]:
        """The accepted drafts of one chat, oldest first."""
        return [d for d in self.drafts if d.chat_id == chat_id]

    def uploads(self, chat_id: int, thread_id: int | None = None) -> list[Upload]:
        """Photos and documents the bot sent to the chat (deleted ones left out), oldest first."""
        found: list[Upload] = []
        for m in self.chat(chat_id, thread_id):
            sent = m.photo[-1] if m.photo else m.document
            if m.from_bot and sent is not None:
                found.append(
                    Upload(sent.kind, sent.file_name, sent.data, m.text, m.thread_id, m.message_id)
                )
        return found

    def downloads(self, file_id: str) -> int:
        """How many times the file's bytes were served (``KeyError`` for an unknown id)."""
        return self._files[file_id].downloads

    @property
    def commands(self) -> list[JSONDict]:
        """Commands set for the default scope and language."""
        return self._commands.get(self._commands_key({}), [])

    def calls_to(self, method: str) -> list[Call]:
        return [call for call in self.calls if call.method.lower() == method.lower()]

    @property
    def webhook(self) -> JSONDict | None:
        """The webhook as set (url, secret_token, allowed_updates, max_connections), or None."""
        return dict(self._webhook) if self._webhook is not None else None

    @property
    def delivering(self) -> bool:
        """The webhook's deliverer runs (from ``setWebhook`` until ``deleteWebhook`` or
        ``close`` stopped it): no update is posted anywhere while this is false."""
        return self._webhook_task is not None and not self._webhook_task.done()

    @property
    def webhook_targets(self) -> list[str] | None:
        """Where deliveries go in turn (a load balancer); None: the webhook's URL."""
        return self._webhook_targets

    @webhook_targets.setter
    def webhook_targets(self, targets: list[str] | None) -> None:
        self._webhook_targets = list(targets) if targets is not None else None
        self._signal.fire()  # held deliveries may go now

    def lose_webhook_answers(self, times: int = 1) -> None:
        """The next ``times`` deliveries reach their target, but their answer is lost on
        the way back (as when a proxy times out): each counts as failed and the update
        is delivered again."""
        self._lost_answers += times

    def max_edit_rate(self, chat_id: int) -> int:
        """Most edit requests to the chat seen within any one-second window."""
        times = sorted(self._edit_times.get(chat_id, []))
        best = left = 0
        for right, moment in enumerate(times):
            while moment - times[left] >= 1.0:
                left += 1
            best = max(best, right - left + 1)
        return best

    async def wait_for(self, predicate: Callable[[], bool], timeout: float = 5.0) -> None:
        """Wait until ``predicate()`` holds; it is re-checked after every API call."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while True:
            event = self._signal.current()
            if predicate():
                return
            remaining = deadline - loop.time()
            if remaining <= 0:
                raise AssertionError(f"condition not met within {timeout}s\n{self.dump()}")
            await _wait_event(event, remaining)

    def dump(self) -> str:
        """A readable summary of recent calls and every chat, for failure messages."""
        lines = ["last API calls:"]
        for call in self.calls[-25:]:
            note = f" {call.description}" if call.description else ""
            lines.append(
                f"  {call.method} -> {call.status or 'pending'}{note} {_short(call.params)}"
            )
        lines.append(f"unconfirmed updates: {self.pending_updates}")
        if self._webhook is not None:
            lines.append(f"webhook: {self._webhook['url']} targets={self._webhook_targets}")
        for d in self.deliveries[-10:]:
            lines.append(f"  delivery {d.update_id} -> {d.url}: {d.status} {d.error or ''}")
        for error in self.internal_errors:
            lines.append(f"FAKE SERVER ERROR: {error!r}")
        for draft in self.drafts[-10:]:
            lines.append(
                f"  draft {draft.draft_id} in chat {draft.chat_id}: {_short(draft.text, 100)}"
            )
        for chat_id, messages in self._messages.items():
            lines.append(f"chat {chat_id}:")
            for m in messages:
                who = "bot" if m.from_bot else "user"
                flags = " (deleted)" if m.deleted else ""
                thread = f" [thread {m.thread_id}]" if m.thread_id is not None else ""
                kind = f"[{m.files[0].kind}] " if m.files else ""
                lines.append(f"  #{m.message_id} {who}{thread}{flags}: {kind}{_short(m.text, 100)}")
        return "\n".join(lines)

    # ------------------------------------------------------------------ HTTP plumbing

    async def _handle(self, request: web.Request) -> web.Response:
        name = request.match_info["method"]
        entry = self._methods.get(name.lower())
        call = Call(method=entry[0] if entry else name, params={}, time=time.monotonic())
        self.calls.append(call)
        try:
            if request.match_info["token"] != self.token:
                raise ApiError(401, "Unauthorized")
            raw = await _read_params(request)
            call.params = raw
            known = telegram_spec.method_name(name)
            if known is None or entry is None:  # a method this server does not serve
                raise ApiError(404, "Not Found")
            try:
                call.params = telegram_spec.check_call(known, raw)
            except telegram_spec.SpecError as exc:
                raise ApiError(exc.status, exc.description) from None
            result = await entry[1](call.params)
        except ApiError as exc:
            call.status, call.description = exc.status, exc.description
            body = exc.body()
        except Exception as exc:
            self.internal_errors.append(exc)
            call.status, call.description = 500, f"Internal Server Error: fake failed: {exc!r}"
            body = {"ok": False, "error_code": 500, "description": call.description}
        else:
            call.status, call.result = 200, result
            body = {"ok": True, "result": result}
        self._signal.fire()
        return web.json_response(body, status=call.status)

    async def _download(self, request: web.Request) -> web.StreamResponse:
        """Serve a file by the ``file_path`` getFile gave, in chunks, with Content-Length."""
        if request.match_info["token"] != self.token:
            return web.json_response(ApiError(401, "Unauthorized").body(), status=401)
        stored = self._paths.get(request.match_info["path"])
        if stored is None:
            return web.json_response(ApiError(404, "Not Found").body(), status=404)
        response = web.StreamResponse(headers={"Content-Type": "application/octet-stream"})
        response.content_length = len(stored.data)
        await response.prepare(request)
        view = memoryview(stored.data)
        for start in range(0, len(view), DOWNLOAD_CHUNK):
            await response.write(view[start : start + DOWNLOAD_CHUNK])
        await response.write_eof()
        stored.downloads += 1
        self._signal.fire()
        return response

    def _push_update(self, payload: JSONDict) -> int:
        update_id = next(self._update_ids)
        self._updates.append({"update_id": update_id, **payload})
        self._signal.fire()
        return update_id

    # ------------------------------------------------------------------ state helpers

    def _chat_id(self, params: JSONDict) -> int:
        value = params.get("chat_id")
        if value is None or value == "":
            raise bad_request("chat_id is empty")
        if not isinstance(value, int) or value not in self._chats:
            raise bad_request("chat not found")
        return value

    def _find(
        self, chat_id: int, message_id: int, *, include_deleted: bool = False
    ) -> FakeMessage | None:
        for message in self._messages.get(chat_id, []):
            if message.message_id == message_id and (include_deleted or not message.deleted):
                return message
        return None

    def _new_message(self, chat_id: int, **fields: Any) -> FakeMessage:
        message_id = self._next_message_id.get(chat_id, 1)
        self._next_message_id[chat_id] = message_id + 1
        message = FakeMessage(
            message_id=message_id, chat_id=chat_id, date=int(time.time()), **fields
        )
        message.history.append(message.text)
        self._messages.setdefault(chat_id, []).append(message)
        return message

    def _bot_message(self, chat_id: int, params: JSONDict, **fields: Any) -> FakeMessage:
        thread_id, reply_to = self._placement(chat_id, params)
        self._shown_drafts.pop(chat_id, None)  # the client replaces the draft by the message
        return self._new_message(
            chat_id,
            thread_id=thread_id,
            from_bot=True,
            sender={k: self.me[k] for k in ("id", "is_bot", "first_name", "username")},
            reply_to_message_id=reply_to,
            **fields,
        )

    def _placement(self, chat_id: int, params: JSONDict) -> tuple[int | None, int | None]:
        """Thread and reply target of a message the bot sends."""
        thread_id = params.get("message_thread_id")
        if thread_id is not None:
            chat = self._chats[chat_id]
            if not isinstance(thread_id, int) or not (
                chat.get("is_forum") or chat["type"] == "private"
            ):
                raise bad_request("message thread not found")
        reply = params.get("reply_parameters") or {}
        if not isinstance(reply, dict):
            raise bad_request("can't parse reply parameters JSON object")
        reply_to = reply.get("message_id", params.get("reply_to_message_id"))
        if reply_to is None:
            return thread_id, None
        target = self._find(chat_id, reply_to) if isinstance(reply_to, int) else None
        if target is None:
            allow = reply.get(
                "allow_sending_without_reply", params.get("allow_sending_without_reply")
            )
            if not allow:
                raise bad_request("message to be replied not found")
            return thread_id, None
        return (thread_id if thread_id is not None else target.thread_id), reply_to

    def _message_json(self, message: FakeMessage, *, with_reply: bool = True) -> JSONDict:
        chat = self._chats[message.chat_id]
        out: JSONDict = {
            "message_id": message.message_id,
            "from": message.sender,
            "chat": chat,
            "date": message.date,
        }
        if message.thread_id is not None:
            out["message_thread_id"] = message.thread_id
            if chat.get("is_forum") or chat["type"] == "private":
                out["is_topic_message"] = True
        if with_reply:
            reply = self._reply_json(message, chat)
            if reply is not None:
                out["reply_to_message"] = reply
        extras = {"edit_date": message.edit_date, "forward_origin": message.forward_origin,
                  "quote": message.quote if with_reply else None}
        out.update({key: value for key, value in extras.items() if value is not None})
        if message.photo:
            out["photo"] = [size.as_json() for size in message.photo]
        single = message.document or message.media
        if single is not None:
            out[single.kind] = single.as_json()
        media = bool(message.files)
        text_key, entities_key = ("caption", "caption_entities") if media else ("text", "entities")
        if message.text or not media:
            out[text_key] = message.text
        if message.entities:
            out[entities_key] = message.entities
        if message.reply_markup and "inline_keyboard" in message.reply_markup:
            out["reply_markup"] = message.reply_markup
        return out

    def _reply_json(self, message: FakeMessage, chat: JSONDict) -> JSONDict | None:
        if message.reply_to_message_id is not None:
            target = self._find(message.chat_id, message.reply_to_message_id)
            return None if target is None else self._message_json(target, with_reply=False)
        if message.thread_id is None or not chat.get("is_forum"):
            return None
        return {
            "message_id": message.thread_id,
            "from": message.sender,
            "chat": chat,
            "date": message.date,
            "message_thread_id": message.thread_id,
            "forum_topic_created": {"name": f"Topic {message.thread_id}", "icon_color": 7322096},
            "is_topic_message": True,
        }

    # ------------------------------------------------------------------ flood control

    def _too_many(self, chat_id: int, method: str, seconds: float) -> ApiError:
        wait = max(1, math.ceil(seconds))
        self.rate_limited.append((chat_id, method))
        return ApiError(429, f"Too Many Requests: retry after {wait}", {"retry_after": wait})

    def _check_hold(self, chat_id: int, method: str) -> None:
        remaining = self._hold_until.get(chat_id, 0.0) - time.monotonic()
        if self.flood and remaining > 0:
            raise self._too_many(chat_id, method, remaining)

    def _count(
        self, chat_id: int, method: str, kind: str | None = None, interval: float = 0.0
    ) -> None:
        """Count an accepted-so-far request in its kind's stream (none when ``kind`` is
        None or ``interval`` is 0) and in the chat's :data:`CHAT_STREAM` (when
        ``chat_interval`` is on); 429 and a hold when either overflows, counting in neither."""
        if not self.flood:
            return
        streams = ((kind, interval), (CHAT_STREAM, self.chat_interval))
        now = time.monotonic()
        accepted: list[tuple[_Flood, int]] = []
        for name, every in streams:
            if name is None or every <= 0:
                continue
            state = self._flood_state.setdefault((chat_id, name), _Flood())
            streak = state.next_streak(now, every)
            if streak > self.burst:
                state.streak = 0
                self._hold_until[chat_id] = now + self.retry_after
                raise self._too_many(chat_id, method, self.retry_after)
            accepted.append((state, streak))
        for state, streak in accepted:
            state.streak, state.last = streak, now

    def _editable(self, params: JSONDict, method: str) -> FakeMessage:
        if params.get("inline_message_id"):
            raise bad_request("inline messages are not supported by this fake")
        chat_id = self._chat_id(params)
        self._edit_times.setdefault(chat_id, []).append(time.monotonic())
        self._check_hold(chat_id, method)
        message = self._find(chat_id, _require_int(params, "message_id"))
        if message is None:
            raise bad_request("message to edit not found")
        if not message.from_bot:
            raise bad_request("message can't be edited")
        return message

    # ------------------------------------------------------------------ API methods

    async def _get_me(self, params: JSONDict) -> JSONDict:
        return self.me

    async def _set_webhook(self, params: JSONDict) -> bool:
        url = str(params.get("url") or "")
        if not url:  # "Use an empty string to remove webhook integration"
            return await self._delete_webhook(params)
        parts = urlsplit(url)
        try:
            port = parts.port
        except ValueError:
            raise bad_request("bad webhook: invalid URL port") from None
        local = parts.scheme == "http" and parts.hostname in LOOPBACK_HOSTS
        if not local and (parts.scheme != "https" or not parts.hostname):
            raise bad_request("bad webhook: An HTTPS URL must be provided for webhook")
        if not local and (port or 443) not in WEBHOOK_PORTS:
            raise bad_request(
                "bad webhook: Webhook can be set up only on ports 80, 88, 443 or 8443"
            )
        secret = params.get("secret_token")
        if secret not in (None, "") and not _SECRET_TOKEN.fullmatch(str(secret)):
            raise bad_request("secret token contains unallowed characters")
        allowed = params.get("allowed_updates")
        if allowed is not None and not (
            isinstance(allowed, list) and all(isinstance(a, str) for a in allowed)
        ):
            raise bad_request("can't parse allowed updates JSON object")
        if allowed is not None:
            self._allowed_updates = list(allowed) or None
        if params.get("drop_pending_updates"):
            self._updates.clear()
        if self._webhook is None or self._webhook["url"] != url:
            self._webhook_error = None
        self._webhook = {
            "url": url,
            "secret_token": str(secret) if secret else None,
            "allowed_updates": self._allowed_updates,
            "max_connections": params.get("max_connections") or 40,
        }
        if self._webhook_task is None or self._webhook_task.done():
            self._webhook_task = asyncio.get_running_loop().create_task(self._deliver())
        self._signal.fire()  # a long poll still waiting gets its 409
        return True

    async def _delete_webhook(self, params: JSONDict) -> bool:
        if params.get("drop_pending_updates"):
            self._updates.clear()
        if self._webhook is not None:
            self._webhook, self._webhook_error = None, None
            await self._stop_deliveries()
        return True

    async def _get_webhook_info(self, params: JSONDict) -> JSONDict:
        info: JSONDict = {
            "url": self._webhook["url"] if self._webhook else "",
            "has_custom_certificate": False,
            "pending_update_count": len(self._updates),
        }
        if self._webhook is not None:
            info["max_connections"] = self._webhook["max_connections"]
            if self._webhook["allowed_updates"]:
                info["allowed_updates"] = self._webhook["allowed_updates"]
        if self._webhook_error is not None:
            info["last_error_date"], info["last_error_message"] = self._webhook_error
        return info

    # ------------------------------------------------------------------ webhook delivery

    async def _stop_deliveries(self) -> None:
        task, self._webhook_task = self._webhook_task, None
        if task is not None and task is not asyncio.current_task():
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)

    def _next_target(self) -> str | None:
        assert self._webhook is not None
        targets = self._webhook_targets
        if targets is None:
            return str(self._webhook["url"])
        if not targets:
            return None
        self._target_turn += 1
        return targets[(self._target_turn - 1) % len(targets)]

    def _next_delivery(self) -> JSONDict | None:
        """The oldest queued update of an allowed type; older ones of other types go."""
        allowed = self._allowed_updates
        while self._updates:
            update = self._updates[0]
            if not allowed or any(kind in update for kind in allowed):
                return update
            self._updates.pop(0)  # Telegram does not keep what the bot did not ask for
        return None

    async def _deliver(self) -> None:
        """Deliver queued updates to the webhook one at a time, in order, until it is
        deleted or the fake closes; a failed one is retried after a growing pause."""
        first, longest = self.webhook_retry
        pause = first
        timeout = aiohttp.ClientTimeout(total=self.webhook_timeout)
        async with aiohttp.ClientSession(timeout=timeout) as session:
            while self._webhook is not None and not self._closing:
                event = self._signal.current()
                update = self._next_delivery()
                target = self._next_target() if update is not None else None
                if update is None or target is None:
                    await _wait_event(event, 1.0)
                    continue
                if await self._post_update(session, target, update):
                    pause = first
                    if self._updates and self._updates[0] is update:
                        self._updates.pop(0)
                else:
                    await asyncio.sleep(pause)
                    pause = min(pause * 2, longest)
                self._signal.fire()

    async def _post_update(
        self, session: aiohttp.ClientSession, url: str, update: JSONDict
    ) -> bool:
        assert self._webhook is not None
        headers = {"Content-Type": "application/json"}
        if self._webhook["secret_token"]:
            headers[SECRET_HEADER] = self._webhook["secret_token"]
        status, error = 0, None
        try:
            async with session.post(
                url, data=json.dumps(update), headers=headers, allow_redirects=False
            ) as response:
                status = response.status
                await response.read()
        except TimeoutError:
            error = "Read timeout expired"
        except aiohttp.ClientConnectorError:
            error = "Connection refused"
        except aiohttp.ClientError as exc:
            error = f"Connection failed: {type(exc).__name__}"
        if error is None and not 200 <= status < 300:
            try:
                phrase = HTTPStatus(status).phrase
            except ValueError:
                phrase = "Unknown"
            error = f"Wrong response from the webhook: {status} {phrase}"
        if error is None and self._lost_answers > 0:
            self._lost_answers -= 1
            error = "Read timeout expired"
        self.deliveries.append(Delivery(update["update_id"], url, status, error, time.monotonic()))
        if error is not None:
            self._webhook_error = (int(time.time()), error)
        return error is None

    def _confirm(self, offset: int) -> None:
        if offset > 0:
            self._updates = [u for u in self._updates if u["update_id"] >= offset]
        elif offset < 0:
            self._updates = self._updates[offset:]

    def _deliverable(self, limit: int) -> list[JSONDict]:
        allowed = self._allowed_updates
        ready = [u for u in self._updates if not allowed or any(k in u for k in allowed)]
        return ready[:limit]

    async def _get_updates(self, params: JSONDict) -> list[JSONDict]:
        offset = params.get("offset") or 0
        limit = params.get("limit", 100)
        timeout = params.get("timeout") or 0
        if not isinstance(offset, int) or not isinstance(timeout, int | float):
            raise bad_request("offset must be an integer and timeout a number")
        if not isinstance(limit, int) or not 1 <= limit <= 100:
            raise bad_request("limit must be between 1 and 100")
        if self._webhook is not None:
            raise ApiError(409, WEBHOOK_CONFLICT)
        if "allowed_updates" in params:
            self._allowed_updates = list(params["allowed_updates"] or []) or None
        self._confirm(offset)
        self._poll_generation += 1
        generation = self._poll_generation
        self._signal.fire()  # an older long poll still waiting wakes up and gets 409
        loop = asyncio.get_running_loop()
        deadline = loop.time() + max(float(timeout), 0.0)
        while True:
            event = self._signal.current()
            if generation != self._poll_generation:
                raise ApiError(409, CONFLICT)
            if self._webhook is not None:
                raise ApiError(409, WEBHOOK_CONFLICT)
            ready = self._deliverable(limit)
            remaining = deadline - loop.time()
            if ready or remaining <= 0 or self._closing:
                return ready
            await _wait_event(event, remaining)

    async def _send_message(self, params: JSONDict) -> JSONDict:
        chat_id = self._chat_id(params)
        self._check_hold(chat_id, "sendMessage")
        visible, entities = parse_text(
            str(params.get("text", "")), params.get("parse_mode"), params.get("entities")
        )
        if not visible:
            raise bad_request("message text is empty")
        if len(visible) > MAX_TEXT:
            raise bad_request("message is too long")
        markup = check_markup(params.get("reply_markup"), inline_only=False)
        self._placement(chat_id, params)  # validate before counting towards flood control
        self._count(chat_id, "sendMessage", "send", self.send_interval)
        message = self._bot_message(
            chat_id,
            params,
            text=visible,
            raw_text=str(params.get("text", "")),
            parse_mode=params.get("parse_mode"),
            entities=entities,
            reply_markup=markup,
        )
        return self._message_json(message)

    async def _edit_message_text(self, params: JSONDict) -> JSONDict:
        message = self._editable(params, "editMessageText")
        if message.files:
            raise bad_request("there is no text in the message to edit")
        raw = str(params.get("text", ""))
        visible, entities = parse_text(raw, params.get("parse_mode"), params.get("entities"))
        if not visible:
            raise bad_request("message text is empty")
        if len(visible) > MAX_TEXT:
            raise bad_request("message is too long")
        markup = check_markup(params.get("reply_markup"), inline_only=True)
        if (visible, entities, markup) == (message.text, message.entities, message.reply_markup):
            raise bad_request(NOT_MODIFIED)
        self._count(message.chat_id, "editMessageText", "edit", self.edit_interval)
        message.text, message.raw_text, message.entities = visible, raw, entities
        message.parse_mode = params.get("parse_mode")
        message.reply_markup = markup
        message.history.append(visible)
        self._mark_edited(message)
        return self._message_json(message)

    async def _edit_message_reply_markup(self, params: JSONDict) -> JSONDict:
        message = self._editable(params, "editMessageReplyMarkup")
        markup = check_markup(params.get("reply_markup"), inline_only=True)
        if markup == message.reply_markup:
            raise bad_request(NOT_MODIFIED)
        self._count(message.chat_id, "editMessageReplyMarkup", "edit", self.edit_interval)
        message.reply_markup = markup
        self._mark_edited(message)
        return self._message_json(message)

    @staticmethod
    def _mark_edited(message: FakeMessage) -> None:
        message.edits += 1
        message.edit_date = int(time.time())

    async def _delete_message(self, params: JSONDict) -> bool:
        chat_id = self._chat_id(params)
        message = self._find(chat_id, _require_int(params, "message_id"))
        if message is None:
            raise bad_request("message to delete not found")
        message.deleted = True
        return True

    async def _answer_callback_query(self, params: JSONDict) -> bool:
        query_id = str(params.get("callback_query_id") or "")
        if query_id not in self._open_queries:
            raise bad_request(QUERY_TOO_OLD)
        text = params.get("text")
        if text is not None and len(str(text)) > MAX_CALLBACK_ANSWER:
            raise bad_request("MESSAGE_TOO_LONG")
        self._open_queries.discard(query_id)
        self.callback_answers[query_id] = {
            "text": text,
            "show_alert": bool(params.get("show_alert", False)),
            "url": params.get("url"),
            "cache_time": params.get("cache_time"),
            "time": time.monotonic(),
        }
        return True

    async def _send_chat_action(self, params: JSONDict) -> bool:
        chat_id = self._chat_id(params)
        action = params.get("action")
        if action not in CHAT_ACTIONS:
            raise bad_request("wrong parameter action in request")
        self.chat_actions.append((chat_id, str(action), time.monotonic()))
        return True

    def _store(
        self, kind: str, data: bytes, declared_size: int | None = None, **fields: Any
    ) -> FakeFile:
        """Add a file to the store (``data`` is kept, not copied)."""
        if declared_size is not None and declared_size < len(data):
            raise ValueError(f"declared_size {declared_size} is below the {len(data)} bytes given")
        number = next(self._file_ids)
        stored = FakeFile(
            kind=kind,
            file_id=f"{FILE_KINDS[kind].id_prefix}{number:06d}",
            file_unique_id=f"AgAD{number:06d}",
            data=data,
            size=len(data) if declared_size is None else declared_size,
            **fields,
        )
        self._files[stored.file_id] = stored
        return stored

    def _store_photo(self, data: bytes, image: Image.Image, file_name: str) -> list[FakeFile]:
        """The sizes of a photo, smallest first: JPEG thumbnails, then ``data`` itself."""
        width, height = image.size
        photo: list[FakeFile] = []
        for box in PHOTO_THUMBS:
            if max(width, height) > box:
                thumb, w, h = _jpeg_thumbnail(image, box)
                photo.append(self._store("photo", thumb, width=w, height=h))
        photo.append(self._store("photo", data, width=width, height=height, file_name=file_name))
        for size in photo:
            self._photos[size.file_id] = photo
        return photo

    def _upload_from(self, params: JSONDict, kind: str) -> UploadedFile | FakeFile:
        """The new upload, or the stored file a file_id names, in the ``kind`` parameter."""
        value = params.get(kind)
        if isinstance(value, str) and value.startswith("attach://"):
            value = params.get(value.removeprefix("attach://"))
        if isinstance(value, str):
            known = self._files.get(value)
            if known is None:
                raise bad_request("wrong file identifier/HTTP URL specified")
            if known.kind != kind:
                have, want = FILE_KINDS[known.kind].title, FILE_KINDS[kind].title
                raise bad_request(f"can't use file of type {have} as {want}")
            return known
        if not isinstance(value, UploadedFile):
            raise bad_request(f"there is no {kind} in the request")
        if not value.data:
            raise bad_request("file must be non-empty")
        if len(value.data) > MAX_UPLOAD:
            raise ApiError(413, TOO_LARGE)
        return value

    def _document_from(self, params: JSONDict) -> FakeFile:
        upload = self._upload_from(params, "document")
        if isinstance(upload, FakeFile):
            return upload
        return self._store(
            "document",
            upload.data,
            file_name=upload.filename or "document",
            mime_type=upload.content_type or "application/octet-stream",
        )

    def _photo_from(self, params: JSONDict) -> list[FakeFile]:
        upload = self._upload_from(params, "photo")
        if isinstance(upload, FakeFile):
            return self._photos[upload.file_id]
        if len(upload.data) > MAX_PHOTO:
            raise bad_request(
                f"file of size {len(upload.data)} bytes is too big for a photo; "
                f"the maximum size is {MAX_PHOTO} bytes"
            )
        image = _open_image(upload.data)
        return self._store_photo(upload.data, image, upload.filename or "photo")

    async def _send_document(self, params: JSONDict) -> JSONDict:
        chat_id = self._chat_id(params)
        self._check_hold(chat_id, "sendDocument")
        return self._send_media(
            chat_id, params, "sendDocument", document=self._document_from(params)
        )

    async def _send_photo(self, params: JSONDict) -> JSONDict:
        chat_id = self._chat_id(params)
        self._check_hold(chat_id, "sendPhoto")
        return self._send_media(chat_id, params, "sendPhoto", photo=self._photo_from(params))

    def _send_media(self, chat_id: int, params: JSONDict, method: str, **media: Any) -> JSONDict:
        caption = str(params.get("caption") or "")
        visible, entities = parse_text(
            caption, params.get("parse_mode"), params.get("caption_entities")
        )
        if len(visible) > MAX_CAPTION:
            raise bad_request("message caption is too long")
        markup = check_markup(params.get("reply_markup"), inline_only=False)
        self._placement(chat_id, params)
        self._count(chat_id, method, "send", self.send_interval)
        message = self._bot_message(
            chat_id,
            params,
            text=visible,
            raw_text=caption,
            parse_mode=params.get("parse_mode"),
            entities=entities,
            reply_markup=markup,
            **media,
        )
        return self._message_json(message)

    async def _get_file(self, params: JSONDict) -> JSONDict:
        stored = self._files.get(str(params.get("file_id") or ""))
        if stored is None:
            raise bad_request("invalid file_id")
        if stored.size > MAX_DOWNLOAD:
            raise bad_request("file is too big")
        if stored.file_path is None:
            stored.file_path = self._file_path(stored)
            self._paths[stored.file_path] = stored
        return {
            "file_id": stored.file_id,
            "file_unique_id": stored.file_unique_id,
            "file_size": stored.size,
            "file_path": stored.file_path,
        }

    def _file_path(self, stored: FakeFile) -> str:
        kind = FILE_KINDS[stored.kind]
        suffix = PurePosixPath(stored.file_name).suffix if kind.named else ""
        return f"{kind.folder}/file_{next(self._path_ids)}{suffix or kind.extension}"

    @staticmethod
    def _commands_key(params: JSONDict) -> str:
        scope = params.get("scope") or {"type": "default"}
        return json.dumps([scope, params.get("language_code") or ""], sort_keys=True)

    async def _set_my_commands(self, params: JSONDict) -> bool:
        commands = params.get("commands")
        if not isinstance(commands, list):
            raise bad_request("can't parse commands JSON object")
        if len(commands) > 100:
            raise bad_request("BOT_COMMANDS_TOO_MUCH")
        for command in commands:
            name = command.get("command") if isinstance(command, dict) else None
            if not isinstance(name, str) or not re.fullmatch(r"[a-z0-9_]{1,32}", name):
                raise bad_request("BOT_COMMAND_INVALID")
            description = command.get("description")
            if not isinstance(description, str) or not 1 <= len(description.strip()) <= 256:
                raise bad_request("BOT_COMMAND_DESCRIPTION_INVALID")
        self._commands[self._commands_key(params)] = [dict(c) for c in commands]
        return True

    async def _get_my_commands(self, params: JSONDict) -> list[JSONDict]:
        return self._commands.get(self._commands_key(params), [])

    async def _delete_my_commands(self, params: JSONDict) -> bool:
        self._commands.pop(self._commands_key(params), None)
        return True

    async def _set_message_reaction(self, params: JSONDict) -> bool:
        chat_id = self._chat_id(params)
        message = self._find(chat_id, _require_int(params, "message_id"))
        if message is None:
            raise bad_request("message to react not found")
        reaction = params.get("reaction") or []
        if not isinstance(reaction, list) or len(reaction) > 1:
            raise bad_request("REACTIONS_TOO_MANY")
        for item in reaction:
            if not isinstance(item, dict) or item.get("type") not in ("emoji", "custom_emoji"):
                raise bad_request("REACTION_INVALID")
            emoji = str(item.get("emoji", "")).replace("\ufe0f", "")
            if item["type"] == "emoji" and emoji not in REACTION_EMOJI:
                raise bad_request("REACTION_INVALID")
        if self.chat_interval > 0:
            self._check_hold(chat_id, "setMessageReaction")
            self._count(chat_id, "setMessageReaction")
        message.reactions = list(reaction)
        self.reactions.append((chat_id, message.message_id, list(reaction)))
        return True

    async def _send_message_draft(self, params: JSONDict) -> bool:
        if self.refuse_drafts:
            raise bad_request(DRAFTS_UNAVAILABLE)
        chat_id = self._chat_id(params)
        if self._chats[chat_id]["type"] != "private":
            raise bad_request(DRAFT_PEER_INVALID)
        self._check_hold(chat_id, "sendMessageDraft")
        draft_id = _require_int(params, "draft_id")
        if draft_id == 0:
            raise bad_request("draft_id must be non-zero")
        raw = params.get("text")
        visible, entities = parse_text(
            "" if raw is None else str(raw), params.get("parse_mode"), params.get("entities")
        )
        if len(visible) > MAX_TEXT:
            raise bad_request("text is too long")
        thread_id = params.get("message_thread_id")
        if thread_id is not None and not isinstance(thread_id, int):
            raise bad_request("message thread not found")
        self._count(chat_id, "sendMessageDraft")
        draft = Draft(
            chat_id,
            draft_id,
            visible or DRAFT_PLACEHOLDER,
            time.monotonic(),
            thread_id,
            tuple(entities),
        )
        self.drafts.append(draft)
        self._shown_drafts[chat_id] = draft
        return True
