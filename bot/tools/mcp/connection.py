"""One MCP server: connected in the background, reconnected with backoff, called safely.

Everything the SDK opens (the transport, the session) is entered and left in this
connection's own task, as anyio requires. The tool list is fetched once per connection
and again on `notifications/tools/list_changed`. A call has a timeout; a server that
crashes, hangs or drops its session costs that call one clear error (never a hang,
never a `CancelledError` that escapes) and the connection starts over. Cancelling the
caller cancels the request (the SDK tells the server).
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Callable
from contextlib import AsyncExitStack
from typing import Any, TextIO

from bot.core.config import McpServerConfig
from bot.core.errors import ToolError
from bot.tools import Tool
from bot.tools.mcp.stderr import relay
from bot.tools.mcp.tools import Keep, build_tools, result_text

log = logging.getLogger(__name__)

FIRST_RETRY_S = 1.0
LAST_RETRY_S = 60.0
SESSION_UNKNOWN = frozenset({"Session terminated", "Session not found"})
"""How the SDK client (a bare 404) and a server (its JSON-RPC error) say that the server
does not know the session: it restarted, and the request never ran there."""


class Connection:
    def __init__(self, name: str, config: McpServerConfig,
                 publish: Callable[[str, list[Tool]], None]) -> None:
        self.name = name
        self.config = config
        self.publish = publish
        """Called with the server's tools whenever they are (re)listed."""
        self.state = "starting"
        """starting | connecting | connected | reconnecting | stopped"""
        self.error: str | None = None
        self.tool_count = 0
        self.connected_at: float | None = None
        self._session: Any = None
        self._broken = asyncio.Event()
        self._up = asyncio.Event()
        """Set while connected."""
        self._tried = asyncio.Event()
        self._closing = False
        self._task: asyncio.Task[None] | None = None
        self._refresh: asyncio.Task[None] | None = None
        self._relays: set[asyncio.Task[None]] = set()
        """Each server process's stderr, read until it closes."""

    # -- lifecycle ----------------------------------------------------------------------

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name=f"mcp:{self.name}")

    async def ready(self) -> bool:
        """Wait until the first attempt to connect is over; True when it succeeded."""
        await self._tried.wait()
        return self.state == "connected"

    async def close(self) -> None:
        self._closing = True
        self._broken.set()
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        for relay_task in list(self._relays):  # a child the server left may hold its end
            relay_task.cancel()
        await asyncio.gather(*self._relays, return_exceptions=True)
        self.state = "stopped"

    async def _run(self) -> None:
        delay = FIRST_RETRY_S
        while not self._closing:
            self.state = "connecting" if self.connected_at is None else "reconnecting"
            since = self.connected_at
            try:
                await self._session_once()
            except asyncio.CancelledError:
                if self._closing:
                    raise
            except Exception as exc:  # the SDK raises many kinds; each is this server's
                self.error = _describe(exc)
                self._tried.set()
                if self.connected_at != since:  # it was up this time: the backoff starts over
                    delay = FIRST_RETRY_S
                log.warning("mcp: %s is unavailable (%s); retrying in %.0f s", self.name,
                            self.error, delay)
            finally:
                self._session = None
            if self._closing:
                break
            self.state = "reconnecting"
            await asyncio.sleep(delay)
            delay = min(delay * 2, LAST_RETRY_S)

    async def _session_once(self) -> None:
        import anyio
        from mcp import ClientSession

        self._broken.clear()
        self._up.clear()
        async with AsyncExitStack() as stack:
            read, write = await stack.enter_async_context(await self._transport(stack))
            session = await stack.enter_async_context(
                ClientSession(read, write, message_handler=self._on_message))
            with anyio.fail_after(self.config.connect_timeout_s):
                await session.initialize()
                self._session = session
                await self._list()
            self.state, self.error = "connected", None
            self.connected_at = time.time()
            self._tried.set()
            self._up.set()
            log.info("mcp: %s connected, %d tools%s", self.name, self.tool_count,
                     "" if self.config.trusted else "; not trusted: while they are "
                     "offered, their descriptions taint every conversation")
            await self._broken.wait()
            self._up.clear()
        if not self._closing:
            raise ConnectionError(self.error or "the session ended")

    async def _transport(self, stack: AsyncExitStack) -> Any:
        if self.config.url:
            import httpx2
            from mcp.client.streamable_http import streamable_http_client

            client = await stack.enter_async_context(httpx2.AsyncClient(
                headers=self.config.headers, timeout=self.config.connect_timeout_s))
            return streamable_http_client(self.config.url, http_client=client)
        from mcp.client.stdio import StdioServerParameters, stdio_client

        assert self.config.command is not None
        # the environment is the process's own (readable by this user alone), never its
        # command line (anyone's to read): what is listed, over the SDK's few (PATH, HOME...)
        params = StdioServerParameters(command=self.config.command, args=self.config.args,
                                       env=dict(self.config.env), cwd=self.config.cwd)
        return stdio_client(params, errlog=self._stderr(stack))

    def _stderr(self, stack: AsyncExitStack) -> TextIO:
        """Where the server's own stderr goes: a pipe whose lines become Tandem's log
        records (`stderr.relay`), redacted and formatted like its own."""
        read_end, write_end = os.pipe()
        writer = os.fdopen(write_end, "w")
        stack.callback(writer.close)  # after the server is gone (entered before it)
        task = asyncio.get_running_loop().create_task(relay(self.name, read_end),
                                                      name=f"mcp:{self.name}:stderr")
        self._relays.add(task)
        task.add_done_callback(self._relays.discard)
        return writer

    # -- tools --------------------------------------------------------------------------

    async def _list(self) -> None:
        listed = []
        cursor = None
        while True:
            from mcp import types

            params: Any = types.PaginatedRequestParams(cursor=cursor) if cursor else None
            page = await self._session.list_tools(params=params)
            listed.extend(page.tools)
            cursor = page.next_cursor
            if not cursor:
                break
        # checking hundreds of schemas takes a while: not on the event loop
        tools = await asyncio.to_thread(build_tools, self.name, self.config, listed, self.call)
        self.tool_count = len(tools)
        self.publish(self.name, tools)

    async def _on_message(self, message: Any) -> None:
        if isinstance(message, Exception):
            self.error = _describe(message)
            self._broken.set()
            return
        if getattr(message, "method", "") == "notifications/tools/list_changed":
            self._refresh = asyncio.ensure_future(self._relist())

    async def _relist(self) -> None:
        try:
            await self._list()
        except Exception as exc:
            log.warning("mcp: %s: could not list its changed tools (%s)", self.name,
                        _describe(exc))

    # -- calls --------------------------------------------------------------------------

    async def call(self, tool: str, args: dict[str, Any], keep: Keep | None = None, *,
                   again: bool = True) -> str:
        """The tool's result as text. A session the server no longer knows (it restarted:
        the request never ran) is opened again and the call made once more."""
        session = self._session
        if session is None or self.state != "connected":
            why = f": {self.error}" if self.error else ""
            raise ToolError(f"the MCP server `{self.name}` is not connected{why}; Tandem "
                            "keeps reconnecting, try again later")
        import anyio
        from mcp.shared.exceptions import MCPError
        from mcp_types.jsonrpc import CONNECTION_CLOSED, INVALID_REQUEST

        timeout = self.config.timeout_s
        try:
            with anyio.fail_after(timeout):
                result = await session.call_tool(tool, args)
        except TimeoutError:
            raise ToolError(f"`{tool}` on the MCP server `{self.name}` did not answer "
                            f"within {timeout:g} s") from None
        except MCPError as exc:
            if exc.code == INVALID_REQUEST and exc.error.message in SESSION_UNKNOWN:
                self._gone("the server ended the session")
                if again and await self._back(self.config.connect_timeout_s):
                    return await self.call(tool, args, keep, again=False)
                raise ToolError(f"the MCP server `{self.name}` ended the session before "
                                f"`{tool}` ran; Tandem reconnects to it") from None
            if exc.code != CONNECTION_CLOSED:
                raise ToolError(f"the MCP server `{self.name}` refused `{tool}`: "
                                f"{exc.error.message}") from None
            self._gone("the connection closed")
            raise ToolError(f"the MCP server `{self.name}` went away during `{tool}`; "
                            "Tandem reconnects to it") from None
        except (anyio.ClosedResourceError, anyio.BrokenResourceError, anyio.EndOfStream,
                OSError, ConnectionError) as exc:
            self._gone(_describe(exc))
            raise ToolError(f"the MCP server `{self.name}` went away during `{tool}`; "
                            "Tandem reconnects to it") from None
        return result_text(self.name, result, keep)

    def _gone(self, why: str) -> None:
        """The session is dead: calls fail at once until the connection is back."""
        self.error = why
        self.state = "reconnecting"
        self._up.clear()
        self._broken.set()

    async def _back(self, within: float) -> bool:
        """Wait (at most `within` seconds) for the connection to be up again."""
        try:
            await asyncio.wait_for(self._up.wait(), within)
        except TimeoutError:
            return False
        return self.state == "connected"

    def status(self) -> str:
        tools = f", {self.tool_count} tools" if self.state == "connected" else ""
        error = f", last error: {self.error}" if self.error else ""
        return f"{self.name}: {self.state}{tools}{error}"


def _describe(exc: BaseException) -> str:
    """One line for a person: the type and the first line of the message."""
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0]}" if text else type(exc).__name__


__all__ = ["Connection"]
