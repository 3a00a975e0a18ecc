"""Telegram webhook mode (and polling mode without polling) end to end: the real
python-telegram-bot against FakeTelegram delivering to the adapter's endpoint, the real
litellm client against FakeModelServer, a real SQLite store in tmp_path."""

from __future__ import annotations

import os

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

import socket
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import aiohttp
import litellm  # noqa: F401 - loaded up front, not inside the first test's event loop
import pytest
from telegram import Bot

from adapters.telegram import TelegramAdapter, create
from bot.core.config import Config
from bot.core.errors import ConfigError
from bot.core.events import ConvKey, Notice
from bot.run.app import Dispatch, build
from bot.serve.hub import Hub
from tests.fakes.model_server import FakeModelServer, Reply
from tests.fakes.telegram_server import SECRET_HEADER, FakeTelegram
from tests.suites.harness import ANN, FAST, tg_config, tg_rig

BOB = 43
SECRET = "wh-secret_0123456789abcdefghijklmnopqrstu"
PUBLIC = "https://tandem.example/telegram"


@pytest.fixture
async def fake() -> AsyncIterator[FakeTelegram]:
    async with FakeTelegram(flood=False, webhook_targets=[]) as server:
        yield server
        assert server.internal_errors == []


def webhook(**overrides: Any) -> dict[str, Any]:
    """Webhook mode on a free port; the fake's `webhook_targets` point at the adapters."""
    return {"url": PUBLIC, "port": 0, "secret_token": SECRET, **overrides}


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@asynccontextmanager
async def core(tmp_path: Path, model: FakeModelServer, fake: FakeTelegram,
               **telegram: Any) -> AsyncIterator[tuple[Hub, Dispatch, Config]]:
    """A hub on the test's database; its adapters are started by `running`."""
    telegram = {"mode": "webhook", "webhook": webhook(), **telegram}
    config = tg_config(tmp_path, model, fake, **telegram)
    hub, dispatch = build(config)
    await hub.d.store.open()
    try:
        yield hub, dispatch, config
    finally:
        await hub.close()
        await hub.d.store.close()


@asynccontextmanager
async def running(config: Config, hub: Hub, dispatch: Dispatch | None = None,
                  ) -> AsyncIterator[TelegramAdapter]:
    """An adapter on the hub: its sink when `dispatch` is given, else inbound only."""
    adapter = create(config, hub, dispatch) if dispatch is not None \
        else TelegramAdapter(config, hub)
    for key, value in FAST.items():
        setattr(adapter, key, value)
    try:
        await adapter.start()
        yield adapter
    finally:
        await adapter.stop()


async def post(url: str, body: bytes, secret: str | None) -> int:
    headers = {"Content-Type": "application/json"}
    if secret is not None:
        headers[SECRET_HEADER] = secret
    async with aiohttp.ClientSession() as session, \
            session.post(url, data=body, headers=headers) as response:
        return response.status


def make_bot(fake: FakeTelegram) -> Bot:
    return Bot(fake.token, base_url=f"{fake.url}/bot")


def answers(fake: FakeTelegram, chat: int) -> list[str]:
    return fake.bot_texts(chat)


# -- webhook mode ------------------------------------------------------------------------


async def test_dm_is_answered_over_the_webhook(tmp_path: Path, model: FakeModelServer,
                                               fake: FakeTelegram) -> None:
    port = free_port()
    url = f"http://127.0.0.1:{port}/tg"
    fake.webhook_targets = None  # deliver to the URL the adapter registers
    model.script(Reply(text="Hello **Ann**."))
    async with tg_rig(tmp_path, model, fake, mode="webhook",
                      webhook={"url": url, "port": port, "path": "/tg",
                               "secret_token": SECRET}) as rig:
        assert rig.adapter.url == url
        update_id = fake.push_message(ANN, ANN, "hi")
        await rig.answered(ANN, "Hello Ann.")
        await rig.hub.idle()
    assert fake.webhook is not None  # stopping leaves the webhook set
    assert fake.webhook["secret_token"] == SECRET
    [call] = fake.calls_to("setWebhook")
    assert call.params["url"] == url and call.params["drop_pending_updates"] is False
    assert call.params["allowed_updates"] == ["message", "edited_message", "callback_query"]
    assert not fake.calls_to("getUpdates") and not fake.calls_to("deleteWebhook")
    assert [(d.update_id, d.ok) for d in fake.deliveries] == [(update_id, True)]
    assert answers(fake, ANN) == ["Hello Ann."] and len(model.requests) == 1


