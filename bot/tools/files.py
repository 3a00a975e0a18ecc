"""File tools, confined to the workspace (resolved paths, symlinks included)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from bot.errors import PathRefused, ToolError
from bot.tools import Tool, ToolContext, require_str

MAX_READ_BYTES = 2_000_000
MAX_LIST = 500


def resolve(ctx: ToolContext, raw: str) -> Path:
    """The real path of `raw` inside the workspace, or PathRefused."""
    if "\x00" in raw:
        raise PathRefused("the path contains a NUL byte")
    root = ctx.workspace.resolve()
    target = (root / raw).resolve()
    if target != root and root not in target.parents:
        raise PathRefused(f"{raw!r} is outside the workspace; file tools only work inside it")
    if target in ctx.protected or target.name == ".env":
        raise PathRefused(f"{raw!r} is protected and no tool may read or change it")
    return target


async def read_file(ctx: ToolContext, args: dict[str, Any]) -> str:
    path = resolve(ctx, require_str(args, "path"))
    if not path.is_file():
        raise ToolError(f"{args['path']!r} is not a file")

    def read() -> str:
        with path.open("rb") as fh:
            data = fh.read(MAX_READ_BYTES + 1)
        text = data[:MAX_READ_BYTES].decode("utf-8", errors="replace")
        return text + ("\n[file truncated]" if len(data) > MAX_READ_BYTES else "")

    return await asyncio.to_thread(read)


async def list_dir(ctx: ToolContext, args: dict[str, Any]) -> str:
    raw = args.get("path") or "."
    path = resolve(ctx, str(raw))
    if not path.is_dir():
        raise ToolError(f"{raw!r} is not a directory")
    entries = sorted(path.iterdir(), key=lambda p: p.name)
    lines = [f"{p.name}/" if p.is_dir() else f"{p.name} ({p.stat().st_size} bytes)"
             for p in entries[:MAX_LIST] if p.resolve() not in ctx.protected]
    if len(entries) > MAX_LIST:
        lines.append(f"[... {len(entries) - MAX_LIST} more entries]")
    return "\n".join(lines) or "(empty directory)"


async def write_file(ctx: ToolContext, args: dict[str, Any]) -> str:
    path = resolve(ctx, require_str(args, "path"))
    content = require_str(args, "content", allow_empty=True)
    path.parent.mkdir(parents=True, exist_ok=True)
    await asyncio.to_thread(path.write_text, content, encoding="utf-8")
    return f"wrote {len(content.encode())} bytes to {args['path']}"


PATH = {"type": "string", "description": "Path relative to the workspace"}

TOOLS = [
    Tool("read_file", "Read a text file from the workspace.",
         {"type": "object", "properties": {"path": PATH}, "required": ["path"]},
         read_file, policy="allow", summary_key="path"),
    Tool("list_dir", "List a directory of the workspace.",
         {"type": "object", "properties": {"path": PATH}}, list_dir, policy="allow",
         summary_key="path"),
    Tool("write_file", "Create or overwrite a text file in the workspace.",
         {"type": "object", "properties": {"path": PATH, "content": {"type": "string"}},
          "required": ["path", "content"]}, write_file, policy="ask", summary_key="path"),
]
