"""A strict, in-process fake of Slack for tests.

One aiohttp server on 127.0.0.1 (random port) plays these roles:

* the Web API (``POST``/``GET /api/{method}``) that the real ``AsyncWebClient`` talks to
  when built with ``base_url=f"{fake.url}/api/"``;
* the Socket Mode WebSocket (``GET /socket?ticket=N``) handed out by ``apps.connections.open``;
* ``response_url`` endpoints (``POST /response/{token}``) for interactive payloads;
* Slack's file hosts: ``GET /files-pri/{TEAM}-{FILE}/{name}`` (``url_private``) and
  ``.../download/{name}`` (``url_private_download``) serve a file only to
  ``Authorization: Bearer <bot token>`` with ``files:read`` (anyone else gets Slack's HTML
  sign-in page, HTTP 200), and ``POST /upload/v1/{ticket}`` takes the bytes of an external
  upload (``files.getUploadURLExternal`` -> POST -> ``files.completeUploadExternal``, what
  ``AsyncWebClient.files_upload_v2`` does).

It also acts as Slack's HTTP-mode event sender (``post_event`` / ``post_action``): it signs
requests with a signing secret and POSTs them to the bot's own endpoint.

Limits follow the real service: 40,000-character ``text``, at most 50 blocks, 3,000-character
section text, 2,000-character button values, 255-character ``action_id`` and per-channel rate
limits on ``chat.postMessage`` / ``chat.update`` (HTTP 429 + ``Retry-After``). The bot token
carries ``scopes`` (every Web API answer names them in ``x-oauth-scopes``); the files methods
refuse a token without the scope they need (``missing_scope``).

Streaming (``chat.startStream`` / ``chat.appendStream`` / ``chat.stopStream``, what
``AsyncWebClient.chat_stream()`` drives), with the real method's error codes:

* ``chat.startStream`` needs ``channel`` and ``thread_ts`` (streams are always replies;
  missing: ``invalid_arguments``). Outside a DM (a channel id not starting with ``D``) it
  needs ``recipient_team_id`` and ``recipient_user_id`` (``missing_recipient_team_id`` /
  ``missing_recipient_user_id``); a recipient user the fake does not know is
  ``user_not_found``. It posts a bot reply in the thread, in streaming state, and answers
  ``{"channel", "ts"}``. Its rate limit is chat.postMessage's (``post_interval``), in its
  own bucket. ``refuse_streams = True`` makes it answer ``channel_type_not_supported``
  (:data:`STREAM_REFUSED`; a string picks another error code), as where streaming is not
  available, so the bot must fall back to chat.postMessage + chat.update.
* Content is ``markdown_text`` (at most 12,000 characters, else ``invalid_arguments``) or
  ``chunks`` (a list, or its JSON string, of ``markdown_text`` / ``task_update`` /
  ``plan_update`` / ``blocks`` chunks, else ``invalid_chunks``), never both in one call
  (``cannot_provide_both_markdown_text_and_chunks``), and one stream keeps to the kind it
  started with (``streaming_mode_mismatch``). Markdown is appended to the message's text,
  at most 40,000 characters in all (``msg_too_long``).
* ``chat.appendStream`` needs content (``markdown_text_or_chunks_required``); each call's
  text is in :attr:`FakeSlackMessage.appends`. Its own per-channel bucket refills one call
  per ``append_interval`` (default 0.1 s, permissive: Slack's is Tier 4) up to ``burst``.
* ``chat.stopStream`` may add content, ``blocks`` (validated like chat.postMessage's,
  shown after the text) and ``metadata``; it is not rate limited by the fake.
* Appending to or stopping a message that is not streaming (a plain bot message, or a
  stream already stopped or timed out) is ``message_not_in_streaming_state``; a user's
  message is ``message_not_owned_by_app``; after :meth:`FakeSlackServer.stop_stream_by_user`
  appends get ``stopped_by_user``. A stream open longer than ``stream_timeout`` (default
  300 s, from its start) counts as stopped. ``chat.update`` on a streaming message is
  ``cant_update_message`` (the fake's choice); once stopped it is an ordinary bot message.
* ``bot_texts`` shows a streamed message as its markdown then its stop blocks' text.

AI assistant threads: ``assistant.threads.setStatus`` (``channel_id``, ``thread_ts``,
``status`` required; ``""`` clears; ``loading_messages`` at most 10 strings) and
``assistant.threads.setSuggestedPrompts`` (``channel_id``; optional ``thread_ts`` and
``title``; ``prompts``: 1-4 ``{"title", "message"}``) need the ``assistant:write`` scope,
which the token has only when the fake is built with ``assistant=True`` (or a test adds it
to :attr:`FakeSlackServer.scopes`); without it: ``missing_scope``. When ``assistant`` is
false (the app has no agent/assistant surface) both answer ``not_agent_app``. A malformed
``thread_ts`` is ``invalid_thread_ts``; bad arguments are ``invalid_arguments``. Statuses go
to :attr:`FakeSlackServer.statuses`, prompts to :attr:`FakeSlackServer.suggested_prompts`;
:meth:`FakeSlackServer.status_of` is the status shown now (cleared by ``""``, by a bot
message in the thread, or after two minutes).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import hmac
import itertools
import json
import mimetypes
import re
import time
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any, TypeVar
from urllib.parse import parse_qsl, quote, urlencode

import aiohttp
from aiohttp import web

from tests.fakes import slack_blocks

T = TypeVar("T")
JSON = dict[str, Any]

TEAM_ID = "T1"
TEAM_NAME = "Tandem"
TEAM_DOMAIN = "tandem"
APP_ID = "A1"
BOT_USER_ID = "UBOT"
BOT_ID = "BBOT"
BOT_NAME = "tandem"
VERIFICATION_TOKEN = "fake-verification-token"

MAX_TEXT = 40_000
_DOWNLOAD_CHUNK = 1024 * 1024
MAX_BLOCKS = 50
MAX_SECTION_TEXT = 3_000
MAX_MARKDOWN_TEXT = 12_000
MAX_BUTTON_VALUE = 2_000
MAX_ACTION_ID = 255
MAX_ALT_TXT = 1_000
MAX_PROMPTS = 4
MAX_LOADING_MESSAGES = 10
STATUS_TIMEOUT = 120.0  # seconds an assistant status stays without a message
ASSISTANT_SCOPE = "assistant:write"
NOT_AGENT_APP = "not_agent_app"
STREAM_REFUSED = "channel_type_not_supported"  # chat.startStream's answer with refuse_streams
CHUNK_FIELDS = {
    "markdown_text": ("text",),
    "task_update": ("id", "title", "status"),
    "plan_update": ("title",),
    "blocks": ("blocks",),
}
TASK_STATUSES = frozenset({"pending", "in_progress", "complete", "error"})
TASK_DISPLAY_MODES = frozenset({"timeline", "plan", "dense"})
MAX_UPLOAD_BYTES = 64 * 1024 * 1024
"""The largest request body the fake accepts (aiohttp ``client_max_size``); Slack allows 1 GB."""

DEFAULT_SCOPES = frozenset(
    {
        "app_mentions:read",
        "channels:history",
        "chat:write",
        "files:read",
        "files:write",
        "groups:history",
        "im:history",
        "mpim:history",
        "reactions:write",
        "users:read",
    }
)
APP_TOKEN_SCOPES = "connections:write"
_METHOD_SCOPES = {
    "apps.connections.open": APP_TOKEN_SCOPES,
    "files.getUploadURLExternal": "files:write",
    "files.completeUploadExternal": "files:write",
    "files.info": "files:read",
    "assistant.threads.setStatus": ASSISTANT_SCOPE,
    "assistant.threads.setSuggestedPrompts": ASSISTANT_SCOPE,
}
_FILETYPES = {"jpeg": "jpg", "txt": "text", "md": "markdown", "py": "python", "yml": "yaml"}
_KNOWN_FILETYPES = frozenset(
    {"png", "jpg", "gif", "webp", "svg", "pdf", "zip", "gzip", "csv", "json", "html", "xml"}
    | {"mp3", "mp4", "wav", "mov", "docx", "xlsx", "pptx", "yaml", "text", "markdown", "python"}
)
_LOGIN_PAGE = (
    '<!DOCTYPE html><html lang="en"><head><meta charset="utf-8">'
    f"<title>Slack</title></head><body><h1>Sign in to {TEAM_NAME}</h1>"
    f'<form action="https://{TEAM_DOMAIN}.slack.com/" method="post">'
    '<input type="email" name="email"><input type="password" name="password">'
    '<button type="submit">Sign in</button></form></body></html>'
)

_TS_BASE_MICROS = 1_700_000_000 * 1_000_000
_TS = re.compile(r"[0-9]+\.[0-9]+")


class _ApiError(Exception):
    """Raised inside a Web API handler: becomes ``{"ok": false, "error": ...}``."""

    def __init__(
        self,
        error: str,
        *,
        status: int = 200,
        extra: JSON | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(error)
        self.error = error
        self.status = status
        self.extra = extra or {}
        self.headers = headers or {}


@dataclass
class FakeSlackStream:
    """The streaming state of a message chat.startStream posted."""

    started: float  # time.monotonic()
    expires: float  # when the fake stops it if the bot has not
    recipient_team_id: str | None = None
    recipient_user_id: str | None = None
    task_display_mode: str | None = None
    mode: str | None = None  # "markdown_text" or "chunks", set by the first content sent
    chunks: list[JSON] = field(default_factory=list)  # every chunk received, in order
    ended_by: str | None = None  # "bot" (chat.stopStream), "user" or "timeout"
    final_text: str = ""  # the markdown chat.stopStream added
    metadata: JSON | None = None

    def expire(self, now: float) -> None:
        if self.ended_by is None and now >= self.expires:
            self.ended_by = "timeout"

    @property
    def state(self) -> str:
        """``streaming``, ``stopped``, ``stopped_by_user`` or ``timed_out``."""
        self.expire(time.monotonic())
        names = {"bot": "stopped", "user": "stopped_by_user", "timeout": "timed_out"}
        return names[self.ended_by] if self.ended_by else "streaming"

    @property
    def streaming(self) -> bool:
        return self.state == "streaming"


@dataclass
class FakeSlackMessage:
    """A message as stored by the fake (user messages, bot messages and thread replies)."""

    channel: str
    ts: str
    user: str
    text: str
    bot: bool = False
    blocks: list[JSON] | None = None
    thread_ts: str | None = None
    edits: list[str] = field(default_factory=list)  # the text after each chat.update
    reactions: list[str] = field(default_factory=list)
    files: list[JSON] | None = None  # file objects, as the message carries them
    stream: FakeSlackStream | None = None  # set on a message chat.startStream posted
    appends: list[str] = field(default_factory=list)  # the text each chat.appendStream added

    @property
    def is_reply(self) -> bool:
        return self.thread_ts is not None and self.thread_ts != self.ts

    @property
    def visible_text(self) -> str:
        """The text the message shows: for a streamed message (until a chat.update), its
        markdown then the text of the blocks chat.stopStream added; otherwise the text of its
        section/markdown blocks, else its ``text``."""
        if self.stream is not None and not self.edits:
            return "\n".join(part for part in (self.text, block_text(self.blocks)) if part)
        return block_text(self.blocks) or self.text

    def to_api(self) -> JSON:
        """The message as the Web API and interactive payloads render it."""
        out: JSON = {"type": "message", "ts": self.ts, "user": self.user, "text": self.text}
        out["team"] = TEAM_ID
        if self.bot:
            out["bot_id"] = BOT_ID
            out["app_id"] = APP_ID
        if self.blocks is not None:
            out["blocks"] = self.blocks
        if self.thread_ts is not None:
            out["thread_ts"] = self.thread_ts
        if self.edits:
            out["edited"] = {"user": self.user, "ts": self.ts}
        if self.reactions:
            out["reactions"] = [
                {"name": name, "users": [BOT_USER_ID], "count": 1} for name in self.reactions
            ]
        if self.files:
            out["files"] = self.files
            out["upload"] = self.bot
        return out


@dataclass
class FakeSlackFile:
    """A file the fake hosts: shared by a user (``add_file``) or uploaded by the bot
    (``files.getUploadURLExternal``, POST, ``files.completeUploadExternal``)."""

    id: str
    name: str
    title: str
    mimetype: str
    filetype: str
    user: str
    data: bytes
    size: int  # what Slack reports (a test may declare more than ``data`` holds)
    created: int
    url_private: str
    url_private_download: str
    permalink: str
    length: int | None = None  # the length announced for an external upload (bot uploads)
    uploaded: bool = True  # the bytes have arrived
    completed: bool = True  # shared by a user, or files.completeUploadExternal done
    initial_comment: str | None = None
    alt_txt: str | None = None
    shares: list[FakeSlackMessage] = field(default_factory=list)  # messages carrying it

    def to_api(self) -> JSON:
        """The file object as a message (or a ``file_share`` event) carries it."""
        return {
            "id": self.id,
            "created": self.created,
            "timestamp": self.created,
            "name": self.name,
            "title": self.title,
            "mimetype": self.mimetype,
            "filetype": self.filetype,
            "user": self.user,
            "user_team": TEAM_ID,
            "editable": False,
            "size": self.size,
            "mode": "hosted",
            "is_external": False,
            "external_type": "",
            "is_public": False,
            "public_url_shared": False,
            "display_as_bot": False,
            "username": "",
            "url_private": self.url_private,
            "url_private_download": self.url_private_download,
            "permalink": self.permalink,
            "has_rich_preview": False,
            "file_access": "visible",
        }

    def info(self) -> JSON:
        """The file as ``files.info`` shows it: the object plus where it is shared."""
        out = self.to_api()
        shares: dict[str, dict[str, list[JSON]]] = {}
        for msg in self.shares:
            entry: JSON = {
                "ts": msg.ts,
                "channel_name": _channel_name(msg.channel),
                "team_id": TEAM_ID,
                "share_user_id": msg.user,
                "reply_users": [],
                "reply_users_count": 0,
                "reply_count": 0,
            }
            if msg.is_reply:
                entry["thread_ts"] = msg.thread_ts
            kind = "public" if msg.channel.startswith("C") else "private"
            shares.setdefault(kind, {}).setdefault(msg.channel, []).append(entry)
        channels = list(dict.fromkeys(m.channel for m in self.shares))
        out["shares"] = shares
        out["channels"] = [c for c in channels if c.startswith("C")]
        out["groups"] = [c for c in channels if c.startswith("G")]
        out["ims"] = [c for c in channels if c.startswith("D")]
        out["comments_count"] = 0
        if self.alt_txt is not None:
            out["alt_txt"] = self.alt_txt
        return out


@dataclass
class Call:
    """One Web API call as received (``params`` never include the token)."""

    method: str
    params: JSON
    time: float  # time.monotonic() when the response was produced
    status: int  # HTTP status of the response
    error: str | None = None  # the Slack error code, None when ok


@dataclass
class HttpDelivery:
    """The bot endpoint's answer to an HTTP-mode delivery."""

    status: int
    body: str
    latency: float
    headers: dict[str, str]


