"""A stdio MCP server's stderr, as Tandem's own log records.

The server writes its log to a pipe; each line becomes one record of the logger
`bot.tools.mcp.stderr` ("mcp: <server>: <line>"), so it passes the same redaction and the
same format (`logging.format: json` included) as everything Tandem logs, and a line can
neither forge another (line breaks, control characters and invisible ones are written
out) nor flood the log (a line is cut at `MAX_LINE` characters).
"""

from __future__ import annotations

import asyncio
import logging
import os

from bot.core.invisible import visible

log = logging.getLogger(__name__)
MAX_LINE = 2000
CHUNK = 65536


async def relay(server: str, fd: int) -> None:
    """Read `fd` (the pipe's read end, closed here) until every writer closed it."""
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader(limit=CHUNK)
    pipe = os.fdopen(fd, "rb", buffering=0)
    transport, _ = await loop.connect_read_pipe(
        lambda: asyncio.StreamReaderProtocol(reader), pipe)
    try:
        pending = b""
        while chunk := await reader.read(CHUNK):
            *lines, pending = (pending + chunk).split(b"\n")
            if len(pending) > MAX_LINE * 4:  # a line without end: what came of it so far
                lines, pending = [*lines, pending], b""
            for line in lines:
                _say(server, line)
        if pending:
            _say(server, pending)
    finally:
        transport.close()


def _say(server: str, line: bytes) -> None:
    text = line.decode("utf-8", "replace").rstrip("\r")
    if not text.strip():
        return
    if len(text) > MAX_LINE:
        text = f"{text[:MAX_LINE]}… ({len(text) - MAX_LINE} more characters)"
    log.info("mcp: %s: %s", server, visible(text, one_line=True))


__all__ = ["relay"]