async def test_bad_requests_are_refused_and_nothing_is_handled(
        tmp_path: Path, model: FakeModelServer, fake: FakeTelegram) -> None:
    update = b'{"update_id": 5, "message": {"message_id": 1, "date": 1700000000, ' \
        b'"chat": {"id": 42, "type": "private"}, "from": {"id": 42, "is_bot": false, ' \
        b'"first_name": "Ann"}, "text": "forged"}}'
    async with tg_rig(tmp_path, model, fake, mode="webhook", webhook=webhook()) as rig:
        url = rig.adapter.url
        assert url is not None and url.startswith("http://127.0.0.1:")
        assert await post(url, update, None) == 401
        assert await post(url, update, SECRET + "x") == 401
        assert await post(url, update, SECRET[:-1]) == 401
        assert await post(url, update, "") == 401
        assert await post(url, b"not json at all", "nope") == 401  # the body is not read
        assert await post(url, b"not json at all", SECRET) == 400
        assert await post(url, b"\xff\xfe", SECRET) == 400
        deep = b"[" * 200_000 + b"]" * 200_000  # past the JSON parser's recursion limit
        assert await post(url, deep, SECRET) == 400
        assert await post(url, b'{"update_id": 1, "x": ' + deep + b"}", SECRET) == 400
        for body in (b"[1, 2]", b'"text"', b"{}", b'{"update_id": "5"}', b'{"update_id": true}'):
            assert await post(url, body, SECRET) == 400, body
        # an update the library cannot parse is skipped with a 200 (else: retried forever)
        assert await post(url, b'{"update_id": 6, "message": "junk"}', SECRET) == 200
        async with aiohttp.ClientSession() as session:
            async with session.get(url, headers={SECRET_HEADER: SECRET}) as response:
                assert response.status == 405
            async with session.post(url + "x", headers={SECRET_HEADER: SECRET}) as response:
                assert response.status == 404
        await rig.settle()  # each post was answered after its update was handled
    assert model.requests == [] and fake.chat(ANN) == [] and fake.calls_to("sendMessage") == []


async def test_wrong_secrets_are_throttled_per_address(
        tmp_path: Path, model: FakeModelServer, fake: FakeTelegram) -> None:
    """After ten wrong secrets in a minute, the address gets 429 without being checked,
    the right secret too: guessing stops."""
    from adapters.telegram_webhook import THROTTLE_FAILURES, Throttle

    update = b'{"update_id": 9}'
    async with tg_rig(tmp_path, model, fake, mode="webhook", webhook=webhook()) as rig:
        url = rig.adapter.url
        assert url is not None
        for i in range(THROTTLE_FAILURES):
            assert await post(url, update, f"guess-{i}") == 401
        assert await post(url, update, "guess-again") == 429
        assert await post(url, b"{}", SECRET) == 429  # not even checked
    clock = [1000.0]
    throttle = Throttle(lambda: clock[0])
    for _ in range(THROTTLE_FAILURES - 1):
        throttle.failed("10.0.0.1")
        clock[0] += 5
    assert throttle.wait("10.0.0.1") == 0
    throttle.failed("10.0.0.1")
    assert throttle.wait("10.0.0.1") == 60 and throttle.wait("10.0.0.2") == 0
    clock[0] += 59.5  # the first failures are older than a minute: it still waits
    assert throttle.wait("10.0.0.1") == 1
    clock[0] += 1
    assert throttle.wait("10.0.0.1") == 0
    throttle.failed("10.0.0.1")  # it starts over
    assert throttle.wait("10.0.0.1") == 0


