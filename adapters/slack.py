"""Slack, on slack-bolt (async): Socket Mode (default) or HTTP (Events API).

Conversations are `ConvKey("slack", channel, thread_ts or None)`: a DM's top-level
messages are one conversation, a thread (in a DM or a channel) is its own. A mention in a
channel is answered in that message's thread, and later replies there continue without a
new mention. When Tandem is first mentioned inside an existing thread, the thread is read
once (`conversations.replies`) and its earlier messages travel as `UserMessage.context`.

Which threads Tandem takes part in is `adapters.slack_threads`'s; what the chat shows is
decided by the shared edge (`adapters.edge`) and done by Slack's primitives
(`adapters.slack_chat`); HTTP mode's checks are in `adapters.slack_http`.

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

Inbound is handed to `Hub.submit`, which checks access first (`bot.serve.access`: ids, and the
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
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

import aiohttp
from aiohttp import web
from slack_bolt.adapter.socket_mode.async_handler import AsyncSocketModeHandler
from slack_bolt.async_app import AsyncAck, AsyncApp
from slack_bolt.response import BoltResponse
from slack_sdk.errors import SlackApiError
from slack_sdk.http_retry.builtin_async_handlers import async_default_handlers
from slack_sdk.web.async_client import AsyncWebClient

from adapters import slack_render as render
from adapters.edge import Edge, EdgeTimings
from adapters.slack_chat import SlackChat
from adapters.slack_check import check, check_app_token, check_bot_token, home_team, slash
from adapters.slack_files import SlackFiles, missing_scopes
from adapters.slack_http import Failures, as_dict, as_str, on_bolt_error, signed_only
from adapters.slack_render import PLATFORM, Incoming, extract_message, parse_command
from adapters.slack_threads import Threads, remember
from bot.core.buttons import STALE, ApprovalButton, ButtonData, CancelButton, ItemButton, unpack
from bot.core.config import Config
from bot.core.errors import ConfigError, TandemError
from bot.core.events import Cancel, Command, ConvKey, Decision, Event, Inbound, User, UserMessage
from bot.run.app import Dispatch
from bot.serve.hub import Hub

__all__ = ["SlackAdapter", "check", "check_app_token", "check_bot_token", "create"]
log = logging.getLogger(__name__)
CONNECT_TIMEOUT_S, READ_TIMEOUT_S = 10.0, 60.0
"""Slack calls: time to connect, and the longest silence while reading an answer."""


class SlackUnavailable(TandemError):
    """Slack could not be reached at start."""


async def _ignore() -> None:
    """Acks an event Tandem has no use for."""


class SlackAdapter(EdgeTimings):
    def __init__(self, config: Config, hub: Hub, *, min_edit_interval: float = 1.0,
                 placeholder_delay: float = 0.5, cancel_delay: float = 1.5) -> None:
        self.config = config
        self.slack = config.slack
        self.hub = hub
        self.url: str | None = None
        """HTTP mode: the events endpoint as bound (port 0 picks a free port)."""
        self.bot_user = ""
        self.bot_id = ""
        self._client: AsyncWebClient | None = None
        self._session: aiohttp.ClientSession | None = None
        self.files = SlackFiles(config.slack.bot_token or "", config.slack.base_url)
        self.chat = SlackChat(hub, config.slack, lambda: self.client,
                              min_edit_interval=min_edit_interval)
        self.edge: Edge[str | None] = Edge(self.chat, hub, placeholder_delay=placeholder_delay,
                                           cancel_delay=cancel_delay)
        self.threads = Threads(hub, lambda: self.client, self.chat.call)
        self._socket: AsyncSocketModeHandler | None = None
        self._runner: web.AppRunner | None = None
        self._closed = False
        self._inflight: set[asyncio.Task[Any]] = set()
        self._seen: OrderedDict[tuple[str, str], bool] = OrderedDict()
        self._foreign: OrderedDict[str, bool] = OrderedDict()
        """Other workspaces whose payloads were dropped (each is logged once)."""

    @property
    def team(self) -> str | None:
        return self.chat.team

    @team.setter
    def team(self, value: str | None) -> None:
        self.chat.team = value

    @property
    def min_edit_interval(self) -> float:
        return self.chat.min_edit_interval

    @min_edit_interval.setter
    def min_edit_interval(self, value: float) -> None:
        self.chat.min_edit_interval = value

    # -- lifecycle --------------------------------------------------------------------

    async def start(self) -> None:
        # slack_sdk's own timeout does not reach a session it is given: this one's limits
        # keep a Slack that accepts and never answers from holding a call for minutes
        self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(
            total=None, sock_connect=CONNECT_TIMEOUT_S, sock_read=READ_TIMEOUT_S))
        base = slash(self.slack.base_url)
        self._client = AsyncWebClient(
            token=self.slack.bot_token, base_url=base, session=self._session,
            retry_handlers=[Failures(self.hub.d.watch), *async_default_handlers()])
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
            self.team = home_team(self.slack.team_id, auth)
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
        web_app.middlewares.append(signed_only(self.slack.signing_secret or ""))
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
        app.error(on_bolt_error)
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
            remember(self._foreign, foreign[0])
            log.warning("slack: ignoring payloads from workspace %s (this bot serves %s); "
                        "later ones from it are not logged", foreign[0], self.team)
        return BoltResponse(status=200, body="")

    async def stop(self) -> None:
        self._closed = self.chat.closed = True
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
        await self.edge.close()
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
            remember(self._seen, (msg.channel, msg.ts))
            await self._on_message(msg)

    async def _on_message(self, msg: Incoming) -> None:
        if not msg.addressed and not await self.threads.active(msg.channel, msg.thread or ""):
            self.threads.heard(msg.channel, msg.thread or "",
                               {"user": msg.user, "ts": msg.ts, "seen": msg.text})
            return
        who, context = User(msg.user, "", msg.team), None
        if self.hub.access.allows(PLATFORM, who):
            # Only for users the hub will serve (it refuses the others): joining a thread
            # (reading it, answering later replies there) and looking up the name.
            if msg.thread is not None and msg.addressed:
                context = await self.threads.join(msg.channel, msg.thread, msg.ts)
            elif msg.conv.thread_id is not None:
                remember(self.threads.known, (msg.channel, msg.conv.thread_id))
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
            remember(self.chat.askers, conv, who.id)

    async def _refused(self, conv: ConvKey, who: User, note: str | None, *,
                       dm: bool | None = None) -> None:
        """Show a refusal's note to `who` alone (nothing when it has none: a duplicate)."""
        if not note:
            return
        if dm is not None and note == self.hub.access.refusal(PLATFORM, who):
            await self._tell_stranger(conv, who.id, note, dm=dm)
        else:
            await self.chat.tell(conv, who, note)

    async def _tell_stranger(self, conv: ConvKey, user: str, text: str, *, dm: bool) -> None:
        """The hub's refusal (it has the id an admin needs), once per stranger and chat; the hub
        logs it."""
        if not self.edge.first_time(conv.chat_id, user):
            return
        if dm:
            await self.chat.post(conv, text)
        else:
            await self.chat.tell(conv, User(user), text)

    async def _who(self, uid: str, team: str | None) -> User:
        """The core's user: Slack's id and team; the name is looked up (`users.info`) only
        for users the hub serves, since it refuses the others before any name is shown."""
        who = User(uid, "", team)
        if not self.hub.access.allows(PLATFORM, who):
            return who
        return User(uid, await self.threads.name(uid), team)

    async def _on_assistant_thread(self, event: dict[str, Any]) -> None:
        """A new assistant thread: offer the configured prompts."""
        thread = as_dict(event.get("assistant_thread"))
        channel, ts = as_str(thread.get("channel_id")), as_str(thread.get("thread_ts"))
        prompts = [{"title": p[:75], "message": p} for p in self.slack.assistant.prompts]
        if not channel or not ts or not prompts:
            return
        try:
            await self.client.assistant_threads_setSuggestedPrompts(
                channel_id=channel, thread_ts=ts, prompts=prompts)
        except (SlackApiError, aiohttp.ClientError, TimeoutError):
            log.warning("slack: could not offer prompts in %s", channel, exc_info=True)

    # -- inbound: buttons and the slash command -------------------------------------

    async def _on_action(self, ack: AsyncAck, body: dict[str, Any]) -> None:
        await ack()
        with self._tracked():
            await self._press(body)

    async def _press(self, body: dict[str, Any]) -> None:
        user = as_dict(body.get("user"))
        uid = as_str(user.get("id"))
        container = as_dict(body.get("container"))
        channel = as_str(container.get("channel_id")) \
            or as_str(as_dict(body.get("channel")).get("id"))
        if not uid or not channel:
            log.info("Slack: a button press without user or channel ignored")
            return
        message_ts = as_str(container.get("message_ts"))
        thread = as_str(container.get("thread_ts"))
        # A card Tandem posted at the top of a DM may later become a thread's root.
        conv = ConvKey(PLATFORM, channel, thread if thread and thread != message_ts else None)
        actions = body.get("actions")
        action = as_dict(actions[0] if isinstance(actions, list) and actions else None)
        data = unpack(as_str(action.get("value"))) or \
            self._card_press(channel, message_ts, as_str(action.get("action_id")))
        who = await self._who(uid, as_str(user.get("team_id")) or None)
        ref = f"slack:{channel}:{action.get('action_ts')}:{uid}"
        match data:
            case None:
                await self.chat.tell(conv, User(uid), STALE)
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
        approval_id = self.chat.card_at.get((channel, ts))
        if verdict is None or approval_id is None:
            return None
        return ApprovalButton(approval_id, verdict)

    async def _on_command(self, ack: AsyncAck, body: dict[str, Any]) -> None:
        await ack()
        with self._tracked():
            uid, channel = as_str(body.get("user_id")), as_str(body.get("channel_id"))
            if not uid or not channel:
                log.info("Slack: a slash command without user or channel ignored")
                return
            conv = ConvKey(PLATFORM, channel, None)
            name, args = parse_command("/" + str(body.get("text") or "help").strip()) \
                or ("help", "")
            who = await self._who(uid, as_str(body.get("team_id")) or None)
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
            await self.edge.emit(event)
        except RuntimeError:  # aiohttp: "Session is closed" when stop() came mid-call
            if not self._closed:
                raise


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
