"""The fake MCP server, exercised through the official SDK client over stdio and HTTP."""

from __future__ import annotations

import asyncio
import base64
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import httpx2
import pytest
from mcp import ClientSession, StdioServerParameters, stdio_client
from mcp.client.session import IncomingMessage
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError
from mcp.types import (
    CallToolResult,
    EmbeddedResource,
    ImageContent,
    TextContent,
    TextResourceContents,
    ToolListChangedNotification,
)

from tests.fakes.mcp_servers import (
    BAD_INPUT_SCHEMA,
    BAD_SCHEMA_NAME,
    LOG_ENV,
    REPO_ROOT,
    RESOURCE_URI,
    WEIRD_NAME,
    WIDGET_ERROR,
    http_server,
    stdio_command,
    tiny_png,
)
from tests.waiting import eventually

TOKEN = "s3cret"
TOOLS = {"echo", "sleep", "hang", "fail", "error_result", "image", "resource", "add_tool",
         "crash", "big", WEIRD_NAME, BAD_SCHEMA_NAME}


class Notifications:
    """A message handler that keeps what the server sent and signals a tools list change."""

    def __init__(self) -> None:
        self.messages: list[IncomingMessage] = []
        self.tools_changed = asyncio.Event()

    async def __call__(self, message: IncomingMessage) -> None:
        self.messages.append(message)
        if isinstance(message, ToolListChangedNotification):
            self.tools_changed.set()


@asynccontextmanager
async def stdio_session(log: Path, notes: Notifications | None = None
                        ) -> AsyncIterator[ClientSession]:
    command, args = stdio_command()
    params = StdioServerParameters(command=command, args=args, cwd=REPO_ROOT,
                                   env={LOG_ENV: str(log)})
    async with (stdio_client(params) as (read, write),
                ClientSession(read, write, message_handler=notes) as session):
        await session.initialize()
        yield session


@asynccontextmanager
async def http_session(url: str, headers: dict[str, str], notes: Notifications | None = None
                       ) -> AsyncIterator[ClientSession]:
    async with (httpx2.AsyncClient(headers=headers) as http,
                streamable_http_client(url, http_client=http) as (read, write),
                ClientSession(read, write, message_handler=notes) as session):
        await session.initialize()
        yield session


def text_of(result: CallToolResult) -> str:
    return "".join(block.text for block in result.content if isinstance(block, TextContent))


def logged(log: Path) -> list[str]:
    return log.read_text().splitlines() if log.exists() else []


async def check_cancel(session: ClientSession, log: Path, tool: str = "sleep") -> None:
    """Cancelling the task awaiting a long call ends it at once; the server stops the tool."""
    arguments = {"seconds": 30} if tool == "sleep" else {}
    calls = logged(log).count(f"called {tool}")
    call = asyncio.create_task(session.call_tool(tool, arguments))
    await eventually(lambda: logged(log).count(f"called {tool}") > calls, 10,
                     what=f"{tool} running on the server")
    started = time.monotonic()
    call.cancel()
    with pytest.raises(asyncio.CancelledError):
        await call
    assert time.monotonic() - started < 2
    assert text_of(await session.call_tool("echo", {"text": "still here"})) == "still here"
    assert f"cancelled {tool}" in logged(log)


async def check_list_changed(session: ClientSession, notes: Notifications) -> None:
    result = await session.call_tool("add_tool", {"name": "late_tool"})
    assert text_of(result) == "added late_tool"
    await asyncio.wait_for(notes.tools_changed.wait(), 5)
    assert "late_tool" in {tool.name for tool in (await session.list_tools()).tools}
    assert text_of(await session.call_tool("late_tool", {})) == "late_tool ran"


async def test_stdio_lists_tools_and_advertises_list_changed(tmp_path: Path) -> None:
    command, args = stdio_command()
    params = StdioServerParameters(command=command, args=args, cwd=REPO_ROOT)
    async with (stdio_client(params) as (read, write),
                ClientSession(read, write) as session):
        init = await session.initialize()
        tools = {tool.name: tool for tool in (await session.list_tools()).tools}
    assert init.capabilities.tools is not None and init.capabilities.tools.list_changed
    assert set(tools) == TOOLS
    echo = tools["echo"]
    assert echo.annotations is not None and echo.annotations.read_only_hint is True
    assert echo.input_schema["required"] == ["text"]
    assert tools[BAD_SCHEMA_NAME].input_schema == BAD_INPUT_SCHEMA


