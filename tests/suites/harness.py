"""Shared rigs for the cross-cutting suites: the real adapters against the loopback fakes.

`tg_rig` runs a hub and the Telegram adapter (real python-telegram-bot) against a
`FakeTelegram`; `SlackRig` does the same for Slack (real slack-bolt) against a
`FakeSlackServer`. `FaultyTelegram` and `FaultySlack` are the fakes plus one hook: the
next N calls of a method fail with a chosen HTTP status.
"""

from __future__ import annotations

import os

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

import asyncio
import contextlib
import sqlite3
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Self

import litellm  # noqa: F401 - loaded once up front, not inside a test's timeouts

from adapters.slack import SlackAdapter
from adapters.slack import create as create_slack
from adapters.telegram import TelegramAdapter
from adapters.telegram import create as create_telegram
from bot.core.buttons import ApprovalButton, pack, unpack
from bot.core.config import Config
from bot.core.events import Verdict
from bot.run.app import build
from bot.serve.hub import Hub
from tests.conftest import make_config
from tests.fakes.model_server import FakeModelServer
from tests.fakes.slack_server import FakeSlackMessage, FakeSlackServer, _ApiError, block_text
from tests.fakes.telegram_server import ApiError, FakeMessage, FakeTelegram

JSON = dict[str, Any]
ANN, BOB, STRANGER = 42, 43, 77
GROUP = -100555
FAST = {"min_edit_interval": 0.05, "placeholder_delay": 0.0, "typing_delay": 0.0,
        "typing_interval": 0.2}
SECRET = "signing-secret"


def integrity(db: Path) -> str:
    """`PRAGMA integrity_check` of the database file, from a connection of its own."""
    conn = sqlite3.connect(db)
    try:
        return str(conn.execute("PRAGMA integrity_check").fetchone()[0])
    finally:
        conn.close()


