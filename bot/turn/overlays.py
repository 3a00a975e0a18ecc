"""A persona overlay per place: a chat, a forum topic or a channel may add its own section
to the persona (`persona.places`, e.g. `"slack:C0123": chats/ops.md`).

The file is read again whenever it changes, like the rest of the persona, and the same
contents give back the same string, so the prompt's prefix stays byte-stable. A place
names a conversation exactly (`telegram:-100123/7`, a topic) or a whole chat
(`telegram:-100123`, `slack:C0123`: every topic and thread in it); the exact name wins.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

from bot.core.events import ConvKey

log = logging.getLogger(__name__)


class Overlays:
    def __init__(self, directory: str | Path, places: dict[str, str],
                 max_chars: int = 20_000) -> None:
        self.dir = Path(directory)
        self.places = places
        self.max_chars = max_chars
        self._read: dict[str, tuple[tuple[int, int] | None, str]] = {}
        """file -> (its size and mtime when read, its section)."""

    def file_for(self, key: ConvKey) -> str | None:
        """The overlay file of a conversation, if its place has one."""
        return self.places.get(str(key)) or self.places.get(f"{key.platform}:{key.chat_id}")

    def section(self, key: ConvKey) -> str:
        """The overlay's section of the system prompt ("" when the place has none, or its
        file is missing or empty)."""
        name = self.file_for(key)
        if name is None:
            return ""
        path = self.dir / name
        try:
            info = os.stat(path)
            stamp: tuple[int, int] | None = (info.st_size, info.st_mtime_ns)
        except OSError:
            stamp = None
        seen = self._read.get(name)
        if seen is not None and seen[0] == stamp:
            return seen[1]
        text = ""
        if stamp is not None:
            try:
                text = path.read_text(encoding="utf-8", errors="replace").strip()
            except OSError:
                log.warning("persona overlay %s is unreadable", path)
        else:
            log.warning("persona overlay %s is missing (persona.places)", path)
        if len(text) > self.max_chars:
            text = text[: self.max_chars] + f"\n[{name} truncated]"
        section = f"## This place ({name})\n\n{text}" if text else ""
        self._read[name] = (stamp, section)
        return section
