"""Slack, on slack-bolt (async): Socket Mode (default) or HTTP (Events API).

Conversations are `ConvKey("slack", channel, thread_ts or None)`: a DM's top-level
messages are one conversation, a thread (in a DM or a channel) is its own. A mention in a
channel is answered in that message's thread, and later replies there continue without a
new mention. When Tandem is first mentioned inside an existing thread, the thread is read
once (`conversations.replies`) and its earlier messages travel as `UserMessage.context`.

Tandem takes part in a thread once it was addressed there: the store knows (whichever
worker heard the mention, before a restart too), and this process remembers it. A reply
in a thread the store does not know costs one `conversations.replies`: the thread is
active if Tandem has posted in it. Threads found inactive are remembered, so a busy
channel costs at most one look-up per thread per process (the store is still asked
first: another worker may have joined the thread since).

Tandem serves one workspace: `slack.team_id`, else the one `auth.test` names at start
(with neither, it does not start). An event, button press or slash command that names
another workspace (the envelope's `team_id`, the event's `team`/`user_team`, the press's
`team.id`/`user.team_id`) is acked and dropped before any listener sees it, in both modes;
each such workspace is logged once. A payload that names none is let through.

Every event, press and command is acked once the core has recorded it (bolt's
`process_before_response`): a worker killed before the ack loses nothing, since Slack
sends the payload again (to another worker), and one conversation's events are recorded
in the order Slack sends them. A payload no listener takes is acked too (bolt's default,
a 404, makes Slack send it again). In HTTP mode a signed body bolt could not read is a 400
with one log line (`_signed_only`, `render.odd_shape`); a request that hits a bug in
Tandem's own code is logged with its traceback (`_failed`).

Inbound is handed to `Hub.submit`, which checks access first (`bot.access`: ids, and the
user's workspace against the bot's) and returns at once; a stranger gets the hub's refusal,
privately. Each message's ref `slack:<channel>:<ts>` makes the `app_mention`/`message`
pair, Slack's retries and Socket Mode redeliveries collapse into one answer, across
restarts too.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import time
from collections import OrderedDict
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from functools import partial
from typing import Any, TypeVar

import aiohttp
from aiohttp import web
from slack_bolt.adapter.socket_mode.async_handler import AsyncSocketModeHandler
from slack_bolt.async_app import AsyncAck, AsyncApp
from slack_bolt.error import BoltUnhandledRequestError
from slack_bolt.request.internals import parse_body
from slack_bolt.response import BoltResponse
from slack_sdk.errors import SlackApiError, SlackClientError
from slack_sdk.http_retry.async_handler import AsyncRetryHandler
from slack_sdk.http_retry.builtin_async_handlers import async_default_handlers
from slack_sdk.http_retry.request import HttpRequest
from slack_sdk.http_retry.response import HttpResponse
from slack_sdk.http_retry.state import RetryState
from slack_sdk.signature import SignatureVerifier
from slack_sdk.web.async_client import AsyncWebClient
from slack_sdk.web.async_slack_response import AsyncSlackResponse

from adapters import slack_render as render
from adapters.live import (
    FINAL_DEADLINE_S,
    QUEUED,
    THINKING,
    LiveMessage,
    Paused,
    RetryLater,
    paused_for_approval,
)
from adapters.slack_files import SlackFiles, missing_scopes
from adapters.slack_files import check as check_files
from adapters.slack_render import (
    PLATFORM,
    Incoming,
    extract_message,
    parse_command,
    slack_text,
)
from adapters.slack_stream import SlackStream, Where
from bot.app import Dispatch
from bot.buttons import STALE, ApprovalButton, ButtonData, CancelButton, ItemButton, unpack
from bot.config import Config
from bot.errors import ConfigError, StoreError, TandemError
from bot.events import (
    ApprovalRequested,
    ApprovalResolved,
    Cancel,
    Command,
    ConvKey,
    Decision,
    Event,
    Inbound,
    Notice,
    Progress,
    Queued,
    Suspended,
    TurnEnded,
    TurnStarted,
    User,
    UserMessage,
)
from bot.hub import Hub
from bot.llm.failures import cause
from bot.watch import PlatformCall, Watch

log = logging.getLogger(__name__)
CONNECT_TIMEOUT_S, READ_TIMEOUT_S = 10.0, 60.0
"""Slack calls: time to connect, and the longest silence while reading an answer."""
T = TypeVar("T")
Live = LiveMessage[str | None]
NETWORK_ERRORS = (SlackApiError, aiohttp.ClientError, TimeoutError)
MEMORY = 10_000
"""Entries kept in each in-memory map (seen events, threads, cards, names)."""
CONTEXT_MESSAGES = 50


class SlackUnavailable(TandemError):
    """Slack could not be reached at start."""


def _retry_after(exc: BaseException) -> float | None:
    """Seconds to wait before trying again, or None when retrying cannot help."""
    if isinstance(exc, SlackApiError):
        status = exc.response.status_code
        if status == 429:
            headers = exc.response.headers or {}
            raw = headers.get("Retry-After") or headers.get("retry-after") or 1
            return max(float(raw), 0.1)
        return 2.0 if status >= 500 else None
    return 2.0  # network trouble


class _Failures(AsyncRetryHandler):
    """Tells `watch` of each Web API attempt that failed (`PlatformCall`: its HTTP status,
    429 when Slack limits the rate, 0 when no answer came). slack_sdk asks its retry
    handlers about every answer; this one, asked first, never retries."""

    def __init__(self, watch: Watch) -> None:
        super().__init__(max_retry_count=0)
        self.watch = watch

    async def can_retry_async(self, *, state: RetryState, request: HttpRequest,
                              response: HttpResponse | None = None,
                              error: Exception | None = None) -> bool:
        status = response.status_code if response is not None else 0
        if status >= 400 or status == 0:
            method = request.url.partition("?")[0].rpartition("/")[2]
            method = method if _METHOD.fullmatch(method) else "other"  # an upload URL
            await self.watch.see(PlatformCall(PLATFORM, method, status))
        return False


_METHOD = re.compile(r"[a-z]+(\.[A-Za-z]+)+")
"""A Web API method's name (`chat.postMessage`), as a metric's label."""


def _signed_only(secret: str) -> Any:
    """Refuse (401) anything not signed with `secret` within 5 minutes, malformed headers
    and bodies that are not UTF-8 (Slack's signature is over UTF-8 text) included, and
    (400, one log line) a signed body bolt could not read, before bolt parses it: bolt
    would answer that with a 500, which Slack retries. Whatever bolt still raises outside
    its own error handling (building its request, or in that handler) is answered as
    `_failed` decides, never with aiohttp's 500 and traceback."""
    verifier = SignatureVerifier(secret)

    def signed(body: bytes, stamp: str, signature: str) -> bool:
        try:
            return stamp.isdigit() and verifier.is_valid(body=body.decode(), timestamp=stamp,
                                                         signature=signature)
        except UnicodeDecodeError:
            return False

    @web.middleware
    async def check(request: web.Request, handler: Any) -> web.StreamResponse:
        body = await request.read()
        if not signed(body, request.headers.get("X-Slack-Request-Timestamp", ""),
                      request.headers.get("X-Slack-Signature", "")):
            return web.json_response({"error": "invalid request"}, status=401)
        problem = _unreadable(body, request.content_type, request.charset)
        if problem is not None:
            log.warning("slack: refused a signed request whose body is %s", problem)
            return web.json_response({"error": "invalid payload"}, status=400)
        try:
            response: web.StreamResponse = await handler(request)
        except web.HTTPException:
            raise
        except Exception as exc:  # past bolt's own error handler; see `_failed`
            return web.json_response({"error": "request failed"}, status=_failed(exc))
        return response

    return check


def _unreadable(raw: bytes, content_type: str, charset: str | None) -> str | None:
    """What is wrong with a request body, read the way bolt reads it (JSON, or a form with
    a JSON `payload`, or a slash command's form); None when nothing is."""
    try:
        body = parse_body(raw.decode(charset or "utf-8"), content_type)
    except (UnicodeDecodeError, LookupError):
        return f"not {charset or 'UTF-8'} text"
    except ValueError:
        return "not valid JSON"
    if not isinstance(body, dict):
        return "not a JSON object"
    if not (isinstance(body.get("type"), str) or "command" in body or "ssl_check" in body):
        return "without a type"
    odd = render.odd_shape(body)
    return None if odd is None else f"misshapen: {odd}"


async def _on_bolt_error(error: Exception, body: dict[str, Any],
                         response: BoltResponse | None) -> BoltResponse | None:
    """Bolt's error handler (`app.error`), in both modes, for what its dispatch raised.

    A payload no listener takes (an event or interaction Tandem does not handle) is acked
    with an empty 200: bolt's default is a 404 that Slack retries. Any other error is
    logged once by `_failed`; when it came before the ack (after one, bolt passes no
    `response`), the request is answered with the status `_failed` picks."""
    if isinstance(error, BoltUnhandledRequestError):
        log.debug("slack: acked a %s payload that nothing handles",
                  _str(body.get("type")) or "typeless")
        return BoltResponse(status=200, body="")
    status = _failed(error)
    return None if response is None else BoltResponse(status=status, body="")


def _failed(error: BaseException) -> int:
    """Log what handling a request raised, once, and the status to answer it with.

    Raised with Tandem's code on the stack (a listener, the workspace check): Tandem's bug,
    logged with its traceback, a 500. Raised inside slack-bolt alone: a payload of a shape
    `render.odd_shape` does not know that bolt could not read, one line, a 400 (Slack
    retries a 5xx, and the same payload would fail the same way again)."""
    if _raised_in_tandem(error):
        log.error("slack: handling a request failed", exc_info=error)
        return 500
    what = f"{type(error).__name__}: {error}".replace("\n", " ")[:200]
    log.warning("slack: refused a payload slack-bolt could not read (%s)", what)
    return 400


def _raised_in_tandem(error: BaseException) -> bool:
    """Whether a frame of Tandem's (`adapters`, `bot`) lies between the frame that caught
    `error` and the one that raised it."""
    tb = error.__traceback__.tb_next if error.__traceback__ is not None else None
    while tb is not None:
        if str(tb.tb_frame.f_globals.get("__name__", "")).startswith(("adapters.", "bot.")):
            return True
        tb = tb.tb_next
    return False


def _home_team(configured: str | None, auth: AsyncSlackResponse) -> str:
    """The bot's workspace: `slack.team_id`, which must be the token's, else the token's
    as `auth.test` names it. Without one, Tandem could not tell members from outsiders."""
    told = _str(auth.get("team_id"))
    if configured and told and configured != told:
        raise ConfigError("slack.team_id", f"is {configured}, but slack.bot_token belongs "
                          f"to the workspace {told}")
    if not (configured or told):
        raise ConfigError("slack.team_id", "is not set and Slack's auth.test did not name "
                          "the bot's workspace; set it to the workspace id (T…)")
    return configured or told


async def _ignore() -> None:
    """Acks an event Tandem has no use for."""


def _dict(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _str(value: Any) -> str:
    return value if isinstance(value, str) else ""


def _ts_order(ts: str) -> tuple[int, ...]:
    """Slack timestamps ("1700000000.000100") in time order."""
    return tuple(int(p) for p in ts.split(".") if p.isdigit())


def _remember(store: OrderedDict[Any, Any], key: Any, value: Any = True) -> None:
    store[key] = value
    store.move_to_end(key)
    while len(store) > MEMORY:
        store.popitem(last=False)


class SlackAdapter:
    def __init__(self, config: Config, hub: Hub, *, min_edit_interval: float = 1.0,
                 placeholder_delay: float = 0.5) -> None:
        self.config = config
        self.slack = config.slack
        self.hub = hub
        self.min_edit_interval = min_edit_interval
        self.placeholder_delay = placeholder_delay
        """A turn that ends sooner is posted as one message, with no placeholder."""
        self.url: str | None = None
        """HTTP mode: the events endpoint as bound (port 0 picks a free port)."""
        self.bot_user = ""
        self.bot_id = ""
        self.team: str | None = None
        self._client: AsyncWebClient | None = None
        self._session: aiohttp.ClientSession | None = None
        self.files = SlackFiles(config.slack.bot_token or "", config.slack.base_url)
        self._socket: AsyncSocketModeHandler | None = None
        self._runner: web.AppRunner | None = None
        self._closed = False
        self._inflight: set[asyncio.Task[Any]] = set()
        self._live: dict[ConvKey, Live | SlackStream] = {}
        self._holds: dict[str, float] = {}
        self._seen: OrderedDict[tuple[str, str], bool] = OrderedDict()
        self._threads: OrderedDict[tuple[str, str], bool] = OrderedDict()
        self._read: OrderedDict[tuple[str, str], list[dict[str, Any]]] = OrderedDict()
        """Threads read and found without Tandem, with what was said there since: joined
        later, they are not read again."""
        self._lookups: dict[tuple[str, str], asyncio.Future[list[dict[str, Any]] | None]] = {}
        self._cards: OrderedDict[str, tuple[str, str, list[render.Block]]] = OrderedDict()
        self._card_at: OrderedDict[tuple[str, str], str] = OrderedDict()
        """(channel, ts) of decided cards: their approvals (a press on one is told so)."""
        self._paused: Paused[ConvKey, str | None] = Paused(self._delete)
        """A turn waiting for approval: its placeholder (saying so) and its text."""
        self._askers: OrderedDict[ConvKey, str] = OrderedDict()
        """Who last spoke to Tandem in each conversation (a stream in a channel is for
        them)."""
        self._no_streams: set[str] = set()
        """Channels where Slack refused a stream."""
        self._names: OrderedDict[str, str] = OrderedDict()
        self._told: OrderedDict[tuple[str, str], bool] = OrderedDict()
        """(channel, stranger) already told that Tandem does not serve them (once per chat
        and process)."""
        self._foreign: OrderedDict[str, bool] = OrderedDict()
        """Other workspaces whose payloads were dropped (each is logged once)."""

    # -- lifecycle --------------------------------------------------------------------

    async def start(self) -> None:
        # slack_sdk's own timeout does not reach a session it is given: this one's limits
        # keep a Slack that accepts and never answers from holding a call for minutes
        self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(
            total=None, sock_connect=CONNECT_TIMEOUT_S, sock_read=READ_TIMEOUT_S))
        base = _slash(self.slack.base_url)
        self._client = AsyncWebClient(
            token=self.slack.bot_token, base_url=base, session=self._session,
            retry_handlers=[_Failures(self.hub.d.watch), *async_default_handlers()])
        self.files.client, self.files.session = self._client, self._session
        try:
            auth = await self._client.auth_test()
        except SlackApiError as exc:
            await self.stop()
            raise ConfigError("slack.bot_token", "was rejected by Slack "
                              f"({exc.response.get('error')})") from None
        except (aiohttp.ClientError, TimeoutError) as exc:
            await self.stop()
            raise SlackUnavailable(f"slack: cannot reach {base} ({type(exc).__name__})") from None
        self.bot_user, self.bot_id = str(auth["user_id"]), str(auth.get("bot_id") or "")
        try:
            self.team = _home_team(self.slack.team_id, auth)
        except ConfigError:
            await self.stop()
            raise
        self.hub.access.set_home_team(PLATFORM, self.team)  # "*" means: this workspace
        if missing := missing_scopes(auth.headers):
            log.warning("slack: the bot token lacks %s: files shared with Tandem cannot be "
                        "fetched or sent (add the scopes and reinstall the app)",
                        ", ".join(missing))
        if self.hub.access.nobody(PLATFORM):
            log.warning("slack.allowed_users is empty: nobody can use Tandem on Slack")
        app = self._build_app()
        if self.slack.mode == "socket":
            await self._start_socket(app)
        else:
            await self._start_http(app)

    async def _start_socket(self, app: AsyncApp) -> None:
        self._socket = AsyncSocketModeHandler(app, app_token=self.slack.app_token,
                                              web_client=self._client)
        try:
            await self._socket.connect_async()  # type: ignore[no-untyped-call]
        except SlackApiError as exc:
            await self.stop()
            raise ConfigError("slack.app_token", "was rejected by Slack "
                              f"({exc.response.get('error')})") from None
        except (aiohttp.ClientError, TimeoutError) as exc:
            await self.stop()
            raise SlackUnavailable(f"slack: cannot open the Socket Mode connection "
                                   f"({type(exc).__name__})") from None

    async def _start_http(self, app: AsyncApp) -> None:
        http = self.slack.http
        web_app = app.web_app(path=http.path)
        web_app.middlewares.append(_signed_only(self.slack.signing_secret or ""))
        self._runner = web.AppRunner(web_app, handle_signals=False, access_log=None,
                                     shutdown_timeout=2.0)
        await self._runner.setup()
        try:
            await web.TCPSite(self._runner, http.host, http.port).start()
        except OSError as exc:
            await self.stop()
            raise ConfigError("slack.http.port", f"cannot listen on {http.host}:{http.port} "
                              f"({exc.strerror})") from None
        host, port = self._runner.addresses[0][:2]
        self.url = f"http://{host}:{port}{http.path}"
        log.info("slack: listening for events on %s", self.url)

    def _build_app(self) -> AsyncApp:
        # Unhandled payloads reach `_on_bolt_error` (to be acked); bolt's assistant-thread
        # middleware is left out: Tandem sets the status and prompts itself.
        app = AsyncApp(client=self._client, signing_secret=self.slack.signing_secret or "",
                       name="tandem", raise_error_for_unhandled_request=True,
                       attaching_conversation_kwargs_enabled=False,
                       process_before_response=True)
        app.error(_on_bolt_error)
        app.use(self._same_workspace)
        app.event("app_mention")(self._on_event)
        app.event("message")(self._on_event)  # also acks the subtypes Tandem ignores
        app.event("assistant_thread_started")(self._on_assistant_thread)
        app.event("assistant_thread_context_changed")(_ignore)
        app.action(re.compile(".*"))(self._on_action)
        app.command("/tandem")(self._on_command)
        return app

    async def _same_workspace(self, body: dict[str, Any], resp: BoltResponse,
                              next_: Callable[[], Awaitable[None]]) -> BoltResponse:
        """Bolt middleware: a payload that names another workspace is acked (an empty 200)
        and goes no further; nothing of it reaches a listener or the core."""
        foreign = sorted(render.teams(body) - {self.team or ""})
        if not foreign:
            await next_()
            return resp
        if foreign[0] not in self._foreign:
            _remember(self._foreign, foreign[0])
            log.warning("slack: ignoring payloads from workspace %s (this bot serves %s); "
                        "later ones from it are not logged", foreign[0], self.team)
        return BoltResponse(status=200, body="")

    async def stop(self) -> None:
        self._closed = True
        if self._socket is not None:
            await self._socket.close_async()  # type: ignore[no-untyped-call]
            self._socket = None
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
        if self._inflight:
            await asyncio.wait(self._inflight, timeout=2.0)
            for task in self._inflight:
                task.cancel()
        for live in self._live.values():
            await live.close()
        self._live.clear()
        if self._session is not None:
            await self._session.close()
            self._session = None
            self.files.client = self.files.session = None

    @contextlib.contextmanager
    def _tracked(self) -> Iterator[None]:
        """Listener work runs in bolt's tasks; hold them so stop() can end them."""
        task = asyncio.current_task()
        if task is not None:
            self._inflight.add(task)
        try:
            yield
        finally:
            if task is not None:
                self._inflight.discard(task)

    @property
    def client(self) -> AsyncWebClient:
        assert self._client is not None, "the Slack adapter is not started"
        return self._client

    # -- inbound: messages --------------------------------------------------------------

    async def _on_event(self, event: dict[str, Any]) -> None:
        with self._tracked():
            msg = extract_message(event, self.bot_user)
            if msg is None or self._closed:
                return
            if (msg.channel, msg.ts) in self._seen:
                return  # the same message as app_mention and as message
            _remember(self._seen, (msg.channel, msg.ts))
            await self._on_message(msg)

    async def _on_message(self, msg: Incoming) -> None:
        if not msg.addressed and not await self._in_thread(msg.channel, msg.thread or ""):
            if (read := self._read.get((msg.channel, msg.thread or ""))) is not None:
                read.append({"user": msg.user, "ts": msg.ts, "seen": msg.text})
                del read[:-CONTEXT_MESSAGES - 1]
            return
        who, context = User(msg.user, "", msg.team), None
        if self.hub.access.allows(PLATFORM, who):
            # Only for users the hub will serve (it refuses the others): joining a thread
            # (reading it, answering later replies there) and looking up the name.
            if msg.thread is not None and msg.addressed:
                context = await self._join_thread(msg.channel, msg.thread, msg.ts)
            elif msg.conv.thread_id is not None:
                _remember(self._threads, (msg.channel, msg.conv.thread_id))
            who = await self._who(msg.user, msg.team)
        await self._submit(msg.conv, self._inbound(msg, who, context), who, dm=msg.dm)

    def _inbound(self, msg: Incoming, who: User, context: str | None) -> Inbound:
        ref = f"slack:{msg.channel}:{msg.ts}"
        command = parse_command(msg.text)
        if command is None:
            text = msg.text or ("" if msg.attachments else "(a mention without a message)")
            return UserMessage(msg.conv, who, text, ref=ref, attachments=msg.attachments,
                               context=context)
        name, args = command
        if name in ("stop", "cancel"):
            return Cancel(msg.conv, who, ref=ref)
        return Command(msg.conv, who, name, args, ref=ref)

    async def _submit(self, conv: ConvKey, item: Inbound, who: User, *,
                      dm: bool | None = None) -> None:
        """Hand `item` to the hub; show a refusal to `who` only. For a message (`dm` set)
        a stranger is told once per chat, in the DM or privately in the channel."""
        receipt = await self.hub.submit(item)
        if not receipt.accepted:
            await self._refused(conv, who, receipt.note, dm=dm)
        elif isinstance(item, UserMessage):
            _remember(self._askers, conv, who.id)

    async def _refused(self, conv: ConvKey, who: User, note: str | None, *,
                       dm: bool | None = None) -> None:
        """Show a refusal's note to `who` alone (nothing when it has none: a duplicate)."""
        if not note:
            return
        if dm is not None and note == self.hub.access.refusal(PLATFORM, who):
            await self._tell_stranger(conv, who.id, note, dm=dm)
        else:
            await self._ephemeral(conv, who.id, note)

    async def _in_thread(self, channel: str, thread: str) -> bool:
        """Tandem takes part in this thread (it was addressed or has posted there)."""
        known = self._threads.get((channel, thread))
        if known:
            return True
        if await self.hub.heard_in(ConvKey(PLATFORM, channel, thread)):
            _remember(self._threads, (channel, thread))
            return True
        if known is not None:
            return False
        messages = await self._replies(channel, thread)
        if messages is None:
            return False
        active = any(self._mine(m) for m in messages)
        _remember(self._threads, (channel, thread), active)
        if not active:  # kept (with what is said there next) for when Tandem is asked in
            _remember(self._read, (channel, thread), messages[-CONTEXT_MESSAGES - 1:])
        return active

    async def _join_thread(self, channel: str, thread: str, ts: str) -> str | None:
        """Addressed in a thread: read it once when joining; the earlier messages as text."""
        if self._threads.get((channel, thread)):
            return None
        messages = self._read.pop((channel, thread), None)
        if messages is None:
            messages = await self._replies(channel, thread)
        if self._threads.get((channel, thread)) or messages is None:
            _remember(self._threads, (channel, thread))
            return None
        _remember(self._threads, (channel, thread))
        if any(self._mine(m) for m in messages):
            return None
        earlier = [m for m in messages
                   if _ts_order(str(m.get("ts", ""))) < _ts_order(ts) and not self._mine(m)]
        lines = [f"{await self._name(str(m.get('user', '')))}: "
                 f"{m.get('seen') or slack_text(str(m.get('text') or ''), self.bot_user)}"
                 for m in earlier[-CONTEXT_MESSAGES:]]
        if len(earlier) > CONTEXT_MESSAGES:
            lines.insert(0, f"({len(earlier) - CONTEXT_MESSAGES} older messages not shown)")
        return "\n".join(lines) or None

    async def _replies(self, channel: str, thread: str) -> list[dict[str, Any]] | None:
        """One `conversations.replies` per thread at a time (concurrent askers share it)."""
        key = (channel, thread)
        pending = self._lookups.get(key)
        if pending is not None:
            return await asyncio.shield(pending)
        future: asyncio.Future[list[dict[str, Any]] | None] = \
            asyncio.get_running_loop().create_future()
        self._lookups[key] = future
        result: list[dict[str, Any]] | None = None
        try:
            resp = await self._call(lambda: self.client.conversations_replies(
                channel=channel, ts=thread, limit=200), deadline=30.0)
            result = list(resp.get("messages") or [])
        except NETWORK_ERRORS:
            log.warning("slack: could not read thread %s in %s", thread, channel, exc_info=True)
        finally:
            del self._lookups[key]
            future.set_result(result)
        return result

    def _mine(self, message: dict[str, Any]) -> bool:
        return message.get("user") == self.bot_user or \
            bool(self.bot_id) and message.get("bot_id") == self.bot_id

    async def _tell_stranger(self, conv: ConvKey, user: str, text: str, *, dm: bool) -> None:
        """The hub's refusal (it has the id an admin needs), once per stranger and chat; the hub
        logs it."""
        if (conv.chat_id, user) in self._told:
            return
        _remember(self._told, (conv.chat_id, user))
        if dm:
            await self._post(conv, text)
        else:
            await self._ephemeral(conv, user, text)

    async def _who(self, uid: str, team: str | None) -> User:
        """The core's user: Slack's id and team; the name is looked up (`users.info`) only
        for users the hub serves, since it refuses the others before any name is shown."""
        who = User(uid, "", team)
        if not self.hub.access.allows(PLATFORM, who):
            return who
        return User(uid, await self._name(uid), team)

    async def _name(self, user: str) -> str:
        name = self._names.get(user)
        if name is None:
            try:
                info = (await self.client.users_info(user=user))["user"]
                profile = info.get("profile") or {}
                name = str(profile.get("display_name") or info.get("real_name")
                           or info.get("name") or "")
            except NETWORK_ERRORS:
                log.info("slack: no name for %s", user, exc_info=True)
                name = ""
            _remember(self._names, user, name)
        return name

    # -- inbound: buttons and the slash command -------------------------------------

    async def _on_action(self, ack: AsyncAck, body: dict[str, Any]) -> None:
        await ack()
        with self._tracked():
            await self._press(body)

    async def _press(self, body: dict[str, Any]) -> None:
        user = _dict(body.get("user"))
        uid = _str(user.get("id"))
        container = _dict(body.get("container"))
        channel = _str(container.get("channel_id")) or _str(_dict(body.get("channel")).get("id"))
        if not uid or not channel:
            log.info("Slack: a button press without user or channel ignored")
            return
        message_ts = _str(container.get("message_ts"))
        thread = _str(container.get("thread_ts"))
        # A card Tandem posted at the top of a DM may later become a thread's root.
        conv = ConvKey(PLATFORM, channel, thread if thread and thread != message_ts else None)
        actions = body.get("actions")
        action = _dict(actions[0] if isinstance(actions, list) and actions else None)
        data = unpack(_str(action.get("value"))) or \
            self._card_press(channel, message_ts, _str(action.get("action_id")))
        who = await self._who(uid, _str(user.get("team_id")) or None)
        ref = f"slack:{channel}:{action.get('action_ts')}:{uid}"
        match data:
            case None:
                await self._ephemeral(conv, uid, STALE)
            case CancelButton(turn):
                receipt = await self.hub.cancel(Cancel(conv, who, turn=turn))
                if not receipt.accepted:
                    await self._refused(conv, who, receipt.note)
            case ApprovalButton(approval_id, verdict):
                await self._submit(conv, Decision(conv, who, approval_id, verdict, ref=ref), who)
            case ItemButton() as item:
                await self._submit(conv, Command(conv, who, item.command, item.item_id, ref=ref),
                                   who)

    def _card_press(self, channel: str, ts: str, action_id: str) -> ButtonData | None:
        """A press without usable data on a decided card (a client showing the card as it
        was): the card's approval, so the core answers it ("Already decided…"). On a card
        still pending such a press is forged, and counts for nothing."""
        verdict = next((v for v, a in render.VERDICT_ACTIONS.items() if a == action_id), None)
        approval_id = self._card_at.get((channel, ts))
        if verdict is None or approval_id is None:
            return None
        return ApprovalButton(approval_id, verdict)

    async def _on_command(self, ack: AsyncAck, body: dict[str, Any]) -> None:
        await ack()
        with self._tracked():
            uid, channel = _str(body.get("user_id")), _str(body.get("channel_id"))
            if not uid or not channel:
                log.info("Slack: a slash command without user or channel ignored")
                return
            conv = ConvKey(PLATFORM, channel, None)
            name, args = parse_command("/" + str(body.get("text") or "help").strip()) \
                or ("help", "")
            who = await self._who(uid, _str(body.get("team_id")) or None)
            ref = f"slack:cmd:{body.get('trigger_id')}"
            item: Inbound = Cancel(conv, who) if name in ("stop", "cancel") \
                else Command(conv, who, name, args, ref=ref)
            await self._submit(conv, item, who)

    # -- outbound -----------------------------------------------------------------------

    async def emit(self, event: Event) -> None:
        if self._closed or self._client is None:
            log.debug("slack: stopped; %s dropped", type(event).__name__)
            return
        try:
            await self._render(event)
        except (*NETWORK_ERRORS, RetryLater):
            log.error("slack: could not show %s in %s", type(event).__name__, event.conv,
                      exc_info=True)
        except RuntimeError:  # aiohttp: "Session is closed" when stop() came mid-call
            if not self._closed:
                raise

    async def _render(self, event: Event) -> None:
        match event:
            case TurnStarted() | Progress() | TurnEnded() | Suspended():
                await self._render_turn(event)
            case ApprovalRequested() if event.reminder:
                pass  # the card is still on screen
            case ApprovalRequested():
                await self._card(event)
            case ApprovalResolved():
                await self._resolved(event)
            case Notice(conv=conv, text=text, ephemeral_to=to, buttons=buttons):
                if to is not None:
                    await self._ephemeral(conv, to.id, text)
                else:
                    await self._post(conv, text, buttons)
            case Queued(conv=conv, ref=ref):
                await self._react(conv, ref)

    async def _render_turn(self, event: TurnStarted | Progress | TurnEnded | Suspended) -> None:
        """One live message per turn (a stream, or a placeholder edited): status, the
        answer as it grows, the final text."""
        conv = event.conv
        match event:
            case TurnStarted():
                if (old := self._live.pop(conv, None)) is not None:
                    await old.close()
                await self._paused.settle(conv)
                live = self._live[conv] = self._new_stream(conv, event.turn) or \
                    self._new_live(conv, event.turn)
                await live.open(THINKING, delay=self.placeholder_delay)
            case Progress():
                running = self._live.get(conv)
                if isinstance(running, SlackStream) and event.text:
                    running.answer(event.text)
                elif running is not None:
                    running.update(render.progress_text(event))
            case Suspended():
                await self._suspended(event)
            case TurnEnded():
                await self._ended(event)

    async def _suspended(self, event: Suspended) -> None:
        """The turn waits for approval: its placeholder says so until the turn goes on."""
        conv, text = event.conv, event.text
        waiting = self._live.pop(conv, None)
        if isinstance(waiting, SlackStream) and not waiting.refs:
            await waiting.close()  # only a status line showed: the card says it
            if text.strip():
                await self._post(conv, text)
        elif waiting is not None:
            await waiting.finish(paused_for_approval(text))
            await waiting.close()
            self._paused.park(conv, waiting, text)

    async def _ended(self, event: TurnEnded) -> None:
        conv, text = event.conv, event.text
        ending = self._live.pop(conv, None)
        if ending is None and event.live and isinstance(ts := event.live.get("ts"), str):
            # another process ran the turn and died: its placeholder becomes the answer
            ending = self._new_live(conv, event.turn)
            ending.adopt(ts)
        if ending is not None:
            await ending.finish(text)
            await ending.close()
        elif not await self._paused.settle(conv, text):
            await self._post(conv, text)

    async def _delete(self, conv: ConvKey, ts: str | None) -> None:
        if ts is None:
            return
        channel = conv.chat_id
        try:
            await self._call(partial(self.client.chat_delete, channel=channel, ts=ts),
                             deadline=30.0, channel=channel)
        except NETWORK_ERRORS:
            log.info("slack: could not delete %s in %s", ts, channel, exc_info=True)

    def _new_stream(self, conv: ConvKey, turn: int) -> SlackStream | None:
        """A stream for this turn: in a thread (streams are replies) where Slack has not
        refused one; in a channel only with the person it is for."""
        channel, thread = conv.chat_id, conv.thread_id
        if not self.slack.streaming or thread is None or channel in self._no_streams:
            return None
        dm = channel.startswith("D")
        asker = self._askers.get(conv)
        if not dm and (asker is None or self.team is None):
            return None
        where = Where(channel, thread, None if dm else (self.team or "", asker or ""))
        status = partial(self._assistant_status, channel, thread) \
            if dm and self.slack.assistant.enabled else None
        return SlackStream(self.client, where, min_interval=self.min_edit_interval,
                           live=lambda: self._new_live(conv, turn),
                           refused=self._no_streams.add, status=status)

    async def _assistant_status(self, channel: str, thread: str, text: str) -> None:
        """The assistant thread's status line ("is thinking…", "is running `shell`…")."""
        await self.client.assistant_threads_setStatus(
            channel_id=channel, thread_ts=thread, status=render.assistant_status(text))

    async def _on_assistant_thread(self, event: dict[str, Any]) -> None:
        """A new assistant thread: offer the configured prompts."""
        thread = _dict(event.get("assistant_thread"))
        channel, ts = _str(thread.get("channel_id")), _str(thread.get("thread_ts"))
        prompts = [{"title": p[:75], "message": p} for p in self.slack.assistant.prompts]
        if not channel or not ts or not prompts:
            return
        try:
            await self.client.assistant_threads_setSuggestedPrompts(
                channel_id=channel, thread_ts=ts, prompts=prompts)
        except NETWORK_ERRORS:
            log.warning("slack: could not offer prompts in %s", channel, exc_info=True)

    def _new_live(self, conv: ConvKey, turn: int) -> Live:
        """The turn's live message; where its placeholder lands is kept in the store."""
        kept = False

        async def post(text: str, live: bool) -> str | None:
            nonlocal kept
            ts = await self._live_post(conv, text, live, turn)
            if live and not kept and ts is not None:
                kept = True
                try:
                    await self.hub.remember_live(conv, turn, {"ts": ts})
                except StoreError:  # only a later process's convenience: the turn goes on
                    log.warning("slack: could not keep where turn %d's message is", turn,
                                exc_info=True)
            return ts

        async def edit(ts: str | None, text: str, live: bool) -> None:
            await self._live_edit(conv, ts, text, live, turn)

        return LiveMessage(post, edit, limit=render.SECTION_CHARS,
                           min_interval=self.min_edit_interval,
                           hold=lambda: self._holds.get(conv.chat_id, 0.0))

    def _limited(self, channel: str, exc: BaseException) -> None:
        """Turn "slow down" (429, a 5xx, network trouble) into RetryLater for LiveMessage."""
        wait = _retry_after(exc)
        if wait is not None:
            self._holds[channel] = time.monotonic() + wait
            raise RetryLater(wait) from None

    async def _live_post(self, conv: ConvKey, text: str, live: bool, turn: int) -> str | None:
        if self._closed:
            return None
        out = render.live(text, cancel=live, turn=turn)
        try:
            resp = await self.client.chat_postMessage(
                channel=conv.chat_id, thread_ts=conv.thread_id, text=out.text,
                blocks=out.blocks)
        except NETWORK_ERRORS as exc:
            self._limited(conv.chat_id, exc)
            log.error("slack: could not post in %s", conv, exc_info=True)
            return None
        return str(resp["ts"])

    async def _live_edit(self, conv: ConvKey, ts: str | None, text: str, live: bool,
                         turn: int) -> None:
        if self._closed or ts is None:
            return
        out = render.live(text, cancel=live, turn=turn)
        try:
            await self.client.chat_update(channel=conv.chat_id, ts=ts, text=out.text,
                                          blocks=out.blocks)
        except NETWORK_ERRORS as exc:
            self._limited(conv.chat_id, exc)
            log.warning("slack: could not edit %s in %s", ts, conv, exc_info=True)
            if not live:  # the final text must arrive: as a new message, then
                await self._live_post(conv, text, False, turn)

    async def _call(self, fn: Callable[[], Awaitable[T]], deadline: float = FINAL_DEADLINE_S,
                    channel: str | None = None) -> T:
        """A Web API call, waiting out rate limits and short outages until `deadline`."""
        give_up = time.monotonic() + deadline
        while True:
            try:
                return await fn()
            except NETWORK_ERRORS as exc:
                wait = _retry_after(exc)
                if wait is None or time.monotonic() + wait > give_up or self._closed:
                    raise
                if channel is not None:
                    self._holds[channel] = time.monotonic() + wait
                await asyncio.sleep(wait)

    async def _post_blocks(self, conv: ConvKey, text: str,
                           blocks: list[render.Block]) -> AsyncSlackResponse:
        return await self._call(lambda: self.client.chat_postMessage(
            channel=conv.chat_id, thread_ts=conv.thread_id, text=text, blocks=blocks),
            channel=conv.chat_id)

    async def _post(self, conv: ConvKey, text: str, buttons: tuple[Any, ...] = ()) -> None:
        for out in render.messages(text, buttons):
            await self._post_blocks(conv, out.text, out.blocks)

    async def _ephemeral(self, conv: ConvKey, user: str, text: str) -> None:
        try:
            for out in render.messages(text):
                await self._call(partial(
                    self.client.chat_postEphemeral, channel=conv.chat_id, user=user,
                    thread_ts=conv.thread_id, text=out.text, blocks=out.blocks), deadline=30.0)
        except NETWORK_ERRORS:
            log.warning("slack: could not tell %s privately in %s", user, conv, exc_info=True)

    async def _card(self, event: ApprovalRequested) -> None:
        if (running := self._live.get(event.conv)) is not None:
            await running.show()  # the placeholder goes above the card
        card = render.approval_card(event.approval_id, event.tool, event.summary,
                                    event.requester, event.expires_in_s, reason=event.reason)
        for blocks in card.preamble:
            await self._post_blocks(event.conv, f"The `{event.tool}` call, in full", blocks)
        resp = await self._post_blocks(event.conv, card.text, [*card.blocks, *card.buttons])
        where = (str(resp["channel"]), str(resp["ts"]), card.blocks)
        _remember(self._cards, event.approval_id, where)
        await self.hub.remember_card(event.approval_id, {
            "channel": where[0], "ts": where[1], "blocks": where[2]})

    async def _known_card(self, approval_id: str) -> tuple[str, str, list[Any]] | None:
        """The card of `approval_id`: posted here, else where the store says (another
        worker, or this one before a restart, posted it)."""
        card = self._cards.pop(approval_id, None)
        if card is not None:
            return card
        found = await self.hub.card_of(approval_id)
        if found is None or not isinstance(found.get("blocks"), list):
            return None
        return str(found.get("channel")), str(found.get("ts")), found["blocks"]

    async def _resolved(self, event: ApprovalResolved) -> None:
        line = render.outcome_line(event.outcome, event.by)
        card = await self._known_card(event.approval_id)
        if card is not None:
            channel, ts, blocks = card
            _remember(self._card_at, (channel, ts), event.approval_id)
            try:
                await self._call(lambda: self.client.chat_update(
                    channel=channel, ts=ts, text=line, blocks=render.decided(blocks, line)),
                    channel=channel)
                return
            except SlackApiError:
                log.warning("slack: could not update the card %s", ts, exc_info=True)
        # The line is mrkdwn already (its mention included), not Markdown to convert.
        await self._post_blocks(event.conv, line, [render.section(line)])

    async def _react(self, conv: ConvKey, ref: str | None) -> None:
        prefix = f"slack:{conv.chat_id}:"
        if ref is None or not ref.startswith(prefix):
            return
        try:
            await self._call(lambda: self.client.reactions_add(
                channel=conv.chat_id, timestamp=ref.removeprefix(prefix), name="eyes"),
                deadline=30.0)
        except SlackApiError as exc:
            if exc.response.get("error") == "already_reacted":
                return
            log.warning("slack: could not react in %s (%s)", conv, exc.response.get("error"))
            await self._post(conv, QUEUED)  # reactions off: say it instead


# -- checked live, for `tandem doctor` and `tandem init` --------------------------------

CHECK_TIMEOUT_S = 5
BOT_TOKEN_PREFIXES = ("xoxb-", "xoxe.xoxb-")  # the second: with token rotation on
APP_TOKEN_PREFIX = "xapp-"


@contextlib.asynccontextmanager
async def _checking(token: str, base_url: str) -> AsyncIterator[AsyncWebClient]:
    # The client's own `timeout` applies only to a session it makes itself: this one's
    # is the one that counts (aiohttp's default is 5 minutes).
    limit = aiohttp.ClientTimeout(total=CHECK_TIMEOUT_S)
    async with aiohttp.ClientSession(trust_env=True, timeout=limit) as session:
        yield AsyncWebClient(token=token, base_url=_slash(base_url), session=session,
                             timeout=CHECK_TIMEOUT_S, retry_handlers=[])


def _slash(base_url: str) -> str:
    return base_url if base_url.endswith("/") else base_url + "/"


async def _ask(call: Callable[[], Awaitable[AsyncSlackResponse]],
               base_url: str) -> tuple[str, str, AsyncSlackResponse | None]:
    """("ok", "", the answer), ("refused", Slack's error code, None) or ("unreachable",
    "cannot reach <base_url> (why)", None)."""
    try:
        return "ok", "", await call()
    except SlackApiError as exc:
        return "refused", str(exc.response.get("error") or "an error"), None
    except (SlackClientError, aiohttp.ClientError, TimeoutError, ValueError) as exc:
        return "unreachable", f"cannot reach {base_url} ({cause(exc, CHECK_TIMEOUT_S)})", None


def _whose(auth: AsyncSlackResponse) -> str:
    return f"workspace {_str(auth.get('team'))} ({_str(auth.get('team_id'))}), " \
           f"bot user @{_str(auth.get('user'))}"


async def check_bot_token(token: str, base_url: str) -> tuple[str, str]:
    """Ask Slack whose bot `token` is (auth.test), as `start` does. One of ("ok",
    "workspace <name> (<id>), bot user @<name>"), ("malformed", why), ("refused", Slack's
    error code) or ("unreachable", "cannot reach <base_url> (why)"); never the token."""
    if not token.startswith(BOT_TOKEN_PREFIXES):
        return "malformed", ("not a bot token (it starts with xoxb-: OAuth & Permissions → "
                             "Bot User OAuth Token)")
    async with _checking(token, base_url) as client:
        outcome, text, auth = await _ask(client.auth_test, base_url)
    return (outcome, _whose(auth)) if auth is not None else (outcome, text)


async def check_app_token(token: str, base_url: str) -> tuple[str, str]:
    """Whether Slack lets the app-level `token` open Socket Mode connections
    (apps.connections.open: it hands out an address, nothing connects). Outcomes as
    `check_bot_token`'s; "ok" comes with an empty text."""
    if not token.startswith(APP_TOKEN_PREFIX):
        return "malformed", ("not an app-level token (it starts with xapp-: Basic Information "
                             "→ App-Level Tokens, with the connections:write scope)")
    async with _checking(token, base_url) as client:
        outcome, text, _ = await _ask(partial(client.apps_connections_open, app_token=token),
                                      base_url)
    return outcome, text


def _line(what: str, key: str, outcome: str, text: str) -> tuple[str, str, str]:
    if outcome == "refused":
        return what, "fail", f"Slack refused {key} ({text})"
    if outcome == "malformed":
        return what, "fail", f"{key} is {text}"
    return what, "fail", text


async def check(config: Config) -> list[tuple[str, str, str]]:
    """`tandem doctor`: whether Slack takes slack.bot_token (auth.test), and then whether
    it has the scopes files need; in Socket Mode, at the same time, slack.app_token."""
    slack = config.slack
    if not slack.bot_token:
        return []  # the doctor says so itself
    checks = [_check_bot(config)]
    if slack.mode == "socket" and slack.app_token:
        checks.append(_check_app(config))
    return [line for lines in await asyncio.gather(*checks) for line in lines]


async def _check_bot(config: Config) -> list[tuple[str, str, str]]:
    slack = config.slack
    async with _checking(slack.bot_token or "", slack.base_url) as client:
        outcome, text, auth = await _ask(client.auth_test, slack.base_url)
        if auth is None:
            return [_line("slack", "slack.bot_token", outcome, text)]
        try:
            _home_team(slack.team_id, auth)
        except ConfigError as exc:
            return [("slack", "fail", f"{exc.key} {exc.problem}")]
        return [("slack", "ok", f"signed in to {_whose(auth)} (auth.test)"),
                *await check_files(client)]


async def _check_app(config: Config) -> list[tuple[str, str, str]]:
    outcome, text = await check_app_token(config.slack.app_token or "", config.slack.base_url)
    if outcome == "ok":
        return [("slack app token", "ok", "may open Socket Mode connections "
                 "(apps.connections.open)")]
    return [_line("slack app token", "slack.app_token", outcome, text)]


def create(config: Config, hub: Hub, dispatch: Dispatch, **options: Any) -> SlackAdapter:
    """The Slack platform; `options` go to `SlackAdapter` (e.g. `min_edit_interval`)."""
    slack = config.slack
    if not slack.bot_token:
        raise ConfigError("slack.bot_token", "is required when Slack is enabled")
    if slack.mode == "socket" and not slack.app_token:
        raise ConfigError("slack.app_token", "is required in Socket Mode (slack.mode: socket)")
    if slack.mode == "http" and not slack.signing_secret:
        raise ConfigError("slack.signing_secret", "is required in HTTP mode (slack.mode: http)")
    adapter = SlackAdapter(config, hub, **options)
    dispatch.sinks[PLATFORM] = adapter
    dispatch.ports[PLATFORM] = adapter.files
    return adapter
