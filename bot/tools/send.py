"""`send_file`: post a workspace file to the conversation (as a picture when it is one).

It sends data out of the workspace, so it asks by default, and its card names the file
and its size. The file is opened once, checked like every file tool's (inside the
workspace, no links), and that open file is what is uploaded.
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import Any

from bot.core.errors import PathRefused, ToolError
from bot.media import size_text
from bot.tools import Tool, ToolContext, require_str
from bot.tools.files import PATH, open_checked, resolve

PICTURES = (".png", ".jpg", ".jpeg", ".gif", ".webp")


async def send_file(ctx: ToolContext, args: dict[str, Any]) -> str:
    raw = require_str(args, "path")
    caption = args.get("caption") or ""
    if not isinstance(caption, str):
        raise ToolError("`caption` must be a string")
    send = ctx.extras.get("send_file")
    if send is None:
        raise ToolError("files cannot be sent from this conversation")
    path = resolve(ctx, raw)
    fh = await asyncio.to_thread(open_checked, ctx, raw, path)
    with fh:
        size = os.fstat(fh.fileno()).st_size
        if size == 0:
            raise ToolError(f"{raw!r} is empty; there is nothing to send")
        await send(fh, size, path.name, caption, path.suffix.lower() in PICTURES)
    return f"Sent {path.name} ({size_text(size)}) to the conversation."


def tool(workspace: Path) -> Tool:
    """The tool, its card reading sizes from `workspace`."""

    def card(args: dict[str, Any]) -> str:
        raw = args.get("path")
        if not isinstance(raw, str):
            return f"send a file: {args!r}"
        ctx = ToolContext(workspace=workspace, protected=frozenset(), env={})
        try:
            size = size_text(resolve(ctx, raw).stat().st_size)
        except (PathRefused, OSError):
            size = "not found"
        caption = args.get("caption")
        return f"send {raw} ({size})" + (f"\ncaption: {caption}" if caption else "")

    return Tool(
        "send_file", "Post a file from the workspace to this conversation (pictures are "
        "shown as pictures), with an optional caption.",
        {"type": "object", "properties": {
            "path": PATH, "caption": {"type": "string", "description": "Text shown with it"}},
         "required": ["path"]},
        send_file, policy="ask", summary_key="path", render=card, lasting=True)
