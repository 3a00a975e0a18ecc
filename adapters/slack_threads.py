"""Which Slack threads Tandem takes part in, what was said there before it joined, and
who people are.

Tandem takes part in a thread once it was addressed there: the store knows (whichever
worker heard the mention, before a restart too), and this process remembers it. A reply
in a thread the store does not know costs one `conversations.replies`: the thread is
active if Tandem has posted in it. Threads found inactive are remembered, so a busy
channel costs at most one look-up per thread per process (the store is still asked
first: another worker may have joined the thread since). When Tandem is first mentioned
inside an existing thread, the thread is read once and its earlier messages travel as
`UserMessage.context`.
"""

from __future__ import annotations

import asyncio
import logging
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import aiohttp
from slack_sdk.errors import SlackApiError
from slack_sdk.web.async_client import AsyncWebClient

from adapters.slack_inbound import PLATFORM, slack_text
from bot.core.events import ConvKey, User
from bot.serve.hub import Hub

log = logging.getLogger(__name__)
T = TypeVar("T")
NETWORK_ERRORS = (SlackApiError, aiohttp.ClientError, TimeoutError)
MEMORY = 10_000
"""Entries kept in each in-memory map (threads, names)."""
CONTEXT_MESSAGES = 50


def remember(store: OrderedDict[Any, Any], key: Any, value: Any = True) -> None:
    store[key] = value
    store.move_to_end(key)
    while len(store) > MEMORY:
        store.popitem(last=False)


def _ts_order(ts: str) -> tuple[int, ...]:
    """Slack timestamps ("1700000000.000100") in time order."""
    return tuple(int(p) for p in ts.split(".") if p.isdigit())


class Threads:
    def __init__(self, hub: Hub, client: Callable[[], AsyncWebClient],
                 call: Callable[..., Awaitable[Any]], me: Callable[[], tuple[str, str]]) -> None:
        self.hub, self._client, self.call = hub, client, call
        self.me = me
        """Tandem's own (user id, bot id) in Slack, known once started."""
        self.known: OrderedDict[tuple[str, str], bool] = OrderedDict()
        """Threads found active (True) or not (False)."""
        self.read: OrderedDict[tuple[str, str], list[dict[str, Any]]] = OrderedDict()
        """Threads read and found without Tandem, with what was said there since: joined
        later, they are not read again."""
        self._lookups: dict[tuple[str, str], asyncio.Future[list[dict[str, Any]] | None]] = {}
        self._names: OrderedDict[str, str] = OrderedDict()

    @property
    def client(self) -> AsyncWebClient:
        return self._client()

    def heard(self, channel: str, thread: str, message: dict[str, Any]) -> None:
        """A message in a thread Tandem is not in: kept, should Tandem be asked in later."""
        if (read := self.read.get((channel, thread))) is not None:
            read.append(message)
            del read[:-CONTEXT_MESSAGES - 1]

    async def active(self, channel: str, thread: str) -> bool:
        """Tandem takes part in this thread (it was addressed or has posted there)."""
        known = self.known.get((channel, thread))
        if known:
            return True
        if await self.hub.heard_in(ConvKey(PLATFORM, channel, thread)):
            remember(self.known, (channel, thread))
            return True
        if known is not None:
            return False
        messages = await self._replies(channel, thread)
        if messages is None:
            return False
        active = any(self._mine(m) for m in messages)
        remember(self.known, (channel, thread), active)
        if not active:  # kept (with what is said there next) for when Tandem is asked in
            remember(self.read, (channel, thread), messages[-CONTEXT_MESSAGES - 1:])
        return active

    async def join(self, channel: str, thread: str, ts: str) -> str | None:
        """Addressed in a thread: read it once when joining; the earlier messages as text."""
        if self.known.get((channel, thread)):
            return None
        messages = self.read.pop((channel, thread), None)
        if messages is None:
            messages = await self._replies(channel, thread)
        if self.known.get((channel, thread)) or messages is None:
            remember(self.known, (channel, thread))
            return None
        remember(self.known, (channel, thread))
        if any(self._mine(m) for m in messages):
            return None
        earlier = [m for m in messages
                   if _ts_order(str(m.get("ts", ""))) < _ts_order(ts) and not self._mine(m)]
        lines = [f"{await self.name(str(m.get('user', '')))}: "
                 f"{m.get('seen') or slack_text(str(m.get('text') or ''), self.me()[0])}"
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
            resp = await self.call(lambda: self.client.conversations_replies(
                channel=channel, ts=thread, limit=200), deadline=30.0)
            result = list(resp.get("messages") or [])
        except NETWORK_ERRORS:
            log.warning("slack: could not read thread %s in %s", thread, channel, exc_info=True)
        finally:
            del self._lookups[key]
            future.set_result(result)
        return result

    def _mine(self, message: dict[str, Any]) -> bool:
        user, bot = self.me()
        return message.get("user") == user or bool(bot) and message.get("bot_id") == bot

    async def who(self, uid: str, team: str | None) -> User:
        """The core's user: Slack's id and team; the name is looked up (`users.info`) only
        for users the hub serves, since it refuses the others before any name is shown."""
        who = User(uid, "", team)
        if not self.hub.access.allows(PLATFORM, who):
            return who
        return User(uid, await self.name(uid), team)

    async def name(self, user: str) -> str:
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
            remember(self._names, user, name)
        return name