@dataclass
class _Bucket:
    tokens: float
    stamp: float


@dataclass
class _ResponseTarget:
    channel: str
    message_ts: str
    user: str
    thread_ts: str | None


_Handler = Callable[[JSON], JSON]


class FakeSlackServer:
    """Fake Slack. Use ``async with FakeSlackServer() as fake:`` or ``start()``/``close()``."""

    def __init__(
        self,
        *,
        bot_token: str = "xoxb-test",
        app_token: str = "xapp-test",
        rate_limit: bool = True,
        post_interval: float = 1.0,
        update_interval: float = 1.0,
        burst: int = 3,
        retry_after: int = 1,
        team_id: str | None = TEAM_ID,
        scopes: Iterable[str] | None = None,
        append_interval: float = 0.1,
        stream_timeout: float = 300.0,
        assistant: bool = False,
    ) -> None:
        self.bot_token = bot_token
        self.scopes: set[str] = set(DEFAULT_SCOPES if scopes is None else scopes)
        """The bot token's scopes (mutable: a test may drop one mid-run); ``assistant=True``
        adds ``assistant:write``."""
        if assistant:
            self.scopes.add(ASSISTANT_SCOPE)
        self.assistant = assistant
        """The app has the agent/assistant surface (else the assistant.threads methods
        answer ``not_agent_app``)."""
        self.append_interval = append_interval
        self.stream_timeout = stream_timeout
        self.refuse_streams: bool | str = False
        """True (or an error code): chat.startStream fails with :data:`STREAM_REFUSED`
        (or that code)."""
        self.team_id = team_id
        """The workspace ``auth.test`` names (None: an answer without ``team_id``)."""
        self.app_token = app_token
        self.rate_limit = rate_limit
        self.post_interval = post_interval
        self.update_interval = update_interval
        self.burst = burst
        self.retry_after = retry_after

        # Recorded state, public for assertions.
        self.calls: list[Call] = []
        self.messages: dict[str, list[FakeSlackMessage]] = {}
        self.deleted: list[FakeSlackMessage] = []
        self.ephemerals: list[JSON] = []
        self.reactions: list[tuple[str, str, str]] = []  # (channel, ts, name)
        self.rate_limited: list[tuple[str, str]] = []  # (channel, method)
        self.acks: dict[str, float] = {}  # envelope_id -> seconds from push to ack
        self.ack_payloads: dict[str, JSON | None] = {}
        self.duplicate_acks: list[str] = []
        self.unexpected_socket_messages: list[str] = []
        self.pushed: dict[str, JSON] = {}  # envelope_id -> envelope
        self.responses: list[JSON] = []  # bodies POSTed to response_url endpoints
        self.users: dict[str, JSON] = {}
        self.files: dict[str, FakeSlackFile] = {}
        self.refused_downloads: list[str] = []  # file ids served the sign-in page instead
        self.connections_opened = 0
        self.statuses: list[tuple[str, str, str]] = []  # (channel, thread_ts, status)
        self.suggested_prompts: list[JSON] = []  # {channel, thread_ts, title, prompts}
        # (channel, thread root) -> the status shown there and when it was set
        self._status: dict[tuple[str, str], tuple[str, float]] = {}

        self._ts_counter = itertools.count(1)
        self._id_counter = itertools.count(1)
        self._ticket_counter = itertools.count(1)
        self._tickets: set[str] = set()
        self._sockets: list[web.WebSocketResponse] = []
        self._push_times: dict[str, float] = {}
        self._buckets: dict[tuple[str, str], _Bucket] = {}
        self._response_targets: dict[str, _ResponseTarget] = {}
        self._upload_tickets: dict[str, str] = {}  # upload URL ticket -> file id
        self._downloads: dict[str, int] = {}
        self._cond = asyncio.Condition()
        self._runner: web.AppRunner | None = None
        self._session: aiohttp.ClientSession | None = None
        self._port = 0
        self._handlers: dict[str, _Handler] = {
            "auth.test": self._auth_test,
            "apps.connections.open": self._apps_connections_open,
            "chat.postMessage": self._chat_post_message,
            "chat.update": self._chat_update,
            "chat.delete": self._chat_delete,
            "chat.postEphemeral": self._chat_post_ephemeral,
            "conversations.replies": self._conversations_replies,
            "users.info": self._users_info,
            "reactions.add": self._reactions_add,
            "files.getUploadURLExternal": self._files_get_upload_url_external,
            "files.completeUploadExternal": self._files_complete_upload_external,
            "files.info": self._files_info,
            "chat.startStream": self._chat_start_stream,
            "chat.appendStream": self._chat_append_stream,
            "chat.stopStream": self._chat_stop_stream,
            "assistant.threads.setStatus": self._assistant_threads_set_status,
            "assistant.threads.setSuggestedPrompts": self._assistant_threads_set_suggested_prompts,
        }
        self.add_user(BOT_USER_ID, name=BOT_NAME, real_name="Tandem", is_bot=True)

    # ------------------------------------------------------------------ lifecycle

    async def start(self) -> FakeSlackServer:
        app = web.Application(client_max_size=MAX_UPLOAD_BYTES)
        app.router.add_route("*", "/api/{method}", self._api)
        app.router.add_get("/socket", self._socket)
        app.router.add_post("/response/{token}", self._response_url)
        app.router.add_get("/files-pri/{ref}/download/{name}", self._file_download)
        app.router.add_get("/files-pri/{ref}/{name}", self._file_download)
        app.router.add_post("/upload/v1/{ticket}", self._upload)
        self._runner = web.AppRunner(app, handle_signals=False, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        addresses = self._runner.addresses
        self._port = int(addresses[0][1])
        self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10))
        return self

    async def close(self) -> None:
        for ws in list(self._sockets):
            await ws.close(code=aiohttp.WSCloseCode.GOING_AWAY, message=b"server shutdown")
        if self._session is not None:
            await self._session.close()
            self._session = None
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    async def __aenter__(self) -> FakeSlackServer:
        return await self.start()

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    @property
    def url(self) -> str:
        """``http://127.0.0.1:PORT`` (no trailing slash)."""
        if not self._port:
            raise RuntimeError("FakeSlackServer is not started")
        return f"http://127.0.0.1:{self._port}"

    @property
    def api_url(self) -> str:
        """The ``base_url`` for ``AsyncWebClient`` (ends with ``/``)."""
        return f"{self.url}/api/"

    # ------------------------------------------------------------------ state queries

    def add_user(
        self,
        user_id: str,
        *,
        name: str | None = None,
        real_name: str | None = None,
        tz: str = "UTC",
        is_bot: bool = False,
    ) -> JSON:
        """Register a user for ``users.info`` (builders auto-register the users they mention)."""
        uname = name or f"user_{user_id.lower()}"
        rname = real_name or uname.replace("_", " ").title()
        user: JSON = {
            "id": user_id,
            "team_id": TEAM_ID,
            "name": uname,
            "real_name": rname,
            "tz": tz,
            "tz_label": "Coordinated Universal Time" if tz == "UTC" else tz,
            "tz_offset": 0,
            "is_bot": is_bot,
            "deleted": False,
            "profile": {"real_name": rname, "display_name": uname},
        }
        self.users[user_id] = user
        return user

    def add_file(
        self,
        data: bytes,
        *,
        name: str,
        mimetype: str,
        filetype: str | None = None,
        user: str = "U1",
        declared_size: int | None = None,
        title: str | None = None,
    ) -> JSON:
        """Register a file ``user`` shares and return its file object (pass it to
        ``message_event(files=[...])``). ``declared_size`` is the size Slack reports, for a
        test that claims a big file without allocating it; the URLs serve ``data``."""
        if user not in self.users:
            self.add_user(user)
        size = len(data) if declared_size is None else declared_size
        f = self._new_file(data, name=name, mimetype=mimetype, user=user, size=size)
        f.filetype = filetype or f.filetype
        f.title = title or name
        return f.to_api()

    def file(self, file_id: str) -> FakeSlackFile | None:
        return self.files.get(file_id)

    def downloads(self, file_id: str) -> int:
        """How many times the file's bytes were served (sign-in pages not counted)."""
        return self._downloads.get(file_id, 0)

    def uploads(self, channel_id: str, thread_ts: str | None = None) -> list[FakeSlackFile]:
        """The files the bot uploaded into a channel (threads included) or, with
        ``thread_ts``, into one thread, in message order (``shares`` holds the messages)."""
        return [
            self.files[obj["id"]]
            for m in self.bot_messages(channel_id, thread_ts)
            for obj in m.files or []
        ]

    def channel(self, channel_id: str, thread_ts: str | None = None) -> list[FakeSlackMessage]:
        """All messages in a channel (threads included) or, with ``thread_ts``, one thread:
        the root message followed by its replies in order."""
        msgs = self.messages.get(channel_id, [])
        if thread_ts is None:
            return list(msgs)
        return [m for m in msgs if m.ts == thread_ts or m.thread_ts == thread_ts]

    def message(self, channel_id: str, ts: str) -> FakeSlackMessage | None:
        for m in self.messages.get(channel_id, []):
            if m.ts == ts:
                return m
        return None

    def bot_messages(self, channel_id: str, thread_ts: str | None = None) -> list[FakeSlackMessage]:
        return [m for m in self.channel(channel_id, thread_ts) if m.bot]

    def bot_texts(self, channel_id: str, thread_ts: str | None = None) -> list[str]:
        """The bot's messages as text: the concatenated section/markdown block texts when the
        message has such blocks, otherwise its ``text``; a streamed message shows its
        markdown so far, then its stop blocks (:attr:`FakeSlackMessage.visible_text`)."""
        return [m.visible_text for m in self.bot_messages(channel_id, thread_ts)]

    def streams(self, channel_id: str, thread_ts: str | None = None) -> list[FakeSlackMessage]:
        """The bot's streamed messages (chat.startStream), in order."""
        return [m for m in self.bot_messages(channel_id, thread_ts) if m.stream is not None]

    def stop_stream_by_user(self, channel_id: str, ts: str) -> None:
        """The user presses stop on a streaming message: further appends get
        ``stopped_by_user``."""
        msg = self.message(channel_id, ts)
        if msg is None or msg.stream is None or not msg.stream.streaming:
            raise AssertionError(f"no streaming message {ts} in {channel_id}\n{self.dump()}")
        msg.stream.ended_by = "user"

    def status_of(self, channel_id: str, thread_ts: str) -> str | None:
        """The assistant status the thread shows now, or None (never set, cleared with
        ``""``, replaced by a bot message in the thread, or two minutes old)."""
        shown = self._status.get((channel_id, self._thread_root(channel_id, thread_ts)))
        if shown is None or time.monotonic() - shown[1] >= STATUS_TIMEOUT:
            return None
        return shown[0]

    def ephemerals_for(self, user: str) -> list[JSON]:
        return [e for e in self.ephemerals if e["user"] == user]

    def calls_to(self, method: str) -> list[Call]:
        return [c for c in self.calls if c.method == method]

    def max_update_rate(self, channel_id: str) -> int:
        """Most ``chat.update`` calls (accepted or rate limited) on a channel in any 1 s window."""
        times = sorted(
            c.time for c in self.calls_to("chat.update") if c.params.get("channel") == channel_id
        )
        best = 0
        start = 0
        for end, t in enumerate(times):
            while t - times[start] >= 1.0:
                start += 1
            best = max(best, end - start + 1)
        return best

    async def wait_for(
        self,
        predicate: Callable[[], T],
        timeout: float = 5.0,
    ) -> T:
        """Wait until ``predicate()`` is truthy and return its value.

        Re-checked after every Web API call, socket message, ack and response_url post (and
        every 50 ms, for predicates over state outside the fake). Raises AssertionError with a
        dump of the fake's state on timeout."""
        deadline = time.monotonic() + timeout
        async with self._cond:
            while True:
                result = predicate()
                if result:
                    return result
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise AssertionError(f"condition not met within {timeout}s\n{self.dump()}")
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(min(remaining, 0.05)):
                        await self._cond.wait()

    def dump(self) -> str:
        lines = ["--- fake slack: last calls ---"]
        for c in self.calls[-30:]:
            params = json.dumps(c.params, default=str)
            if len(params) > 200:
                params = params[:200] + "..."
            lines.append(f"{c.method} -> {c.status} {c.error or 'ok'} {params}")
        lines.append("--- messages ---")
        for channel_id, msgs in self.messages.items():
            for m in msgs:
                who = "bot" if m.bot else m.user
                thread = f" thread={m.thread_ts}" if m.thread_ts else ""
                stream = f" [stream {m.stream.state}, {len(m.appends)} appends]" if m.stream else ""
                lines.append(f"{channel_id} {m.ts}{thread}{stream} {who}: {m.visible_text[:120]!r}")
        lines.append(f"--- acks: {self.acks}")
        lines.append(f"--- pushed without ack: {[e for e in self.pushed if e not in self.acks]}")
        lines.append(f"--- ephemerals: {len(self.ephemerals)}, responses: {len(self.responses)}")
        for f in self.files.values():
            state = "shared" if f.completed else "uploaded" if f.uploaded else "pending"
            where = [f"{m.channel}/{m.thread_ts or m.ts}" for m in f.shares]
            lines.append(
                f"--- file {f.id} {f.name!r} {f.size}B {state} in {where} "
                f"downloads={self.downloads(f.id)}"
            )
        lines.append(f"--- refused downloads: {self.refused_downloads}")
        lines.append(f"--- rate limited: {self.rate_limited}")
        lines.append(f"--- assistant statuses: {self.statuses[-10:]}")
        lines.append(f"--- open sockets: {len(self._sockets)}")
        return "\n".join(lines)

    # ------------------------------------------------------------------ payload builders

    def new_ts(self) -> str:
        micros = _TS_BASE_MICROS + next(self._ts_counter) * 100
        return f"{micros // 1_000_000}.{micros % 1_000_000:06d}"

    def _new_id(self, prefix: str) -> str:
        return f"{prefix}{next(self._id_counter):08d}FAKE"

    def _new_file(
        self, data: bytes, *, name: str, mimetype: str, user: str, size: int
    ) -> FakeSlackFile:
        file_id = self._new_id("F")
        base = f"{self.url}/files-pri/{TEAM_ID}-{file_id}"
        quoted = quote(name, safe="")
        f = FakeSlackFile(
            id=file_id,
            name=name,
            title=name,
            mimetype=mimetype,
            filetype=_guess_filetype(name),
            user=user,
            data=data,
            size=size,
            created=int(time.time()),
            url_private=f"{base}/{quoted}",
            url_private_download=f"{base}/download/{quoted}",
            permalink=f"https://{TEAM_DOMAIN}.slack.com/files/{user}/{file_id}/{quoted}",
        )
        self.files[file_id] = f
        return f

    def event_body(
        self, event: JSON, *, event_id: str | None = None, team_id: str = TEAM_ID
    ) -> JSON:
        """The full ``event_callback`` envelope Slack sends for ``event``, from the workspace
        ``team_id`` (another one models an install elsewhere or a shared channel)."""
        return {
            "token": VERIFICATION_TOKEN,
            "team_id": team_id,
            "context_team_id": team_id,
            "context_enterprise_id": None,
            "api_app_id": APP_ID,
            "event": event,
            "type": "event_callback",
            "event_id": event_id or self._new_id("Ev"),
            "event_time": int(time.time()),
            "authorizations": [
                {
                    "enterprise_id": None,
                    "team_id": team_id,
                    "user_id": BOT_USER_ID,
                    "is_bot": True,
                    "is_enterprise_install": False,
                }
            ],
            "is_ext_shared_channel": False,
            "event_context": f"4-{uuid.uuid4().hex}",
        }

    def message_event(
        self,
        channel: str,
        user: str,
        text: str,
        *,
        thread_ts: str | None = None,
        channel_type: str = "im",
        mention: bool = False,
        team: str | None = TEAM_ID,
        files: list[JSON] | None = None,
        attachments: list[JSON] | None = None,
    ) -> JSON:
        """Store a user message and return the event Slack would send for it
        (``message``, or ``app_mention`` with ``<@UBOT>`` prefixed when ``mention``);
        ``team`` is the event's own workspace field (None leaves it out). With ``files``
        (objects from ``add_file``) it is a ``file_share`` message (``text`` may be empty)."""
        if user not in self.users:
            self.add_user(user)
        full_text = f"<@{BOT_USER_ID}> {text}" if mention else text
        ts = self.new_ts()
        root = self._thread_root(channel, thread_ts) if thread_ts else None
        msg = self._store(
            FakeSlackMessage(
                channel, ts, user, full_text, thread_ts=root, files=list(files) if files else None
            )
        )
        event: JSON = {
            "type": "app_mention" if mention else "message",
            "user": user,
            "text": full_text,
            "ts": ts,
            "channel": channel,
            "event_ts": ts,
        }
        if full_text or not files:
            event["client_msg_id"] = str(uuid.uuid4())
            event["blocks"] = _rich_text_blocks(text, mention)
        if files:
            self._attach_files(event, msg, files, mention)
        if attachments:  # a forward (`is_share`) or a linked message's unfurl
            event["attachments"] = list(attachments)
        if root is not None:
            event["thread_ts"] = root
            parent = self.message(channel, root)
            if parent is not None:
                event["parent_user_id"] = parent.user
        if team is not None:
            event["team"] = team
        if not mention:
            event["channel_type"] = channel_type
        return event

    def shared(self, channel: str, ts: str, *, forward: bool = True) -> JSON:
        """The legacy attachment Slack adds for a stored message forwarded (``is_share``)
        or linked (its unfurl, ``is_msg_unfurl`` alone)."""
        msg = self.message(channel, ts)
        if msg is None:
            raise AssertionError(f"no message {ts} in {channel}\n{self.dump()}")
        author = self.users.get(msg.user, {"name": msg.user})
        out: JSON = {
            "id": 1, "ts": ts, "channel_id": channel, "channel_name": _channel_name(channel),
            "author_id": msg.user, "author_name": author.get("real_name") or author["name"],
            "author_link": f"https://{TEAM_DOMAIN}.slack.com/team/{msg.user}",
            "text": msg.text, "fallback": f"[{ts}] {msg.text}", "is_msg_unfurl": True,
            "from_url": f"https://{TEAM_DOMAIN}.slack.com/archives/{channel}/p"
                        + ts.replace(".", ""),
            "mrkdwn_in": ["text"], "footer": "Posted in #" + _channel_name(channel),
        }
        if forward:
            out["is_share"] = True
        return out

    def message_changed_event(self, channel: str, ts: str, text: str,
                              channel_type: str = "im") -> JSON:
        """Edit a stored user message and return the ``message_changed`` event Slack sends
        (the edited message whole, and the one before)."""
        msg = self.message(channel, ts)
        if msg is None or msg.bot:
            raise AssertionError(f"no user message {ts} in {channel}\n{self.dump()}")
        before = self._api_message(msg)
        msg.text = text
        after = {**self._api_message(msg), "edited": {"user": msg.user, "ts": self.new_ts()}}
        return self._hidden("message_changed", channel, channel_type,
                            message=after, previous_message=before)

    def message_deleted_event(self, channel: str, ts: str, channel_type: str = "im") -> JSON:
        """Delete a stored message and return the ``message_deleted`` event Slack sends."""
        msg = self.message(channel, ts)
        if msg is None:
            raise AssertionError(f"no message {ts} in {channel}\n{self.dump()}")
        self.messages[channel].remove(msg)
        self.deleted.append(msg)
        return self._hidden("message_deleted", channel, channel_type, deleted_ts=ts,
                            previous_message=self._api_message(msg))

    def _hidden(self, subtype: str, channel: str, channel_type: str, **fields: Any) -> JSON:
        ts = self.new_ts()
        return {"type": "message", "subtype": subtype, "hidden": True, "channel": channel,
                "ts": ts, "event_ts": ts, "channel_type": channel_type, **fields}

    def _attach_files(
        self, event: JSON, msg: FakeSlackMessage, files: list[JSON], mention: bool
    ) -> None:
        event["files"] = list(files)
        event["upload"] = False
        event["display_as_bot"] = False
        if not mention:
            event["subtype"] = "file_share"
        for obj in files:
            known = self.files.get(str(obj.get("id")))
            if known is not None:
                known.shares.append(msg)

    def block_actions(
        self,
        channel: str,
        user: str,
        message_ts: str,
        action_id: str,
        value: str,
        *,
        team_id: str = TEAM_ID,
    ) -> JSON:
        """The ``block_actions`` payload Slack sends when ``user`` (a member of ``team_id``)
        presses the button ``action_id`` on the stored message ``message_ts``."""
        msg = self.message(channel, message_ts)
        if msg is None:
            raise AssertionError(f"no message {message_ts} in {channel}\n{self.dump()}")
        if user not in self.users:
            self.add_user(user)
        uname = self.users[user]["name"]
        block_id, button = _find_button(msg.blocks or [], action_id)
        token = uuid.uuid4().hex
        self._response_targets[token] = _ResponseTarget(channel, message_ts, user, msg.thread_ts)
        container: JSON = {
            "type": "message",
            "message_ts": message_ts,
            "channel_id": channel,
            "is_ephemeral": False,
        }
        if msg.thread_ts is not None:
            container["thread_ts"] = msg.thread_ts
        action: JSON = {
            "type": "button",
            "action_id": action_id,
            "block_id": block_id,
            "text": (button or {}).get(
                "text", {"type": "plain_text", "text": "Button", "emoji": True}
            ),
            "value": value,
            "action_ts": f"{time.time():.6f}",
        }
        if button is not None and "style" in button:
            action["style"] = button["style"]
        return {
            "type": "block_actions",
            "user": {"id": user, "username": uname, "name": uname, "team_id": team_id},
            "api_app_id": APP_ID,
            "token": VERIFICATION_TOKEN,
            "container": container,
            "trigger_id": f"{next(self._id_counter)}.1.{uuid.uuid4().hex}",
            "team": {"id": team_id, "domain": TEAM_DOMAIN},
            "enterprise": None,
            "is_enterprise_install": False,
            "channel": {"id": channel, "name": _channel_name(channel)},
            "message": msg.to_api(),
            "state": {"values": {}},
            "response_url": f"{self.url}/response/{token}",
            "actions": [action],
        }

    # ------------------------------------------------------------------ Socket Mode

    async def push(
        self,
        type_: str,
        payload: JSON,
        *,
        retry_attempt: int = 0,
        accepts_response_payload: bool | None = None,
        timeout: float = 5.0,
    ) -> str:
        """Send a Socket Mode envelope (``events_api``, ``interactive``, ``slash_commands``)
        to the newest open connection and return its envelope_id."""
        await self.wait_for(lambda: self._sockets, timeout)
        envelope_id = str(uuid.uuid4())
        envelope: JSON = {
            "envelope_id": envelope_id,
            "type": type_,
            "accepts_response_payload": (
                accepts_response_payload
                if accepts_response_payload is not None
                else type_ == "slash_commands"
            ),
            "payload": payload,
        }
        if type_ == "events_api":
            envelope["retry_attempt"] = retry_attempt
            envelope["retry_reason"] = "timeout" if retry_attempt else ""
        self.pushed[envelope_id] = envelope
        self._push_times[envelope_id] = time.monotonic()
        await self._sockets[-1].send_str(json.dumps(envelope))
        return envelope_id

    async def push_event(
        self,
        event: JSON,
        *,
        event_id: str | None = None,
        retry_attempt: int = 0,
        team_id: str = TEAM_ID,
    ) -> str:
        """Push ``event`` wrapped in ``event_body``; reuse ``event_id`` to model a redelivery."""
        body = self.event_body(event, event_id=event_id, team_id=team_id)
        return await self.push("events_api", body, retry_attempt=retry_attempt)

    async def wait_ack(
        self,
        envelope_id: str,
        timeout: float = 3.0,
    ) -> float:
        """Wait for the client's ack of ``envelope_id``; return the push-to-ack latency."""
        await self.wait_for(lambda: envelope_id in self.acks, timeout)
        return self.acks[envelope_id]

    async def wait_connections(
        self,
        count: int = 1,
        timeout: float = 5.0,
    ) -> None:
        """Wait until ``count`` WebSocket connections have been opened in total."""
        await self.wait_for(lambda: self.connections_opened >= count and self._sockets, timeout)

    async def send_disconnect(self, reason: str = "refresh_requested") -> None:
        """Ask the connected clients to reconnect, as Slack does periodically."""
        message = {"type": "disconnect", "reason": reason, "debug_info": {"host": "fake-slack"}}
        for ws in list(self._sockets):
            await ws.send_str(json.dumps(message))

    async def drop_connections(self) -> None:
        """Close every WebSocket from the server side (an abrupt outage)."""
        for ws in list(self._sockets):
            await ws.close(code=aiohttp.WSCloseCode.GOING_AWAY, message=b"dropped")

    @property
    def open_connections(self) -> int:
        return len(self._sockets)

    async def _socket(self, request: web.Request) -> web.StreamResponse:
        ticket = request.query.get("ticket", "")
        if ticket not in self._tickets:
            return web.Response(status=401, text="invalid ticket")
        ws = web.WebSocketResponse(autoping=True)
        await ws.prepare(request)
        self._sockets.append(ws)
        self.connections_opened += 1
        await ws.send_str(
            json.dumps(
                {
                    "type": "hello",
                    "num_connections": len(self._sockets),
                    "debug_info": {
                        "host": "fake-slack",
                        "build_number": 1,
                        "approximate_connection_time": 18060,
                    },
                    "connection_info": {"app_id": APP_ID},
                }
            )
        )
        await self._notify()
        try:
            async for msg in ws:
                if msg.type == aiohttp.WSMsgType.TEXT:
                    self._on_socket_text(str(msg.data))
                    await self._notify()
                elif msg.type == aiohttp.WSMsgType.ERROR:
                    break
        finally:
            self._sockets.remove(ws)
            await self._notify()
        return ws

    def _on_socket_text(self, data: str) -> None:
        try:
            message = json.loads(data)
        except ValueError:
            self.unexpected_socket_messages.append(data)
            return
        envelope_id = message.get("envelope_id") if isinstance(message, dict) else None
        if not isinstance(envelope_id, str) or envelope_id not in self._push_times:
            self.unexpected_socket_messages.append(data)
            return
        if envelope_id in self.acks:
            self.duplicate_acks.append(envelope_id)
            return
        self.acks[envelope_id] = time.monotonic() - self._push_times[envelope_id]
        self.ack_payloads[envelope_id] = message.get("payload")

    # ------------------------------------------------------------------ HTTP mode sender

    def sign(self, raw: bytes, *, signing_secret: str, timestamp: int) -> str:
        base = b"v0:" + str(timestamp).encode() + b":" + raw
        return "v0=" + hmac.new(signing_secret.encode(), base, hashlib.sha256).hexdigest()

    async def post_event(
        self,
        url: str,
        body: JSON,
        *,
        signing_secret: str,
        timestamp: int | None = None,
        bad_signature: bool = False,
        retry_num: int | None = None,
    ) -> HttpDelivery:
        """POST an Events API body (JSON) to the bot's endpoint, signed like Slack."""
        raw = json.dumps(body).encode()
        return await self._deliver(
            url, raw, "application/json", signing_secret, timestamp, bad_signature, retry_num
        )

    async def post_action(
        self,
        url: str,
        payload: JSON,
        *,
        signing_secret: str,
        timestamp: int | None = None,
        bad_signature: bool = False,
    ) -> HttpDelivery:
        """POST an interactive payload form-encoded as ``payload=<json>``, signed like Slack."""
        raw = urlencode({"payload": json.dumps(payload)}).encode()
        return await self._deliver(
            url, raw, "application/x-www-form-urlencoded", signing_secret, timestamp, bad_signature
        )

    async def post_raw(
        self,
        url: str,
        raw: bytes,
        *,
        content_type: str,
        signing_secret: str,
    ) -> HttpDelivery:
        """POST ``raw`` as it is (malformed bodies included), correctly signed."""
        return await self._deliver(url, raw, content_type, signing_secret, None, False)

    async def _deliver(
        self,
        url: str,
        raw: bytes,
        content_type: str,
        signing_secret: str,
        timestamp: int | None,
        bad_signature: bool,
        retry_num: int | None = None,
    ) -> HttpDelivery:
        if self._session is None:
            raise RuntimeError("FakeSlackServer is not started")
        ts = int(time.time()) if timestamp is None else timestamp
        signature = self.sign(raw, signing_secret=signing_secret, timestamp=ts)
        if bad_signature:
            signature = "v0=" + "0" * 64
        headers = {
            "Content-Type": content_type,
            "X-Slack-Request-Timestamp": str(ts),
            "X-Slack-Signature": signature,
            "User-Agent": "Slackbot 1.0 (+https://api.slack.com/robots)",
        }
        if retry_num is not None:
            headers["X-Slack-Retry-Num"] = str(retry_num)
            headers["X-Slack-Retry-Reason"] = "http_timeout"
        start = time.monotonic()
        async with self._session.post(url, data=raw, headers=headers) as resp:
            text = await resp.text()
            latency = time.monotonic() - start
            return HttpDelivery(resp.status, text, latency, dict(resp.headers))

    # ------------------------------------------------------------------ response_url

    async def _response_url(self, request: web.Request) -> web.Response:
        target = self._response_targets.get(request.match_info["token"])
        if target is None:
            return web.Response(status=404, text="no_such_response_url")
        try:
            body = await request.json()
        except ValueError:
            return web.Response(status=400, text="invalid_payload")
        self.responses.append(body)
        self._apply_response(target, body)
        await self._notify()
        return web.Response(text="ok")

    def _apply_response(self, target: _ResponseTarget, body: JSON) -> None:
        msg = self.message(target.channel, target.message_ts)
        if body.get("delete_original") and msg is not None:
            self.messages[target.channel].remove(msg)
            self.deleted.append(msg)
        elif body.get("replace_original") and msg is not None:
            msg.text = body.get("text", "")
            msg.blocks = body.get("blocks")
            msg.edits.append(msg.text)
        elif body.get("response_type") == "in_channel":
            thread = body.get("thread_ts") or target.thread_ts
            self._store(
                FakeSlackMessage(
                    target.channel,
                    self.new_ts(),
                    BOT_USER_ID,
                    body.get("text", ""),
                    bot=True,
                    blocks=body.get("blocks"),
                    thread_ts=thread,
                )
            )
        else:
            self.ephemerals.append(
                {
                    "channel": target.channel,
                    "user": target.user,
                    "text": body.get("text", ""),
                    "blocks": body.get("blocks"),
                    "thread_ts": target.thread_ts,
                    "message_ts": self.new_ts(),
                }
            )

    # ------------------------------------------------------------------ file hosts

    async def _file_download(self, request: web.Request) -> web.StreamResponse:
        f = self._file_at(request.match_info["ref"], request.match_info["name"])
        if f is None:
            return web.Response(status=404, text="Not Found")
        counts = request.method == "GET"  # aiohttp answers HEAD on the same route
        if not self._may_download(request.headers.get("Authorization", "")):
            # What Slack answers a browser without a session: its sign-in page, HTTP 200.
            if counts:
                self.refused_downloads.append(f.id)
                await self._notify()
            return web.Response(text=_LOGIN_PAGE, content_type="text/html")
        headers = {"Content-Type": f.mimetype}
        if "/download/" in request.path:
            quoted = quote(f.name, safe="")
            headers["Content-Disposition"] = f"attachment; filename*=UTF-8''{quoted}"
        if counts:
            self._downloads[f.id] = self.downloads(f.id) + 1
            await self._notify()
        if request.method != "GET":
            return web.Response(body=f.data, headers=headers)
        # streamed in pieces (each write waits for the client), so a large file is never
        # buffered whole by the fake while the client is slower
        headers["Content-Length"] = str(len(f.data))
        response = web.StreamResponse(headers=headers)
        await response.prepare(request)
        view = memoryview(f.data)
        for start in range(0, len(view), _DOWNLOAD_CHUNK):
            await response.write(view[start:start + _DOWNLOAD_CHUNK])
        await response.write_eof()
        return response

    def _file_at(self, ref: str, name: str) -> FakeSlackFile | None:
        team, _, file_id = ref.partition("-")
        f = self.files.get(file_id)
        if team != TEAM_ID or f is None or f.name != name or not f.uploaded:
            return None
        return f

    def _may_download(self, authorization: str) -> bool:
        return authorization == f"Bearer {self.bot_token}" and "files:read" in self.scopes

    async def _upload(self, request: web.Request) -> web.Response:
        file_id = self._upload_tickets.get(request.match_info["ticket"])
        f = self.files.get(file_id or "")
        if f is None or f.length is None:
            return web.Response(status=404, text="Not Found")
        data = await _upload_body(request)
        if len(data) != f.length:
            await self._notify()
            return web.Response(
                status=400, text=f"Upload failed: expected {f.length} bytes, got {len(data)}"
            )
        f.data = data
        f.size = len(data)
        f.uploaded = True
        await self._notify()
        return web.Response(text=f"OK - {len(data)}")

    # ------------------------------------------------------------------ Web API plumbing

    async def _notify(self) -> None:
        async with self._cond:
            self._cond.notify_all()

    async def _api(self, request: web.Request) -> web.Response:
        method = request.match_info["method"]
        params, token = await _read_params(request)
        status, body, headers = self._dispatch(method, params, token)
        self.calls.append(Call(method, params, time.monotonic(), status, body.get("error")))
        await self._notify()
        return web.json_response(body, status=status, headers=headers)

    def _dispatch(
        self, method: str, params: JSON, token: str | None
    ) -> tuple[int, JSON, dict[str, str]]:
        headers = self._scope_headers(method, token)
        try:
            handler = self._handlers.get(method)
            if handler is None:
                raise _ApiError("unknown_method")
            self._check_token(method, token)
            self._check_scope(method)
            return 200, {"ok": True, **handler(params)}, headers
        except _ApiError as e:
            return e.status, {"ok": False, "error": e.error, **e.extra}, {**headers, **e.headers}

    def _scope_headers(self, method: str, token: str | None) -> dict[str, str]:
        """``x-oauth-scopes`` (the token's scopes) and ``x-accepted-oauth-scopes`` (what the
        method needs), as Slack sends them to a token it recognises."""
        if token == self.bot_token:
            headers = {"x-oauth-scopes": ",".join(sorted(self.scopes))}
        elif token == self.app_token:
            headers = {"x-oauth-scopes": APP_TOKEN_SCOPES}
        else:
            return {}
        needed = _METHOD_SCOPES.get(method)
        if needed is not None:
            headers["x-accepted-oauth-scopes"] = needed
        return headers

    def _check_scope(self, method: str) -> None:
        needed = _METHOD_SCOPES.get(method)
        if needed is None or needed == APP_TOKEN_SCOPES or needed in self.scopes:
            return
        provided = ",".join(sorted(self.scopes))
        raise _ApiError("missing_scope", extra={"needed": needed, "provided": provided})

    def _check_token(self, method: str, token: str | None) -> None:
        if not token:
            raise _ApiError("not_authed")
        if method == "apps.connections.open":
            if token == self.app_token:
                return
            raise _ApiError("not_allowed_token_type" if token == self.bot_token else "invalid_auth")
        if token == self.bot_token:
            return
        raise _ApiError("not_allowed_token_type" if token == self.app_token else "invalid_auth")

    def _rate_check(self, method: str, channel: str, interval: float) -> None:
        if not self.rate_limit or interval <= 0:
            return
        now = time.monotonic()
        bucket = self._buckets.setdefault((method, channel), _Bucket(float(self.burst), now))
        bucket.tokens = min(float(self.burst), bucket.tokens + (now - bucket.stamp) / interval)
        bucket.stamp = now
        if bucket.tokens >= 1.0:
            bucket.tokens -= 1.0
            return
        self.rate_limited.append((channel, method))
        raise _ApiError("ratelimited", status=429, headers={"Retry-After": str(self.retry_after)})

    def _store(self, msg: FakeSlackMessage) -> FakeSlackMessage:
        self.messages.setdefault(msg.channel, []).append(msg)
        if msg.bot and msg.thread_ts is not None:
            self._status.pop((msg.channel, msg.thread_ts), None)  # the reply replaces it
        return msg

    def _open_thread(self, channel: str, thread_ts: str | None) -> str | None:
        """The root a reply posted with ``thread_ts`` lands under (a reply's ts means its
        root); the root becomes a thread parent. Like Slack, an unknown ts is taken as is."""
        if thread_ts is None:
            return None
        root = self._thread_root(channel, thread_ts)
        parent = self.message(channel, root)
        if parent is not None and parent.thread_ts is None:
            parent.thread_ts = parent.ts
        return root

    def _thread_root(self, channel: str, thread_ts: str) -> str:
        parent = self.message(channel, thread_ts)
        if parent is not None and parent.thread_ts is not None:
            return parent.thread_ts
        return thread_ts

    def _api_message(self, msg: FakeSlackMessage) -> JSON:
        out = msg.to_api()
        if msg.thread_ts == msg.ts:
            replies = [m for m in self.channel(msg.channel, msg.ts) if m.is_reply]
            if replies:
                out["reply_count"] = len(replies)
                out["reply_users"] = sorted({m.user for m in replies})
                out["latest_reply"] = replies[-1].ts
        elif msg.is_reply:
            parent = self.message(msg.channel, msg.thread_ts or "")
            if parent is not None:
                out["parent_user_id"] = parent.user
        return out

    # ------------------------------------------------------------------ Web API methods

    def _auth_test(self, params: JSON) -> JSON:
        out: JSON = {
            "url": f"https://{TEAM_DOMAIN}.slack.com/",
            "team": TEAM_NAME,
            "user": BOT_NAME,
            "user_id": BOT_USER_ID,
            "bot_id": BOT_ID,
            "is_enterprise_install": False,
        }
        if self.team_id is not None:
            out["team_id"] = self.team_id
        return out

    def _apps_connections_open(self, params: JSON) -> JSON:
        ticket = str(next(self._ticket_counter))
        self._tickets.add(ticket)
        return {"url": f"ws://127.0.0.1:{self._port}/socket?ticket={ticket}"}

    def _chat_post_message(self, params: JSON) -> JSON:
        channel = _require_channel(params)
        _validate_content(params)
        self._rate_check("chat.postMessage", channel, self.post_interval)
        thread_ts = self._open_thread(channel, str(params.get("thread_ts") or "") or None)
        msg = self._store(
            FakeSlackMessage(
                channel,
                self.new_ts(),
                BOT_USER_ID,
                str(params.get("text") or ""),
                bot=True,
                blocks=params.get("blocks") or None,
                thread_ts=thread_ts,
            )
        )
        return {"channel": channel, "ts": msg.ts, "message": self._api_message(msg)}

    def _chat_update(self, params: JSON) -> JSON:
        channel = _require_channel(params)
        msg = self.message(channel, str(params.get("ts") or ""))
        if msg is None:
            raise _ApiError("message_not_found")
        if not msg.bot or (msg.stream is not None and msg.stream.streaming):
            raise _ApiError("cant_update_message")
        _validate_content(params)
        self._rate_check("chat.update", channel, self.update_interval)
        if "text" in params or "blocks" in params:
            msg.text = str(params.get("text") or "")
        if "blocks" in params:
            msg.blocks = params.get("blocks") or None
        msg.edits.append(msg.text)
        return {
            "channel": channel,
            "ts": msg.ts,
            "text": msg.text,
            "message": self._api_message(msg),
        }

    def _chat_delete(self, params: JSON) -> JSON:
        channel = _require_channel(params)
        msg = self.message(channel, str(params.get("ts") or ""))
        if msg is None:
            raise _ApiError("message_not_found")
        if not msg.bot:
            raise _ApiError("cant_delete_message")
        self.messages[channel].remove(msg)
        self.deleted.append(msg)
        return {"channel": channel, "ts": msg.ts}

    def _chat_post_ephemeral(self, params: JSON) -> JSON:
        channel = _require_channel(params)
        user = params.get("user")
        if not user:
            raise _ApiError("user_not_found")
        _validate_content(params)
        message_ts = self.new_ts()
        self.ephemerals.append(
            {
                "channel": channel,
                "user": str(user),
                "text": str(params.get("text") or ""),
                "blocks": params.get("blocks") or None,
                "thread_ts": params.get("thread_ts") or None,
                "message_ts": message_ts,
            }
        )
        return {"message_ts": message_ts}

    def _conversations_replies(self, params: JSON) -> JSON:
        channel = _require_channel(params)
        ts = str(params.get("ts") or "")
        msg = self.message(channel, ts)
        if msg is None:
            raise _ApiError("thread_not_found")
        root = msg.thread_ts or msg.ts
        thread = self.channel(channel, root) if self.message(channel, root) else [msg]
        return {
            "messages": [self._api_message(m) for m in thread],
            "has_more": False,
            "response_metadata": {"next_cursor": ""},
        }

    def _users_info(self, params: JSON) -> JSON:
        user = self.users.get(str(params.get("user") or ""))
        if user is None:
            raise _ApiError("user_not_found")
        return {"user": user}

    def _reactions_add(self, params: JSON) -> JSON:
        channel = _require_channel(params)
        name = str(params.get("name") or "")
        if not name:
            raise _ApiError("invalid_name")
        msg = self.message(channel, str(params.get("timestamp") or ""))
        if msg is None:
            raise _ApiError("message_not_found")
        if name in msg.reactions:
            raise _ApiError("already_reacted")
        msg.reactions.append(name)
        self.reactions.append((channel, msg.ts, name))
        return {}

    def _files_get_upload_url_external(self, params: JSON) -> JSON:
        filename = str(params.get("filename") or "")
        if not filename:
            raise _invalid_arguments("missing required field: filename")
        length = _upload_length(params.get("length"))
        alt_txt = params.get("alt_txt")
        if alt_txt is not None and len(str(alt_txt)) > MAX_ALT_TXT:
            raise _ApiError("alt_txt_too_large")
        f = self._new_file(
            b"", name=filename, mimetype=_guess_mimetype(filename), user=BOT_USER_ID, size=0
        )
        f.length = length
        f.uploaded = f.completed = False
        f.alt_txt = None if alt_txt is None else str(alt_txt)
        ticket = uuid.uuid4().hex
        self._upload_tickets[ticket] = f.id
        return {"upload_url": f"{self.url}/upload/v1/{ticket}", "file_id": f.id}

    def _files_complete_upload_external(self, params: JSON) -> JSON:
        entries = _upload_entries(params.get("files"))
        files = [self._completable(file_id) for file_id in entries]
        targets = _share_targets(params)
        thread_ts = str(params.get("thread_ts") or "") or None
        if thread_ts is not None and len(targets) != 1:
            raise _invalid_arguments("thread_ts needs exactly one channel")
        comment = str(params.get("initial_comment") or "")
        if len(comment) > MAX_TEXT:
            raise _ApiError("msg_too_long")
        blocks = None if comment else params.get("blocks") or None
        if blocks is not None and _block_errors(blocks):
            raise _ApiError("invalid_blocks", extra={"errors": _block_errors(blocks)})
        for f, title in zip(files, entries.values(), strict=True):
            f.title = title or f.title
            f.completed = True
            f.initial_comment = comment or None
        self._upload_tickets = {t: i for t, i in self._upload_tickets.items() if i not in entries}
        for channel in targets:
            self._share(files, channel, self._open_thread(channel, thread_ts), comment, blocks)
        return {"files": [{"id": f.id, "title": f.title} for f in files]}

    def _completable(self, file_id: str) -> FakeSlackFile:
        f = self.files.get(file_id)
        if f is None or f.length is None:
            raise _file_not_found(f"no upload ticket for file {file_id!r}")
        if f.completed:
            raise _file_not_found(f"the upload of {file_id} is already complete")
        if not f.uploaded:
            raise _file_not_found(f"the bytes of {file_id} never arrived at its upload_url")
        return f

    def _share(
        self,
        files: list[FakeSlackFile],
        channel: str,
        thread_ts: str | None,
        comment: str,
        blocks: list[JSON] | None,
    ) -> None:
        msg = self._store(
            FakeSlackMessage(
                channel,
                self.new_ts(),
                BOT_USER_ID,
                comment,
                bot=True,
                blocks=blocks,
                thread_ts=thread_ts,
                files=[f.to_api() for f in files],
            )
        )
        for f in files:
            f.shares.append(msg)

    def _files_info(self, params: JSON) -> JSON:
        f = self.files.get(str(params.get("file") or ""))
        if f is None or not f.completed:
            raise _ApiError("file_not_found")
        return {"file": f.info(), "comments": [], "response_metadata": {"next_cursor": ""}}

    # ------------------------------------------------------------------ streaming

    def _chat_start_stream(self, params: JSON) -> JSON:
        channel = _require_channel(params)
        if self.refuse_streams:
            refused = self.refuse_streams
            raise _ApiError(refused if isinstance(refused, str) else STREAM_REFUSED)
        thread_ts = str(params.get("thread_ts") or "")
        if not thread_ts:
            raise _invalid_arguments("missing required field: thread_ts")
        team, user = self._recipient(channel, params)
        mode_name = params.get("task_display_mode")
        if mode_name is not None and mode_name not in TASK_DISPLAY_MODES:
            raise _invalid_arguments(f"invalid task_display_mode {mode_name!r}")
        text, chunks, mode = _stream_content(params)
        if len(text) > MAX_TEXT:
            raise _ApiError("msg_too_long")
        self._rate_check("chat.startStream", channel, self.post_interval)
        now = time.monotonic()
        stream = FakeSlackStream(
            started=now,
            expires=now + self.stream_timeout,
            recipient_team_id=team,
            recipient_user_id=user,
            task_display_mode=mode_name,
            mode=mode,
            chunks=list(chunks),
        )
        root = self._open_thread(channel, thread_ts)
        msg = FakeSlackMessage(
            channel, self.new_ts(), BOT_USER_ID, text, bot=True, thread_ts=root, stream=stream
        )
        self._store(msg)
        return {"channel": channel, "ts": msg.ts}

    def _recipient(self, channel: str, params: JSON) -> tuple[str | None, str | None]:
        """recipient_team_id and recipient_user_id: required outside a DM."""
        team = str(params.get("recipient_team_id") or "") or None
        user = str(params.get("recipient_user_id") or "") or None
        if not channel.startswith("D"):
            if team is None:
                raise _ApiError("missing_recipient_team_id")
            if user is None:
                raise _ApiError("missing_recipient_user_id")
        if user is not None and user not in self.users:
            raise _ApiError("user_not_found")
        return team, user

    def _chat_append_stream(self, params: JSON) -> JSON:
        msg, stream = self._open_stream(params, appending=True)
        text, chunks, mode = _stream_content(params)
        if mode is None:
            raise _ApiError("markdown_text_or_chunks_required")
        _check_growth(msg, stream, text, mode)
        self._rate_check("chat.appendStream", msg.channel, self.append_interval)
        _grow(msg, stream, text, chunks, mode)
        msg.appends.append(text)
        return {"channel": msg.channel, "ts": msg.ts}

    def _chat_stop_stream(self, params: JSON) -> JSON:
        msg, stream = self._open_stream(params, appending=False)
        text, chunks, mode = _stream_content(params)
        blocks = params.get("blocks") or None
        if blocks is not None and _block_errors(blocks):
            raise _ApiError("invalid_blocks", extra={"errors": _block_errors(blocks)})
        metadata = params.get("metadata")
        if metadata is not None and not _valid_metadata(metadata):
            raise _ApiError("invalid_metadata_format")
        _check_growth(msg, stream, text, mode)
        _grow(msg, stream, text, chunks, mode)
        stream.ended_by, stream.final_text, stream.metadata = "bot", text, metadata
        if blocks is not None:
            msg.blocks = blocks
        return {"channel": msg.channel, "ts": msg.ts, "message": self._api_message(msg)}

    def _open_stream(
        self, params: JSON, *, appending: bool
    ) -> tuple[FakeSlackMessage, FakeSlackStream]:
        """The streaming message chat.appendStream / chat.stopStream name, and its stream."""
        channel = _require_channel(params)
        ts = str(params.get("ts") or "")
        if not ts:
            raise _invalid_arguments("missing required field: ts")
        msg = self.message(channel, ts)
        if msg is None:
            raise _ApiError("message_not_found")
        if not msg.bot:
            raise _ApiError("message_not_owned_by_app")
        stream = msg.stream
        if stream is None:
            raise _ApiError("message_not_in_streaming_state")
        stream.expire(time.monotonic())
        if stream.ended_by == "user" and appending:
            raise _ApiError("stopped_by_user")
        if stream.ended_by is not None:
            raise _ApiError("message_not_in_streaming_state")
        return msg, stream

    # ------------------------------------------------------------------ assistant threads

    def _check_assistant(self) -> None:
        if not self.assistant:
            raise _ApiError(NOT_AGENT_APP)

    def _assistant_threads_set_status(self, params: JSON) -> JSON:
        channel = _require_channel_id(params)
        self._check_assistant()
        thread_ts = str(params.get("thread_ts") or "")
        if not thread_ts:
            raise _invalid_arguments("missing required field: thread_ts")
        if not _TS.fullmatch(thread_ts):
            raise _ApiError("invalid_thread_ts")
        status = params.get("status")
        if not isinstance(status, str):
            raise _invalid_arguments("missing required field: status")
        loading = params.get("loading_messages")
        if loading is not None and not (
            isinstance(loading, list)
            and len(loading) <= MAX_LOADING_MESSAGES
            and all(isinstance(m, str) and m for m in loading)
        ):
            raise _invalid_arguments(
                f"loading_messages must be a list of at most {MAX_LOADING_MESSAGES} strings"
            )
        self.statuses.append((channel, thread_ts, status))
        key = (channel, self._thread_root(channel, thread_ts))
        if status:
            self._status[key] = (status, time.monotonic())
        else:
            self._status.pop(key, None)
        return {}

    def _assistant_threads_set_suggested_prompts(self, params: JSON) -> JSON:
        channel = _require_channel_id(params)
        self._check_assistant()
        thread_ts = str(params.get("thread_ts") or "") or None
        if thread_ts is not None and not _TS.fullmatch(thread_ts):
            raise _ApiError("invalid_thread_ts")
        title = params.get("title")
        if title is not None and not isinstance(title, str):
            raise _invalid_arguments("title must be a string")
        prompts = _check_prompts(params.get("prompts"))
        self.suggested_prompts.append(
            {"channel": channel, "thread_ts": thread_ts, "title": title, "prompts": prompts}
        )
        return {}


