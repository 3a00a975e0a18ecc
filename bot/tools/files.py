"""File tools, confined to the workspace (resolved paths, symlinks included)."""

from __future__ import annotations

import asyncio
import json
import os
import tempfile
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


def occurrences(text: str, needle: str) -> list[int]:
    """Every index where `needle` starts in `text`, overlapping ones included."""
    found, start = [], text.find(needle)
    while start != -1:
        found.append(start)
        start = text.find(needle, start + 1)
    return found


def _replace_file(path: Path, data: bytes) -> None:
    """Write `data` over `path` atomically, keeping its permission bits."""
    mode = path.stat().st_mode & 0o7777
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


async def edit_file(ctx: ToolContext, args: dict[str, Any]) -> str:
    raw = require_str(args, "path")
    old = require_str(args, "old")
    new = require_str(args, "new", allow_empty=True)
    path = resolve(ctx, raw)
    if not path.is_file():
        raise ToolError(f"{raw!r} is not a file; use write_file to create one")
    if old == new:
        raise ToolError("`old` and `new` are identical; there is nothing to change")

    def edit() -> str:
        data = path.read_bytes()
        if len(data) > MAX_READ_BYTES:
            raise ToolError(f"{raw!r} is larger than {MAX_READ_BYTES:,} bytes; "
                            "edit it with the shell tool instead")
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError:
            raise ToolError(f"{raw!r} is not UTF-8 text; edit_file only changes text files") \
                from None
        found = occurrences(text, old)
        if not found:
            raise ToolError(f"`old` was not found in {raw!r}; read the file and copy the exact "
                            "text to replace, including whitespace and line breaks")
        if len(found) > 1:
            raise ToolError(f"`old` occurs {len(found)} times in {raw!r}; include more of the "
                            "surrounding text so it matches exactly once")
        at = found[0]
        _replace_file(path, (text[:at] + new + text[at + len(old):]).encode("utf-8"))
        line = text.count("\n", 0, at) + 1
        return f"edited {raw}: replaced {len(old)} characters with {len(new)} at line {line}"

    return await asyncio.to_thread(edit)


def _shown_path(path: str) -> str:
    return path if path.isprintable() and not path.startswith('"') else json.dumps(path)


def edit_summary(args: dict[str, Any]) -> str:
    """The whole change on the approval card: path, the text replaced and its replacement."""
    path, old, new = args.get("path"), args.get("old"), args.get("new")
    if not (isinstance(path, str) and isinstance(old, str) and isinstance(new, str)):
        return json.dumps(args, ensure_ascii=False, indent=1, sort_keys=True)
    return (f"{_shown_path(path)}\n"
            f"--- old ({len(old)} characters)\n{old}\n"
            f"+++ new ({len(new)} characters)\n{new}")


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
    Tool("edit_file",
         "Replace one exact piece of text in a workspace file. `old` must occur exactly once "
         "in the file (copy it verbatim, with enough surrounding lines to be unique); it is "
         "replaced by `new`. Prefer this to write_file for changing part of a file.",
         {"type": "object", "properties": {
             "path": PATH,
             "old": {"type": "string", "description": "The exact text to replace"},
             "new": {"type": "string", "description": "The replacement text (may be empty)"}},
          "required": ["path", "old", "new"]},
         edit_file, policy="ask", summary_key="path", render=edit_summary),
]