async def test_stdio_results(tmp_path: Path) -> None:
    log = tmp_path / "mcp.log"
    async with stdio_session(log) as session:
        echoed = await session.call_tool("echo", {"text": "hello"})
        failed = await session.call_tool("fail", {})
        broken = await session.call_tool("error_result", {})
        picture = await session.call_tool("image", {})
        embedded = await session.call_tool("resource", {})
        big = await session.call_tool("big", {"n": 100_000})
        weird = await session.call_tool(WEIRD_NAME, {})
    assert (echoed.is_error, text_of(echoed)) == (False, "hello")
    assert failed.is_error and text_of(failed) == "Error executing tool fail"
    assert broken.is_error and text_of(broken) == WIDGET_ERROR
    images = [block for block in picture.content if isinstance(block, ImageContent)]
    assert len(images) == 1 and images[0].mime_type == "image/png"
    assert base64.b64decode(images[0].data) == tiny_png()
    assert tiny_png().startswith(b"\x89PNG\r\n\x1a\n")
    assert text_of(picture)
    [block] = embedded.content
    assert isinstance(block, EmbeddedResource)
    assert isinstance(block.resource, TextResourceContents)
    assert str(block.resource.uri) == RESOURCE_URI
    assert len(text_of(big)) == 100_000
    assert text_of(weird) == "weird ok"
    assert logged(log)[:3] == ["called echo", "called fail", "called error_result"]


async def test_stdio_add_tool_sends_list_changed(tmp_path: Path) -> None:
    notes = Notifications()
    async with stdio_session(tmp_path / "mcp.log", notes) as session:
        await check_list_changed(session, notes)


async def test_stdio_cancel_stops_sleep_and_hang(tmp_path: Path) -> None:
    log = tmp_path / "mcp.log"
    async with stdio_session(log) as session:
        await check_cancel(session, log, "sleep")
        await check_cancel(session, log, "hang")


async def test_stdio_crash_ends_the_call_with_an_error(tmp_path: Path) -> None:
    log = tmp_path / "mcp.log"
    async with stdio_session(log) as session:
        with pytest.raises(MCPError, match="Connection closed"):
            await asyncio.wait_for(session.call_tool("crash", {}), 10)
    assert logged(log) == ["called crash"]


async def test_http_with_token(tmp_path: Path) -> None:
    log = tmp_path / "mcp.log"
    notes = Notifications()
    async with (http_server(TOKEN, log=log) as url,
                http_session(url, {"Authorization": f"Bearer {TOKEN}"}, notes) as session):
        assert url.endswith("/mcp")
        assert {tool.name for tool in (await session.list_tools()).tools} == TOOLS
        assert text_of(await session.call_tool("echo", {"text": "over http"})) == "over http"
        assert (await session.call_tool("error_result", {})).is_error
        await check_list_changed(session, notes)
        await check_cancel(session, log)


async def test_http_without_token_is_refused() -> None:
    async with http_server(TOKEN) as url:
        async with httpx2.AsyncClient() as http:
            response = await http.post(url, json={"jsonrpc": "2.0", "id": 1, "method": "ping"})
        assert response.status_code == 401
        assert response.headers["www-authenticate"].startswith("Bearer")
        # The SDK client reports the 401 as a JSON-RPC internal error on the request.
        async with (httpx2.AsyncClient(headers={"Authorization": "Bearer wrong"}) as http,
                    streamable_http_client(url, http_client=http) as (read, write),
                    ClientSession(read, write) as session):
            with pytest.raises(MCPError, match="error response"):
                await session.initialize()


async def test_http_without_a_token_configured_needs_none() -> None:
    async with http_server() as url, http_session(url, {}) as session:
        assert text_of(await session.call_tool("echo", {"text": "open"})) == "open"