# ---------------------------------------------------------------------- helpers


async def _read_params(request: web.Request) -> tuple[JSON, str | None]:
    """Merge query string, JSON body and form body; pop the token (header or ``token``)."""
    params: JSON = dict(request.query)
    raw = await request.read()
    if raw:
        if request.content_type == "application/json":
            body = json.loads(raw)
            if isinstance(body, dict):
                params.update(body)
        else:
            params.update(dict(parse_qsl(raw.decode(), keep_blank_values=True)))
    for key in ("blocks", "attachments", "chunks", "prompts", "loading_messages", "metadata"):
        value = params.get(key)
        if isinstance(value, str):
            try:
                params[key] = json.loads(value) if value else None
            except ValueError:
                params[key] = value
    token = params.pop("token", None)
    auth = request.headers.get("Authorization", "")
    if auth.startswith("Bearer "):
        token = auth.removeprefix("Bearer ").strip()
    return params, token


async def _upload_body(request: web.Request) -> bytes:
    """The bytes POSTed to an upload URL: the raw body, or the file part of a form."""
    if request.content_type != "multipart/form-data":
        return await request.read()
    reader = await request.multipart()
    while True:
        part = await reader.next()
        if part is None:
            return b""
        if isinstance(part, aiohttp.BodyPartReader) and (
            part.filename is not None or part.name in ("file", "filename")
        ):
            return await part.read(decode=False)


