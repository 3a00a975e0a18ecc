"""The aiohttp transport under python-telegram-bot: proxies from the environment."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from aiohttp import web
from telegram.error import NetworkError

from adapters.telegram_api import AiohttpRequest

TARGET = "http://api.telegram.invalid/bot123:abc/getMe"


@pytest.fixture
async def proxy() -> AsyncIterator[tuple[str, list[str]]]:
    """A forward HTTP proxy that answers every request itself and records its URL."""
    seen: list[str] = []

    async def handle(request: web.Request) -> web.Response:
        seen.append(str(request.url))
        return web.json_response({"ok": True, "result": {"via": "proxy"}})

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", handle)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    host, port = runner.addresses[0][:2]
    try:
        yield f"http://{host}:{port}", seen
    finally:
        await runner.cleanup()


async def test_requests_go_through_the_proxy_the_environment_sets(
        proxy: tuple[str, list[str]], monkeypatch: pytest.MonkeyPatch) -> None:
    url, seen = proxy
    monkeypatch.setenv("HTTP_PROXY", url)
    monkeypatch.delenv("NO_PROXY", raising=False)
    monkeypatch.delenv("no_proxy", raising=False)
    request = AiohttpRequest()
    await request.initialize()
    try:
        for _ in range(2):
            status, body = await request.do_request(TARGET, "POST")
            assert status == 200 and b"proxy" in body
    finally:
        await request.shutdown()
    assert seen == [TARGET, TARGET]


async def test_no_proxy_is_honoured(proxy: tuple[str, list[str]],
                                    monkeypatch: pytest.MonkeyPatch) -> None:
    url, seen = proxy
    monkeypatch.setenv("HTTP_PROXY", url)
    monkeypatch.setenv("NO_PROXY", "api.telegram.invalid")
    request = AiohttpRequest(connect_timeout=2.0)
    await request.initialize()
    try:
        with pytest.raises(NetworkError):  # straight to a host that does not exist
            await request.do_request(TARGET, "POST")
    finally:
        await request.shutdown()
    assert seen == []
