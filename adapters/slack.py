"""Slack, on slack-bolt (async): Socket Mode (default) or HTTP (Events API).

Conversations are `ConvKey("slack", channel, thread_ts or None)`: a DM's top-level
messages are one conversation, a thread (in a DM or a channel) is its own. A mention in a
channel is answered in that message's thread, and later replies there continue without a
new mention (`adapters.slack_threads`, which also reads a thread once when Tandem is first
mentioned in it). What the chat shows is decided by the shared edge (`adapters.edge`) and
done by Slack's primitives (`adapters.slack_chat`).

Tandem serves one workspace: `slack.team_id`, else the one `auth.test` names at start. A
payload that names another workspace is acked and dropped before any listener sees it
(`adapters.slack_http.WorkspaceGate`). Every event, press and command is acked once the
core has recorded it (bolt's `process_before_response`): a worker killed before the ack
loses nothing, since Slack sends the payload again, and one conversation's events are
recorded in the order Slack sends them. A payload no listener takes is acked too; HTTP
mode's checks are in `adapters.slack_http`.

Inbound is handed to `Hub.submit`, which checks access first (`bot.serve.access`: ids, and the
user's workspace against the bot's) and returns at once; a stranger gets the hub's refusal,
privately. Each message's ref `slack:<channel>:<ts>` makes the `app_mention`/`message`
pair, Slack's retries and Socket Mode redeliveries collapse into one answer, across
restarts too.
"""

from __future__ import annotations

import logging
import re
from collections import OrderedDict
from typing import Any

import aiohttp
from aiohttp import web
from slack_bolt.adapter.socket_mode.async_handler import AsyncSocketModeHandler
from slack_bolt.async_app import AsyncAck, AsyncApp
from slack_sdk.http_retry.builtin_async_handlers import async_default_handlers
from slack_sdk.web.async_client import AsyncWebClient

from adapters import slack_check, slack_http, slack_inbound
from adapters.edge import Edge, EdgeTimings
from adapters.slack_chat import SlackChat
from adapters.slack_check import check, check_app_token, check_bot_token
from adapters.slack_files import SlackFiles, missing_scopes
from adapters.slack_http import SlackUnavailable
from adapters.slack_inbound import PLATFORM, Incoming, as_dict, as_str
from adapters.slack_threads import Threads, remember
from bot.core.buttons import STALE, ApprovalButton, CancelButton, ItemButton, unpack
from bot.core.config import Config
from bot.core.errors import ConfigError
from bot.core.events import Cancel, Command, ConvKey, Decision, Event, Inbound, User, UserMessage
from bot.run.app import Dispatch
from bot.serve.hub import Hub

__all__ = ["SlackAdapter", "SlackUnavailable", "check", "check_app_token", "check_bot_token",
           "create"]