def _invalid_arguments(message: str) -> _ApiError:
    return _ApiError(
        "invalid_arguments", extra={"response_metadata": {"messages": [f"[ERROR] {message}"]}}
    )


def _file_not_found(reason: str) -> _ApiError:
    """``file_not_found`` ("could not find the file from the upload ticket"), with the
    fake's reason in ``response_metadata`` (Slack's own answer carries no reason)."""
    return _ApiError(
        "file_not_found", extra={"response_metadata": {"messages": [f"[ERROR] {reason}"]}}
    )


def _upload_length(value: object) -> int:
    text = "" if value is None else str(value)
    if not text:
        raise _invalid_arguments("missing required field: length")
    if isinstance(value, bool) or not re.fullmatch(r"-?[0-9]+", text):
        raise _invalid_arguments("invalid type for field: length (expected integer)")
    length = int(text)
    if length == 0:
        raise _ApiError("missing_argument")  # Slack's documented answer to length=0
    if length < 0:
        raise _invalid_arguments("length must be a positive integer")
    return length


def _upload_entries(raw: object) -> dict[str, str | None]:
    """``files`` of files.completeUploadExternal (a JSON list of ``{id, title?}``) as
    id -> title, in order."""
    try:
        items = json.loads(raw) if isinstance(raw, str) else raw
    except ValueError:
        raise _invalid_arguments("files must be a JSON array") from None
    if not isinstance(items, list) or not items:
        raise _invalid_arguments("missing required field: files")
    entries: dict[str, str | None] = {}
    for item in items:
        if not isinstance(item, dict) or not isinstance(item.get("id"), str):
            raise _invalid_arguments("every file needs an id")
        if item["id"] in entries:
            raise _invalid_arguments(f"file {item['id']} is listed twice")
        title = item.get("title")
        entries[item["id"]] = str(title) if title else None
    return entries