def rss_kb() -> int:
    """Resident set size of this process, in kB (Linux)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


# -- fault injection ---------------------------------------------------------------------


@dataclass
class _Fault:
    method: str
    status: int
    times: int
    when: Callable[[JSON], bool] | None
    retry_after: int | None
    delay: float = 0.0


class FaultyTelegram(FakeTelegram):
    """FakeTelegram whose methods can be made to fail the next N (matching) calls, and
    which wakes per-chat waiters (`wait_chat`) instead of every waiter on every call."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.faults: list[_Fault] = []
        self.injected: list[tuple[str, int]] = []
        self.stalling = 0
        """Calls held by `stall` and not yet answered."""
        self._watch: dict[Any, asyncio.Event] = {}
        for key, (name, handler) in list(self._methods.items()):
            self._methods[key] = (name, self._wrap(name, handler))

    async def wait_chat(self, chat: int, predicate: Callable[[], bool],
                        timeout: float = 10.0) -> None:
        """Wait until `predicate()` holds, re-checked after each call naming `chat`."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while True:
            event = self._watch.setdefault(chat, asyncio.Event())
            event.clear()
            if predicate():
                return
            remaining = deadline - loop.time()
            if remaining <= 0:
                raise AssertionError(f"chat {chat}: condition not met within {timeout}s\n"
                                     + "\n".join(self.bot_texts(chat)))
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(event.wait(), remaining)

    def fail(self, method: str, *, status: int = 500, times: int = 1,
             when: Callable[[JSON], bool] | None = None, retry_after: int | None = None) -> None:
        self.faults.append(_Fault(method.lower(), status, times, when, retry_after))

    def stall(self, method: str, seconds: float, *, times: int = 1,
              when: Callable[[JSON], bool] | None = None) -> None:
        """The next matching calls succeed, but only after `seconds` (the answer comes
        too late for a client that timed out, as when Telegram's reply is lost)."""
        self.faults.append(_Fault(method.lower(), 200, times, when, None, seconds))

    def _wrap(self, name: str, handler: Any) -> Any:
        async def wrapped(params: JSON) -> Any:
            stalled = False
            for fault in self.faults:
                if fault.method == name.lower() and fault.times > 0 and \
                        (fault.when is None or fault.when(params)):
                    fault.times -= 1
                    self.injected.append((name, fault.status))
                    if fault.delay:
                        stalled = True
                        self.stalling += 1
                        await asyncio.sleep(fault.delay)
                        break
                    if fault.status == 429:
                        seconds = fault.retry_after or 1
                        raise ApiError(429, f"Too Many Requests: retry after {seconds}",
                                       {"retry_after": seconds})
                    raise ApiError(fault.status, "Internal Server Error"
                                   if fault.status == 500 else "Bad Gateway")
            try:
                return await handler(params)
            finally:
                self.stalling -= stalled
                event = self._watch.get(params.get("chat_id"))
                if event is not None:
                    event.set()

        return wrapped


class FaultySlack(FakeSlackServer):
    """FakeSlackServer whose Web API methods can be made to fail the next N calls."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.faults: list[_Fault] = []
        self.injected: list[tuple[str, int]] = []
        for name, handler in list(self._handlers.items()):
            self._handlers[name] = self._wrap(name, handler)

    def fail(self, method: str, *, status: int = 500, times: int = 1,
             when: Callable[[JSON], bool] | None = None, retry_after: int | None = None) -> None:
        self.faults.append(_Fault(method, status, times, when, retry_after))

    def _wrap(self, name: str, handler: Callable[[JSON], JSON]) -> Callable[[JSON], JSON]:
        def wrapped(params: JSON) -> JSON:
            for fault in self.faults:
                if fault.method == name and fault.times > 0 and \
                        (fault.when is None or fault.when(params)):
                    fault.times -= 1
                    self.injected.append((name, fault.status))
                    if fault.status == 429:
                        self.rate_limited.append((str(params.get("channel")), name))
                        raise _ApiError("ratelimited", status=429, headers={
                            "Retry-After": str(fault.retry_after or 1)})
                    raise _ApiError("internal_error" if fault.status < 503
                                    else "service_unavailable", status=fault.status)
            return handler(params)

        return wrapped


# -- Telegram ------------------------------------------------------------------------------


class TgRig:
    """One process: hub + Telegram adapter on the test's database and fake servers."""

    def __init__(self, hub: Hub, adapter: TelegramAdapter, fake: FakeTelegram,
                 workspace: Path, config: Config) -> None:
        self.hub, self.adapter, self.fake = hub, adapter, fake
        self.workspace, self.config = workspace, config

    def bot(self, chat: int) -> list[FakeMessage]:
        return [m for m in self.fake.chat(chat) if m.from_bot]

    async def until(self, predicate: Callable[[], Any], timeout: float = 10.0) -> None:
        await self.fake.wait_for(predicate, timeout)

    async def answered(self, chat: int, text: str, timeout: float = 10.0) -> FakeMessage:
        """Wait for a bot message showing `text` with no buttons left; return it."""
        def done() -> bool:
            return any(m.text == text and not m.reply_markup for m in self.bot(chat))
        await self.until(done, timeout)
        return next(m for m in self.bot(chat) if m.text == text)

    async def card(self, chat: int, n: int = 1,
                   timeout: float = 10.0) -> tuple[FakeMessage, str]:
        def cards() -> list[FakeMessage]:
            return [m for m in self.bot(chat) if m.text.startswith("🔐") and m.reply_markup]
        await self.until(lambda: len(cards()) >= n, timeout)
        card = cards()[n - 1]
        assert card.reply_markup is not None
        button = unpack(card.reply_markup["inline_keyboard"][0][0]["callback_data"])
        assert isinstance(button, ApprovalButton)
        return card, button.approval_id

    def press(self, chat: int, user: int, message: FakeMessage, approval_id: str,
              verdict: Verdict, name: str = "Ann", *, forged: bool = False) -> str:
        data = pack(ApprovalButton(approval_id, verdict))
        return self.fake.push_callback(chat, user, message.message_id, data, first_name=name,
                                       forged=forged)

    async def settle(self) -> None:
        """Every queued update fetched and handled, and every conversation idle."""
        await tg_settled(self.fake, self.adapter, self.hub)


async def tg_settled(fake: FakeTelegram, adapter: TelegramAdapter, hub: Hub,
                     timeout: float = 10.0) -> None:
    """Until every update queued at the fake was handed out and handled, and every
    conversation is idle: the fake holds an update until a later `getUpdates` confirms
    it, which python-telegram-bot sends once it has put the update in its queue; the
    queue is joined when every handler returned (webhook mode handles an update before
    answering its delivery, so there the fake's queue empties after the handler)."""
    await fake.wait_for(lambda: not fake.pending_updates, timeout)
    async with asyncio.timeout(timeout):
        await adapter.app.update_queue.join()
    await hub.idle()


def tg_config(tmp_path: Path, model: FakeModelServer, fake: FakeTelegram,
              overrides: JSON | None = None, **telegram: Any) -> Config:
    # the suites try the placeholder (its Cancel button, its edits) in private chats too;
    # drafts have their own tests in tests/adapters/test_telegram.py
    settings = {"enabled": True, "token": fake.token, "base_url": f"{fake.url}/bot",
                "allowed_users": [ANN], "drafts": False, **telegram}
    return make_config(tmp_path, model, telegram=settings, **(overrides or {}))


@asynccontextmanager
async def tg_rig(tmp_path: Path, model: FakeModelServer, fake: FakeTelegram, *,
                 adapter_args: JSON | None = None, overrides: JSON | None = None,
                 build_args: JSON | None = None, **telegram: Any) -> AsyncIterator[TgRig]:
    config = tg_config(tmp_path, model, fake, overrides, **telegram)
    hub, dispatch = build(config, **(build_args or {}))
    await hub.d.store.open()
    adapter = create_telegram(config, hub, dispatch)
    for key, value in {**FAST, **(adapter_args or {})}.items():
        setattr(adapter, key, value)
    try:
        await adapter.start()
        await hub.recover()
        yield TgRig(hub, adapter, fake, Path(config.workspace.dir), config)
    finally:
        try:
            await adapter.stop()
        except Exception:
            for request in adapter._requests:  # stop() gave up half way: close the sessions
                await request.shutdown()
            raise
        finally:  # the store's worker thread must end even when stop() fails
            await hub.close()
            await hub.d.store.close()


# -- Slack ---------------------------------------------------------------------------------


class SlackRig:
    """The fake Slack, the fake model and a running core with the Slack adapter.

    Deliveries and presses go in over Socket Mode or signed HTTP (`mode`); their acks'
    latencies are kept in `acks`. `edit_interval` None keeps the adapter's default pace.
    """

    def __init__(self, fake: FakeSlackServer, model: FakeModelServer, tmp: Path, mode: str,
                 edit_interval: float | None = 0.05, placeholder_delay: float = 0.0,
                 **overrides: Any) -> None:
        self.fake, self.model, self.tmp, self.mode = fake, model, tmp, mode
        self.options: JSON = {"placeholder_delay": placeholder_delay}
        if edit_interval is not None:
            self.options["min_edit_interval"] = edit_interval
        settings = {"slack__enabled": True, "slack__mode": mode, "slack__bot_token": "xoxb-test",
                    "slack__app_token": "xapp-test", "slack__signing_secret": SECRET,
                    "slack__base_url": fake.api_url, "slack__allowed_users": ["U1", "U2"],
                    "slack__http__port": 0}
        self.config: Config = make_config(tmp, model, **{**settings, **overrides})
        self.acks: list[float] = []
        self.hub: Hub
        self.adapter: SlackAdapter

    async def start(self) -> None:
        self.hub, dispatch = build(self.config)
        await self.hub.d.store.open()
        self.adapter = create_slack(self.config, self.hub, dispatch, **self.options)
        await self.adapter.start()
        await self.hub.recover()
        if self.mode == "socket":
            await self.fake.wait_for(lambda: self.fake.open_connections > 0)

    async def stop(self) -> None:
        try:
            await self.adapter.stop()
        finally:
            await self.hub.close()
            await self.hub.d.store.close()

    async def restart(self) -> None:
        await self.hub.idle()
        await self.stop()
        await self.start()

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None, *exc: object) -> None:
        await self.stop()

    @property
    def url(self) -> str:
        assert self.adapter.url is not None
        return self.adapter.url

    @property
    def workspace(self) -> Path:
        return Path(self.config.workspace.dir)

    async def deliver(self, event: JSON, *, event_id: str | None = None, retry: int = 0) -> str:
        """Deliver an event and wait for its ack (HTTP: a 200); returns its event_id."""
        body = self.fake.event_body(event, event_id=event_id)
        if self.mode == "socket":
            envelope = await self.fake.push("events_api", body, retry_attempt=retry)
            self.acks.append(await self.fake.wait_ack(envelope))
        else:
            got = await self.fake.post_event(self.url, body, signing_secret=SECRET,
                                             retry_num=retry or None)
            assert got.status == 200, got
            self.acks.append(got.latency)
        return str(body["event_id"])

    async def say(self, channel: str, user: str, text: str, **kwargs: Any) -> JSON:
        """A user message, delivered; a mention also arrives as a `message` event."""
        event = self.fake.message_event(channel, user, text, **kwargs)
        await self.deliver(event)
        if kwargs.get("mention"):
            twin = dict(event, type="message", channel_type=kwargs.get("channel_type", "channel"))
            await self.deliver(twin)
        return event

    async def press(self, channel: str, user: str, ts: str, action_id: str,
                    value: str | None = None) -> None:
        """`user` presses a button; `value` models a stale view of a button now gone."""
        if value is None:
            message = self.fake.message(channel, ts)
            assert message is not None and message.blocks, self.fake.dump()
            value = next(e["value"] for b in message.blocks if b["type"] == "actions"
                         for e in b["elements"] if e["action_id"] == action_id)
        payload = self.fake.block_actions(channel, user, ts, action_id, value)
        if self.mode == "socket":
            envelope = await self.fake.push("interactive", payload)
            self.acks.append(await self.fake.wait_ack(envelope))
        else:
            got = await self.fake.post_action(self.url, payload, signing_secret=SECRET)
            assert got.status == 200, got
            self.acks.append(got.latency)

    def texts(self, channel: str, thread: str | None = None) -> list[str]:
        return self.fake.bot_texts(channel, thread)

    async def wait_text(self, channel: str, needle: str, thread: str | None = None,
                        timeout: float = 10.0) -> list[str]:
        def found() -> list[str] | None:
            texts = self.texts(channel, thread)
            return texts if any(needle in t for t in texts) else None

        result = await self.fake.wait_for(found, timeout)
        assert result is not None
        return result

    async def card(self, channel: str, n: int = 1, timeout: float = 10.0) -> FakeSlackMessage:
        def cards() -> list[FakeSlackMessage]:
            return [m for m in self.fake.bot_messages(channel)
                    if "wants to run" in block_text(m.blocks)]

        found = await self.fake.wait_for(lambda: cards() if len(cards()) >= n else None,
                                         timeout)
        assert found is not None
        return found[n - 1]

    async def settle(self) -> None:
        """Every Socket Mode envelope acked (bolt acks once the listener returned: the
        adapter processes before it responds; an HTTP delivery is answered after it),
        no listener at work, and every conversation idle."""
        await self.fake.wait_for(lambda: self.fake.pushed.keys() <= self.fake.acks.keys())
        await self.fake.wait_for(lambda: not self.adapter._inflight)
        await self.hub.idle()
