"""What an MCP result carries besides text (pictures, audio, binary resources): kept in
the workspace under `mcp/<server>/`, named to the model by path, and pictures shown in
the conversation where its platform can post files."""

from __future__ import annotations

import logging
import mimetypes
import os
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import BinaryIO

from bot.core.errors import ToolError
from bot.media import new_file
from bot.media.receive import safe_name

log = logging.getLogger(__name__)

Send = Callable[[BinaryIO, int, str, str, bool], Awaitable[None]]


class Kept:
    """Called with (kind, mime type, bytes) for each non-text part; returns where it is."""

    def __init__(self, workspace: Path, server: str, tool: str) -> None:
        self.workspace = workspace
        self.folder = f"mcp/{safe_name(server, 'server')}"
        self.tool = safe_name(tool, "result")
        self.pictures: list[Path] = []

    def __call__(self, kind: str, mime: str, data: bytes) -> str:
        ext = mimetypes.guess_extension(mime or "") or ".bin"
        try:
            path = new_file(self.workspace, self.folder, f"{self.tool}{ext}")
            path.write_bytes(data)
        except OSError as exc:
            log.warning("mcp: could not keep a %s from %s: %s", kind, self.tool, exc)
            return "not kept (the workspace refused it)"
        if kind == "image":
            self.pictures.append(path)
        return f"saved as {path.relative_to(self.workspace).as_posix()}"

    async def show(self, send: Send | None) -> list[str]:
        """Post the pictures to the conversation; a line for each one shown."""
        lines: list[str] = []
        if send is None:
            return lines
        for path in self.pictures:
            try:
                with path.open("rb") as fh:
                    await send(fh, os.fstat(fh.fileno()).st_size, path.name, "", True)
            except (OSError, ToolError) as exc:
                log.info("mcp: could not show %s: %s", path.name, exc)
                continue
            lines.append(f"[{path.name} is shown in the chat]")
        return lines