async def test_lost_answer_is_redelivered_and_answered_once(
        tmp_path: Path, model: FakeModelServer, fake: FakeTelegram) -> None:
    model.script(Reply(text="Once."))
    async with tg_rig(tmp_path, model, fake, mode="webhook", webhook=webhook()) as rig:
        assert rig.adapter.url is not None
        fake.webhook_targets = [rig.adapter.url]
        fake.lose_webhook_answers(1)  # handled, but Telegram never saw the 200
        update_id = fake.push_message(ANN, ANN, "hi")
        await rig.answered(ANN, "Once.")
        await rig.settle()
    assert [(d.update_id, d.error) for d in fake.deliveries] == \
        [(update_id, "Read timeout expired"), (update_id, None)]
    assert answers(fake, ANN) == ["Once."] and len(model.requests) == 1


async def test_update_posted_while_stopped_is_retried_after_restart(
        tmp_path: Path, model: FakeModelServer, fake: FakeTelegram) -> None:
    model.script(Reply(text="Back."))
    async with core(tmp_path, model, fake) as (hub, dispatch, config):
        async with running(config, hub, dispatch) as first:
            assert first.url is not None
            fake.webhook_targets = [first.url]
            await hub.recover()
        assert fake.webhook is not None  # not deleted on stop
        update_id = fake.push_message(ANN, ANN, "are you there?")
        await fake.wait_for(lambda: len(fake.deliveries) >= 2)
        async with make_bot(fake) as bot:
            info = await bot.get_webhook_info()
        assert info.last_error_message == "Connection refused"
        assert info.pending_update_count == 1
        async with running(config, hub, dispatch) as second:
            assert second.url is not None and second.url != first.url
            fake.webhook_targets = [second.url]
            await fake.wait_for(lambda: answers(fake, ANN) == ["Back."])
            await hub.idle()
    assert [d.ok for d in fake.deliveries][-1] and not fake.pending_updates
    assert {d.update_id for d in fake.deliveries} == {update_id}
    assert len(model.requests) == 1


async def test_two_adapters_behind_a_rotating_balancer(
        tmp_path: Path, model: FakeModelServer, fake: FakeTelegram) -> None:
    """One hub, two webhook adapters (the first is the sink): each update is handled by
    whichever gets it; a lost answer's update reaches the other adapter too and is
    answered once; while one is down, its turn's update goes to the other."""
    model.script(*(Reply(text=t) for t in ("one", "two", "three", "four", "five")))
    async with core(tmp_path, model, fake, allowed_users=[ANN, BOB]) as (hub, dispatch, config):
        async with running(config, hub, dispatch) as a:
            async with running(config, hub) as b:
                assert a.url is not None and b.url is not None
                await hub.recover()
                fake.webhook_targets = [a.url, b.url]
                first = fake.push_message(ANN, ANN, "first")
                await fake.wait_for(lambda: answers(fake, ANN) == ["one"])
                second = fake.push_message(BOB, BOB, "second")
                await fake.wait_for(lambda: answers(fake, BOB) == ["two"])
                fake.lose_webhook_answers(1)  # a handles the third; its 200 is lost
                third = fake.push_message(ANN, ANN, "third")
                await fake.wait_for(lambda: not fake.pending_updates)
                await hub.idle()
            fourth = fake.push_message(BOB, BOB, "fourth")  # a's turn
            await fake.wait_for(lambda: answers(fake, BOB) == ["two", "four"])
            fifth = fake.push_message(ANN, ANN, "fifth")  # b's turn, but b is down
            await fake.wait_for(lambda: answers(fake, ANN) == ["one", "three", "five"])
            await hub.idle()
    assert [(d.update_id, d.url, d.error) for d in fake.deliveries] == [
        (first, a.url, None), (second, b.url, None), (third, a.url, "Read timeout expired"),
        (third, b.url, None), (fourth, a.url, None), (fifth, b.url, "Connection refused"),
        (fifth, a.url, None)]
    assert answers(fake, BOB) == ["two", "four"] and len(model.requests) == 5