def _share_targets(params: JSON) -> list[str]:
    """Where files.completeUploadExternal shares: ``channel_id`` or comma-separated
    ``channels``; neither keeps the files private. Any non-empty id is a channel, as in
    chat.postMessage."""
    if "channel_id" in params:
        channel = params["channel_id"]
        if not channel or not isinstance(channel, str):
            raise _ApiError("invalid_channel")
        return [channel]
    raw = params.get("channels")
    if raw is None:
        return []
    targets = [c.strip() for c in str(raw).split(",")]
    if not all(targets):
        raise _ApiError("invalid_channel")
    return targets


def _guess_mimetype(name: str) -> str:
    return mimetypes.guess_type(name, strict=False)[0] or "application/octet-stream"


def _guess_filetype(name: str) -> str:
    ext = name.rpartition(".")[2].lower() if "." in name else ""
    filetype = _FILETYPES.get(ext, ext)
    return filetype if filetype in _KNOWN_FILETYPES else "binary"


def _rich_text_blocks(text: str, mention: bool) -> list[JSON]:
    elements: list[JSON] = [{"type": "text", "text": text}]
    if mention:
        elements = [
            {"type": "user", "user_id": BOT_USER_ID},
            {"type": "text", "text": f" {text}"},
        ]
    return [
        {
            "type": "rich_text",
            "block_id": uuid.uuid4().hex[:5],
            "elements": [{"type": "rich_text_section", "elements": elements}],
        }
    ]


