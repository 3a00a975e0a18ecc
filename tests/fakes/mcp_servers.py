"""A real MCP server for tests, built with the official SDK (``mcp`` 2.x, ``MCPServer``).

Tools:

* ``echo(text)`` returns the text (annotated ``readOnlyHint=True``);
* ``sleep(seconds)`` sleeps, then returns ``"slept N"``; a client cancellation stops it;
* ``hang()`` never returns; a client cancellation stops it;
* ``fail()`` raises, which the SDK turns into an ``isError`` result ("Error executing tool fail");
* ``error_result()`` returns an explicit ``isError`` result: "the widget is broken";
* ``image()`` returns a text block and a 1x1 PNG ``ImageContent``;
* ``resource()`` returns an embedded text resource (``RESOURCE_URI``);
* ``add_tool(name)`` registers a tool ``name`` (answers ``"<name> ran"``) and sends
  ``notifications/tools/list_changed`` on the calling request's stream;
* ``crash()`` exits the server process mid-call (``os._exit(3)``);
* ``big(n)`` returns ``n`` characters of text;
* ``weird.name/v2`` has a name Tandem must sanitize (returns ``"weird ok"``);
* ``bad_schema`` publishes an input schema Tandem cannot use (``BAD_INPUT_SCHEMA``).

Every tool returns plain content blocks (no ``structuredContent``). The server advertises
``tools.listChanged``. If ``MCP_FAKE_LOG`` names a file, the server appends ``called <tool>``
for every call and ``cancelled <tool>`` when a cancellation stops ``sleep`` or ``hang``.
``MCP_FAKE_DESCRIPTION`` replaces ``echo``'s description (a server whose descriptions
speak to the model); ``MCP_FAKE_STDERR`` is written to the server's stderr as it starts.
``MCP_FAKE_EXTRA_TOOLS=N`` (or ``--extra-tools N``) publishes ``N`` more tools, ``extra_000``,
``extra_001``..., each like ``echo`` (one string argument ``text``, returned as is): a server
with a long tool list, for benchmarks.

Serve it with the repo root as the working directory (``-m`` resolves ``tests`` from there)::

    python -m tests.fakes.mcp_servers stdio
    python -m tests.fakes.mcp_servers http --port 8765 [--host 127.0.0.1] [--token T]
    python -m tests.fakes.mcp_servers --extra-tools 200 stdio

HTTP mode serves streamable HTTP at ``http://HOST:PORT/mcp``, prints that URL on stdout once
it listens (``--port 0`` picks a free port) and, with ``--token T``, answers 401 to any request
without ``Authorization: Bearer T``. ``http_server()`` runs it as a subprocess for a test.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import functools
import hmac
import os
import socket
import struct
import sys
import zlib
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import uvicorn
from mcp.server import MCPServer, NotificationOptions
from mcp.server.mcpserver import Context
from mcp.server.mcpserver.tools import Tool
from mcp.types import (
    CallToolResult,
    EmbeddedResource,
    ImageContent,
    TextContent,
    TextResourceContents,
    ToolAnnotations,
    ToolListChangedNotification,
)
from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Receive, Scope, Send

REPO_ROOT = Path(__file__).resolve().parents[2]
"""The working directory ``python -m tests.fakes.mcp_servers`` needs."""

LOG_ENV = "MCP_FAKE_LOG"
DESCRIPTION_ENV = "MCP_FAKE_DESCRIPTION"
STDERR_ENV = "MCP_FAKE_STDERR"
EXTRA_TOOLS_ENV = "MCP_FAKE_EXTRA_TOOLS"
WIDGET_ERROR = "the widget is broken"
RESOURCE_URI = "tandem://fake/notes.txt"
RESOURCE_TEXT = "notes from the fake MCP server"
WEIRD_NAME = "weird.name/v2"
BAD_SCHEMA_NAME = "bad_schema"
BAD_INPUT_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {"x": {"type": "frobnicate"}, "y": {"$ref": "#/$defs/missing"}},
    "required": ["x", "y"],
}
"""An object schema (the SDK client rejects a whole listing whose schema is not one) whose
property types are not JSON Schema: no argument can be built for it."""


def _log(line: str) -> None:
    path = os.environ.get(LOG_ENV)
    if path:
        with open(path, "a", encoding="utf-8") as f:
            f.write(line + "\n")


def tiny_png() -> bytes:
    """A valid 1x1 opaque red PNG."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        body = kind + data
        return struct.pack(">I", len(data)) + body + struct.pack(">I", zlib.crc32(body))

    header = struct.pack(">IIBBBBB", 1, 1, 8, 6, 0, 0, 0)  # 1x1, 8-bit RGBA
    pixels = zlib.compress(b"\x00\xff\x00\x00\xff")  # filter byte, then one RGBA pixel
    signature = b"\x89PNG\r\n\x1a\n"
    return signature + chunk(b"IHDR", header) + chunk(b"IDAT", pixels) + chunk(b"IEND", b"")