# -- polling mode without polling ----------------------------------------------------------


async def test_polling_mode_without_polling_sends_only(
        tmp_path: Path, model: FakeModelServer, fake: FakeTelegram) -> None:
    fake.push_message(ANN, ANN, "for the elected poller")
    async with tg_rig(tmp_path, model, fake, adapter_args={"poll": False}) as rig:
        assert rig.adapter.app.updater is not None and not rig.adapter.app.updater.running
        await rig.adapter.emit(Notice(ConvKey("telegram", str(ANN)), "a reminder"))
        assert answers(fake, ANN) == ["a reminder"]  # sent before emit returned
        assert not rig.adapter.app.updater.running  # nothing could have polled
    assert not fake.calls_to("getUpdates") and not fake.calls_to("deleteWebhook")
    assert len(fake.pending_updates) == 1 and model.requests == []
    assert fake.calls_to("getMe") and fake.calls_to("setMyCommands")


async def test_sending_only_adapter_polls_once_elected(
        tmp_path: Path, model: FakeModelServer, fake: FakeTelegram) -> None:
    model.script(Reply(text="Now I poll."))
    async with tg_rig(tmp_path, model, fake, adapter_args={"poll": False}) as rig:
        fake.push_message(ANN, ANN, "hi")
        # started without its poller (which polls at once when it starts): none has run
        assert rig.adapter.app.updater is not None and not rig.adapter.app.updater.running
        assert not fake.calls_to("getUpdates")
        await rig.adapter.start_polling()
        await rig.adapter.start_polling()  # already polling: nothing more
        await rig.answered(ANN, "Now I poll.")
        await rig.settle()
    assert rig.adapter.poll and fake.calls_to("deleteWebhook")
    assert not fake.pending_updates and len(model.requests) == 1


async def test_polling_mode_still_polls(tmp_path: Path, model: FakeModelServer,
                                        fake: FakeTelegram) -> None:
    model.script(Reply(text="Polled."))
    async with tg_rig(tmp_path, model, fake) as rig:
        fake.push_message(ANN, ANN, "hi")
        await rig.answered(ANN, "Polled.")
        await rig.settle()
        assert rig.adapter.url is None
    assert fake.calls_to("getUpdates") and not fake.calls_to("setWebhook")


# -- configuration ---------------------------------------------------------------------------


@pytest.mark.parametrize(("hook", "key", "problem"), [
    ({"secret_token": None}, "telegram.webhook.secret_token", "is required"),
    ({"secret_token": ""}, "telegram.webhook.secret_token", "is required"),
    ({"secret_token": "has spaces"}, "telegram.webhook.secret_token", "1-256 characters"),
    ({"secret_token": "x"}, "telegram.webhook.secret_token", "at least 32 characters"),
    ({"secret_token": "a" * 31}, "telegram.webhook.secret_token", "at least 32 characters"),
    ({"url": None}, "telegram.webhook.url", "is required"),
    ({"url": "http://tandem.example/telegram"}, "telegram.webhook.url", "https://"),
    ({"path": "telegram"}, "telegram.webhook.path", "must start with /"),
    ({"url": "https://tandem.example:8080/telegram"}, "telegram.webhook.url",
     "was refused by Telegram"),
])
async def test_bad_webhook_settings_fail_start_naming_the_key(
        tmp_path: Path, model: FakeModelServer, fake: FakeTelegram, hook: dict[str, Any],
        key: str, problem: str) -> None:
    async with core(tmp_path, model, fake, webhook=webhook(**hook)) as (hub, dispatch, config):
        adapter = create(config, hub, dispatch)
        with pytest.raises(ConfigError) as raised:
            await adapter.start()
        assert raised.value.key == key and problem in raised.value.problem
        await adapter.stop()  # also after a start that failed
    if problem != "was refused by Telegram":
        assert fake.calls == []  # checked before anything is sent