def _stream_content(params: JSON) -> tuple[str, list[JSON], str | None]:
    """The markdown a stream call adds, its chunks, and its kind: ``markdown_text``,
    ``chunks``, or None when it carries nothing (an empty ``chunks`` list included)."""
    markdown = params.get("markdown_text")
    chunks = params.get("chunks")
    if markdown not in (None, "") and chunks not in (None, []):
        raise _ApiError("cannot_provide_both_markdown_text_and_chunks")
    if chunks not in (None, []):
        checked = _check_chunks(chunks)
        text = "".join(c["text"] for c in checked if c["type"] == "markdown_text")
        return text, checked, "chunks"
    if markdown in (None, ""):
        return "", [], None
    if not isinstance(markdown, str):
        raise _invalid_arguments("markdown_text must be a string")
    if len(markdown) > MAX_MARKDOWN_TEXT:
        raise _invalid_arguments(
            f"must be less than {MAX_MARKDOWN_TEXT + 1} characters [json-pointer:/markdown_text]"
        )
    return markdown, [], "markdown_text"


def _check_chunks(raw: object) -> list[JSON]:
    if not isinstance(raw, list):
        errors = ["must be an array [json-pointer:/chunks]"]
        raise _ApiError("invalid_chunks", extra={"errors": errors})
    errors = [e for i, chunk in enumerate(raw) for e in _chunk_errors(chunk, f"/chunks/{i}")]
    if errors:
        raise _ApiError("invalid_chunks", extra={"errors": errors})
    return raw