log = logging.getLogger(__name__)
CONNECT_TIMEOUT_S, READ_TIMEOUT_S = 10.0, 60.0
"""Slack calls: time to connect, and the longest silence while reading an answer."""


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
        self.threads = Threads(hub, lambda: self.client, self.chat.call,
                               lambda: (self.bot_user, self.bot_id))
        self._socket: AsyncSocketModeHandler | None = None
        self._runner: web.AppRunner | None = None
        self._closed = False
        self._inflight = slack_http.Inflight()
        self._seen: OrderedDict[tuple[str, str], bool] = OrderedDict()

    @property
    def team(self) -> str | None:
        return self.chat.team

    @team.setter
    def team(self, value: str | None) -> None:
        self.chat.team = value

    # -- lifecycle --------------------------------------------------------------------

    async def start(self) -> None:
        # slack_sdk's own timeout does not reach a session it is given: this one's limits
        # keep a Slack that accepts and never answers from holding a call for minutes
        self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(
            total=None, sock_connect=CONNECT_TIMEOUT_S, sock_read=READ_TIMEOUT_S))
        base = slack_check.slash(self.slack.base_url)
        self._client = AsyncWebClient(
            token=self.slack.bot_token, base_url=base, session=self._session,
            retry_handlers=[slack_http.Failures(self.hub.d.watch), *async_default_handlers()])
        self.files.client, self.files.session = self._client, self._session
        try:
            auth = await slack_check.signed_in(self._client, base)
            self.team = slack_check.home_team(self.slack.team_id, auth)
            self.bot_user, self.bot_id = str(auth["user_id"]), str(auth.get("bot_id") or "")
            self.hub.access.set_home_team(PLATFORM, self.team)  # "*" means: this workspace
            if missing := missing_scopes(auth.headers):
                log.warning("slack: the bot token lacks %s: files shared with Tandem cannot "
                            "be fetched or sent (add the scopes and reinstall the app)",
                            ", ".join(missing))
            if self.hub.access.nobody(PLATFORM):
                log.warning("slack.allowed_users is empty: nobody can use Tandem on Slack")
            app = self._build_app()
            if self.slack.mode == "socket":
                self._socket = await slack_http.connect_socket(app, self.slack.app_token,
                                                               self._client)
            else:
                self._runner, self.url = await slack_http.listen(app, self.slack)
        except (ConfigError, SlackUnavailable):
            await self.stop()
            raise

    def _build_app(self) -> AsyncApp:
        # Unhandled payloads reach `on_bolt_error` (to be acked); bolt's assistant-thread
        # middleware is left out: Tandem sets the status and prompts itself.
        app = AsyncApp(client=self._client, signing_secret=self.slack.signing_secret or "",
                       name="tandem", raise_error_for_unhandled_request=True,
                       attaching_conversation_kwargs_enabled=False,
                       process_before_response=True)
        app.error(slack_http.on_bolt_error)
        app.use(slack_http.WorkspaceGate(lambda: self.team))
        app.event("app_mention")(self._on_event)
        app.event("message")(self._on_event)  # also acks the subtypes Tandem ignores
        app.event("assistant_thread_started")(self._on_assistant_thread)
        app.event("assistant_thread_context_changed")(_ignore)
        app.action(re.compile(".*"))(self._on_action)
        app.command("/tandem")(self._on_command)
        return app

    async def stop(self) -> None:
        self._closed = self.chat.closed = True
        if self._socket is not None:
            await self._socket.close_async()  # type: ignore[no-untyped-call]
            self._socket = None
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
        await self._inflight.end(grace=2.0)
        await self.edge.close()
        if self._session is not None:
            await self._session.close()
            self._session = None
            self.files.client = self.files.session = None

    @property
    def client(self) -> AsyncWebClient:
        assert self._client is not None, "the Slack adapter is not started"
        return self._client

    # -- inbound: messages --------------------------------------------------------------

    async def _on_event(self, event: dict[str, Any]) -> None:
        with self._inflight.tracked():
            if (edit := slack_inbound.edit_of(event, self.bot_user, self.slack.groups)):
                await self.hub.submit(edit)  # the core decides what it changes
            msg = slack_inbound.extract_message(event, self.bot_user)
            if msg is None or self._closed:
                return
            if (msg.channel, msg.ts) in self._seen:
                return  # the same message as app_mention and as message
            remember(self._seen, (msg.channel, msg.ts))
            await self._on_message(msg)

    async def _on_message(self, msg: Incoming) -> None:
        if msg.thread is None and not msg.addressed:  # channel talk: context if kept
            if self.slack.groups.context:
                who = User(msg.user, await self.threads.name(msg.user), msg.team)
                await self.hub.submit(slack_inbound.aside_of(msg, who))
            return
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
            who = await self.threads.who(msg.user, msg.team)
        item = slack_inbound.inbound_of(msg, who, context, self.slack.groups)
        await self._submit(item.conv, item, who, dm=msg.dm)

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
        """Show a refusal's note to `who` alone (nothing when it has none: a duplicate). A
        stranger's (it has the id an admin needs; the hub logs it) is shown once per chat,
        in the DM or privately in the channel."""
        if not note:
            return
        if dm is None or note != self.hub.access.refusal(PLATFORM, who):
            await self.chat.tell(conv, who, note)
        elif self.edge.first_time(conv.chat_id, who.id):
            await (self.chat.post(conv, note) if dm else self.chat.tell(conv, who, note))

    async def _on_assistant_thread(self, event: dict[str, Any]) -> None:
        thread = as_dict(event.get("assistant_thread"))
        channel, ts = as_str(thread.get("channel_id")), as_str(thread.get("thread_ts"))
        if channel and ts:
            await self.chat.offer_prompts(channel, ts)

    # -- inbound: buttons and the slash command -------------------------------------

    async def _on_action(self, ack: AsyncAck, body: dict[str, Any]) -> None:
        await ack()
        with self._inflight.tracked():
            await self._press(body)

    async def _press(self, body: dict[str, Any]) -> None:
        press = slack_inbound.press_of(body)
        if press is None:
            log.info("Slack: a button press without user or channel ignored")
            return
        conv, ref = press.conv, press.ref
        data = unpack(press.value) or \
            self.chat.decided_press(conv.chat_id, press.message_ts, press.action_id)
        who = await self.threads.who(press.user, press.team)
        match data:
            case None:
                await self.chat.tell(conv, who, STALE)
            case CancelButton(turn, session):
                receipt = await self.hub.cancel(Cancel(conv, who, turn=turn, session=session))
                if not receipt.accepted:
                    await self._refused(conv, who, receipt.note)
            case ApprovalButton(approval_id, verdict):
                await self._submit(conv, Decision(conv, who, approval_id, verdict, ref=ref), who)
            case ItemButton() as item:
                await self._submit(conv, Command(conv, who, item.command, item.item_id, ref=ref),
                                   who)

    async def _on_command(self, ack: AsyncAck, body: dict[str, Any]) -> None:
        await ack()
        with self._inflight.tracked():
            uid, channel = as_str(body.get("user_id")), as_str(body.get("channel_id"))
            if not uid or not channel:
                log.info("Slack: a slash command without user or channel ignored")
                return
            who = await self.threads.who(uid, as_str(body.get("team_id")) or None)
            item = slack_inbound.command_of(body, who)
            await self._submit(item.conv, item, who)

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