# --- tools -----------------------------------------------------------------------------------


def echo(text: str) -> str:
    """Return the text unchanged."""
    _log("called echo")
    return text


async def sleep(seconds: float) -> str:
    """Sleep for the given number of seconds."""
    _log("called sleep")
    try:
        await anyio.sleep(seconds)
    except anyio.get_cancelled_exc_class():
        _log("cancelled sleep")
        raise
    return f"slept {seconds:g}"


async def hang() -> str:
    """Never return."""
    _log("called hang")
    try:
        await anyio.sleep_forever()
    except anyio.get_cancelled_exc_class():
        _log("cancelled hang")
        raise
    raise AssertionError("unreachable")


def fail() -> str:
    """Raise an exception."""
    _log("called fail")
    raise RuntimeError("the fail tool always raises")


def error_result() -> CallToolResult:
    """Return an explicit error result."""
    _log("called error_result")
    return CallToolResult(content=[TextContent(type="text", text=WIDGET_ERROR)], is_error=True)


def image() -> list[TextContent | ImageContent]:
    """Return a caption and a tiny PNG."""
    _log("called image")
    data = base64.b64encode(tiny_png()).decode()
    return [
        TextContent(type="text", text="a 1x1 red pixel"),
        ImageContent(type="image", data=data, mime_type="image/png"),
    ]


def resource() -> EmbeddedResource:
    """Return an embedded text resource."""
    _log("called resource")
    contents = TextResourceContents(uri=RESOURCE_URI, text=RESOURCE_TEXT, mime_type="text/plain")
    return EmbeddedResource(type="resource", resource=contents)


async def add_tool(name: str, ctx: Context[Any, Any]) -> str:
    """Register a new tool called `name` and tell the client the tool list changed."""
    _log("called add_tool")

    def added() -> str:
        _log(f"called {name}")
        return f"{name} ran"

    ctx.mcp_server.add_tool(added, name=name, description="Added at runtime.",
                            structured_output=False)
    # On the request's own stream: over HTTP the server drops a standalone notification
    # while the client has no GET stream open.
    await ctx.session.send_notification(ToolListChangedNotification(),
                                        related_request_id=ctx.request_id)
    return f"added {name}"


def crash() -> str:
    """Exit the server process in the middle of the call."""
    _log("called crash")
    os._exit(3)