def _chunk_errors(chunk: object, pointer: str) -> list[str]:
    if not isinstance(chunk, dict) or chunk.get("type") not in CHUNK_FIELDS:
        return [f"unsupported chunk type [json-pointer:{pointer}/type]"]
    missing = [f for f in CHUNK_FIELDS[chunk["type"]] if chunk.get(f) in (None, "")]
    if missing:
        return [f"missing required field: {f} [json-pointer:{pointer}]" for f in missing]
    if chunk["type"] == "markdown_text":
        text = chunk["text"]
        if not isinstance(text, str) or len(text) > MAX_MARKDOWN_TEXT:
            return [
                f"must be a string of less than {MAX_MARKDOWN_TEXT + 1} characters "
                f"[json-pointer:{pointer}/text]"
            ]
    if chunk["type"] == "task_update" and chunk["status"] not in TASK_STATUSES:
        return [f"invalid status [json-pointer:{pointer}/status]"]
    if chunk["type"] == "blocks":
        return [f"{e} (in {pointer})" for e in _block_errors(chunk["blocks"])]
    return []


def _check_growth(
    msg: FakeSlackMessage, stream: FakeSlackStream, text: str, mode: str | None
) -> None:
    if mode is not None and stream.mode is not None and mode != stream.mode:
        raise _ApiError("streaming_mode_mismatch")
    if len(msg.text) + len(text) > MAX_TEXT:
        raise _ApiError("msg_too_long")


def _grow(
    msg: FakeSlackMessage, stream: FakeSlackStream, text: str, chunks: list[JSON], mode: str | None
) -> None:
    stream.mode = stream.mode or mode
    stream.chunks.extend(chunks)
    msg.text += text


def _valid_metadata(metadata: object) -> bool:
    return (
        isinstance(metadata, dict)
        and isinstance(metadata.get("event_type"), str)
        and isinstance(metadata.get("event_payload", {}), dict)
    )


def _check_prompts(raw: object) -> list[JSON]:
    if not isinstance(raw, list) or not 1 <= len(raw) <= MAX_PROMPTS:
        raise _invalid_arguments(f"prompts must be a list of 1 to {MAX_PROMPTS} prompts")
    for i, prompt in enumerate(raw):
        if not isinstance(prompt, dict) or not all(
            isinstance(prompt.get(key), str) and prompt[key] for key in ("title", "message")
        ):
            raise _invalid_arguments(f"prompts[{i}] needs a title and a message")
    return [dict(p) for p in raw]


def _require_channel_id(params: JSON) -> str:
    channel = params.get("channel_id")
    if not channel or not isinstance(channel, str):
        raise _ApiError("channel_not_found")
    return channel


def _require_channel(params: JSON) -> str:
    channel = params.get("channel")
    if not channel or not isinstance(channel, str):
        raise _ApiError("channel_not_found")
    return channel


def _validate_content(params: JSON) -> None:
    text = params.get("text")
    blocks = params.get("blocks")
    if text is not None and len(str(text)) > MAX_TEXT:
        raise _ApiError("msg_too_long")
    if blocks is not None:
        errors = _block_errors(blocks)
        if errors:
            raise _ApiError("invalid_blocks", extra={"errors": errors})
    if not text and not blocks and not params.get("attachments"):
        raise _ApiError("no_text")


def _block_errors(blocks: object) -> list[str]:
    return slack_blocks.recorded(_errors_of_blocks(blocks))


def _errors_of_blocks(blocks: object) -> list[str]:
    if not isinstance(blocks, list):
        return ["must be an array [json-pointer:/blocks]"]
    if len(blocks) > MAX_BLOCKS:
        return [f"must be less than {MAX_BLOCKS + 1} items [json-pointer:/blocks]"]
    errors: list[str] = []
    markdown_total = 0
    for i, block in enumerate(blocks):
        pointer = f"/blocks/{i}"
        if not isinstance(block, dict) or not isinstance(block.get("type"), str):
            errors.append(f"missing required field: type [json-pointer:{pointer}]")
            continue
        if block["type"] == "markdown":
            markdown_total += len(str(block.get("text", "")))
        errors.extend(_section_errors(block, pointer))
        errors.extend(_element_errors(block, pointer))
    if markdown_total > MAX_MARKDOWN_TEXT:
        errors.append(f"markdown text must be less than {MAX_MARKDOWN_TEXT + 1} characters")
    return errors or slack_blocks.model_errors(blocks)


def _section_errors(block: JSON, pointer: str) -> list[str]:
    if block["type"] != "section":
        return []
    text = block.get("text")
    if isinstance(text, dict) and len(str(text.get("text", ""))) > MAX_SECTION_TEXT:
        return [
            f"failed to match all allowed schemas [json-pointer:{pointer}/text]",
            f"must be less than {MAX_SECTION_TEXT + 1} characters "
            f"[json-pointer:{pointer}/text/text]",
        ]
    if not text and not block.get("fields"):
        return [f"must provide text or fields [json-pointer:{pointer}]"]
    return []


def _element_errors(block: JSON, pointer: str) -> list[str]:
    elements: list[tuple[str, object]] = []
    if isinstance(block.get("accessory"), dict):
        elements.append((f"{pointer}/accessory", block["accessory"]))
    if block["type"] == "actions" and isinstance(block.get("elements"), list):
        elements.extend((f"{pointer}/elements/{j}", e) for j, e in enumerate(block["elements"]))
    errors: list[str] = []
    for where, element in elements:
        if not isinstance(element, dict):
            continue
        action_id = element.get("action_id")
        if isinstance(action_id, str) and len(action_id) > MAX_ACTION_ID:
            errors.append(
                f"must be less than {MAX_ACTION_ID + 1} characters [json-pointer:{where}/action_id]"
            )
        value = element.get("value")
        if element.get("type") == "button" and isinstance(value, str):
            if len(value) > MAX_BUTTON_VALUE:
                errors.append(
                    f"must be less than {MAX_BUTTON_VALUE + 1} characters "
                    f"[json-pointer:{where}/value]"
                )
    return errors


def _find_button(blocks: list[JSON], action_id: str) -> tuple[str, JSON | None]:
    for block in blocks:
        candidates: list[Any] = (
            list(block.get("elements") or []) if block.get("type") == "actions" else []
        )
        if isinstance(block.get("accessory"), dict):
            candidates.append(block["accessory"])
        for element in candidates:
            if isinstance(element, dict) and element.get("action_id") == action_id:
                return str(block.get("block_id") or uuid.uuid4().hex[:5]), element
    return uuid.uuid4().hex[:5], None


def _channel_name(channel: str) -> str:
    return "directmessage" if channel.startswith("D") else channel.lower()


def block_text(blocks: list[JSON] | None) -> str:
    """Concatenated text of section (text and fields) and markdown blocks, newline-separated."""
    parts: list[str] = []
    for block in blocks or []:
        kind = block.get("type")
        if kind == "markdown" and isinstance(block.get("text"), str):
            parts.append(block["text"])
        elif kind == "section":
            text = block.get("text")
            if isinstance(text, dict) and isinstance(text.get("text"), str):
                parts.append(text["text"])
            for f in block.get("fields") or []:
                if isinstance(f, dict) and isinstance(f.get("text"), str):
                    parts.append(f["text"])
    return "\n".join(parts)