def big(n: int) -> str:
    """Return n characters of text."""
    _log("called big")
    return ("0123456789" * (n // 10 + 1))[:n]


def weird() -> str:
    """A tool whose name is not a valid function name."""
    _log(f"called {WEIRD_NAME}")
    return "weird ok"


def bad_schema() -> str:
    """A tool whose published input schema is unusable."""
    _log(f"called {BAD_SCHEMA_NAME}")
    return "bad schema ok"


def _bad_schema_tool() -> Tool:
    tool = Tool.from_function(bad_schema, name=BAD_SCHEMA_NAME, structured_output=False)
    # The function takes no arguments, so whatever a client sends is ignored.
    tool.parameters = dict(BAD_INPUT_SCHEMA)
    return tool


def _extra_tool(name: str) -> Tool:
    def extra(text: str) -> str:
        _log(f"called {name}")
        return text

    extra.__doc__ = f"{name}: return the text unchanged."
    return Tool.from_function(extra, name=name, structured_output=False)


def extra_tools() -> list[Tool]:
    """The ``MCP_FAKE_EXTRA_TOOLS`` tools (none when it is unset)."""
    count = int(os.environ.get(EXTRA_TOOLS_ENV) or 0)
    return [_extra_tool(f"extra_{i:03d}") for i in range(count)]


def build_server() -> MCPServer[Any]:
    """The fake server with every tool registered."""
    server: MCPServer[Any] = MCPServer("tandem-fake", version="1.0", log_level="WARNING",
                                       tools=[_bad_schema_tool(), *extra_tools()])
    read_only = ToolAnnotations(read_only_hint=True)
    server.add_tool(echo, annotations=read_only, structured_output=False,
                    description=os.environ.get(DESCRIPTION_ENV) or None)
    for fn in (sleep, hang, fail, error_result, image, resource, add_tool, crash, big):
        server.add_tool(fn, structured_output=False)
    server.add_tool(weird, name=WEIRD_NAME, structured_output=False)
    # MCPServer has no setting for the advertised listChanged flag; both transports build the
    # initialize result from the low-level server's create_initialization_options().
    low = server._lowlevel_server
    low.create_initialization_options = functools.partial(  # type: ignore[method-assign]
        low.create_initialization_options, NotificationOptions(tools_changed=True))
    return server


# --- transports ------------------------------------------------------------------------------


def require_bearer(app: ASGIApp, token: str) -> ASGIApp:
    """Wrap an ASGI app: HTTP requests without ``Authorization: Bearer <token>`` get a 401."""
    expected = f"Bearer {token}".encode()

    async def guarded(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            given = dict(scope["headers"]).get(b"authorization", b"")
            if not hmac.compare_digest(given, expected):
                response = JSONResponse(
                    {"error": "invalid_token", "error_description": "Authentication required"},
                    status_code=401,
                    headers={"WWW-Authenticate": 'Bearer error="invalid_token"'},
                )
                await response(scope, receive, send)
                return
        await app(scope, receive, send)

    return guarded


async def serve_http(host: str, port: int, token: str | None) -> None:
    app: ASGIApp = build_server().streamable_http_app(host=host)
    if token is not None:
        app = require_bearer(app, token)
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.listen(128)
    # Connections made from here on wait in the backlog until uvicorn has started.
    print(f"http://{host}:{sock.getsockname()[1]}/mcp", flush=True)
    config = uvicorn.Config(app, log_level="warning", lifespan="on")
    await uvicorn.Server(config).serve(sockets=[sock])


# --- helpers for tests -----------------------------------------------------------------------


def stdio_command() -> tuple[str, list[str]]:
    """Command and arguments that serve the fake over stdio; run them with cwd=REPO_ROOT."""
    return sys.executable, ["-m", "tests.fakes.mcp_servers", "stdio"]


@asynccontextmanager
async def http_server(token: str | None = None, *, log: Path | None = None,
                      port: int = 0) -> AsyncIterator[str]:
    """Run the fake over streamable HTTP in a subprocess (on `port`, else a free one);
    yield its URL."""
    args = ["-m", "tests.fakes.mcp_servers", "http", "--port", str(port)]
    if token is not None:
        args += ["--token", token]
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_ROOT), env.get("PYTHONPATH")]))
    if log is not None:
        env[LOG_ENV] = str(log)
    proc = await asyncio.create_subprocess_exec(
        sys.executable, *args, cwd=REPO_ROOT, env=env, stdout=asyncio.subprocess.PIPE)
    try:
        assert proc.stdout is not None
        line = await asyncio.wait_for(proc.stdout.readline(), 20)
        if not line:
            raise RuntimeError(f"fake MCP server exited with {await proc.wait()}")
        yield line.decode().strip()
    finally:
        if proc.returncode is None:
            proc.kill()
        await proc.wait()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Tandem's fake MCP server.")
    parser.add_argument("--extra-tools", type=int, default=None, metavar="N",
                        help=f"publish N more echo-like tools (default: ${EXTRA_TOOLS_ENV})")
    modes = parser.add_subparsers(dest="mode", required=True)
    modes.add_parser("stdio", help="serve over stdin/stdout")
    http = modes.add_parser("http", help="serve streamable HTTP at /mcp")
    http.add_argument("--host", default="127.0.0.1")
    http.add_argument("--port", type=int, default=0)
    http.add_argument("--token", default=None, help="require Authorization: Bearer TOKEN")
    args = parser.parse_args(argv)
    if args.extra_tools is not None:
        os.environ[EXTRA_TOOLS_ENV] = str(args.extra_tools)
    if os.environ.get(STDERR_ENV):
        sys.stderr.write(os.environ[STDERR_ENV])
        sys.stderr.flush()
    if args.mode == "stdio":
        anyio.run(build_server().run_stdio_async)
    else:
        anyio.run(serve_http, args.host, args.port, args.token)


if __name__ == "__main__":
    main()
