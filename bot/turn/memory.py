"""Where `remember` notes live, and the part of the system prompt they make.

`memory.scope` says whose prompt a note enters:

* `conversation` (the default): `persona/memory/conversations/<conversation>/`, seen
  only in that conversation, so one chat's memory never reaches another's prompt;
* `user`: `persona/memory/users/<platform>-<user>/`, seen wherever that person asks;
* `global`: the persona's own USER.md and MEMORY.md, seen in every conversation.

The persona's own USER.md and MEMORY.md are always part of the prompt (an admin curates
them); scoped notes follow them. Each folder is created 0700 and each file 0600. Reads
are cached by file status, so an unchanged memory gives the same string object back.
"""

from __future__ import annotations

import hashlib
import os
import re
from collections import OrderedDict
from pathlib import Path

from bot.core.events import ConvKey

FILES = ("USER.md", "MEMORY.md")
CACHED_SCOPES = 1_000
_UNSAFE = re.compile(r"[^A-Za-z0-9_.-]+")


def _slug(*parts: str) -> str:
    """A readable folder name for `parts`, with a hash so two keys never share one."""
    readable = "_".join(_UNSAFE.sub("-", p).strip("-.") or "-" for p in parts)[:80]
    digest = hashlib.sha256("\x00".join(parts).encode()).hexdigest()[:8]
    return f"{readable}-{digest}"


def scope_dir(persona_dir: Path, scope: str, conv: ConvKey, user: str) -> Path:
    """The folder this conversation's (or user's) notes are written to and read from."""
    if scope == "global":
        return persona_dir
    if scope == "user":
        return persona_dir / "memory" / "users" / _slug(conv.platform, user or "-")
    parts = [conv.platform, conv.chat_id, *([conv.thread_id] if conv.thread_id else [])]
    return persona_dir / "memory" / "conversations" / _slug(*parts)


class Memory:
    """The scoped notes of a conversation, as a section of the system prompt."""

    def __init__(self, persona_dir: str | Path, scope: str, max_file_chars: int) -> None:
        self.dir = Path(persona_dir)
        self.scope = scope
        self.max_file_chars = max_file_chars
        self._cache: OrderedDict[Path, tuple[tuple[tuple[int, ...], ...], str]] = OrderedDict()

    def folder(self, conv: ConvKey, user: str) -> Path:
        return scope_dir(self.dir, self.scope, conv, user)

    def section(self, conv: ConvKey, user: str) -> str:
        """The notes for the prompt ("" when there are none, or the scope is global:
        the persona's own files hold those)."""
        if self.scope == "global":
            return ""
        folder = self.folder(conv, user)
        stats = tuple(_stat(folder / name) for name in FILES)
        cached = self._cache.get(folder)
        if cached is not None and cached[0] == stats:
            self._cache.move_to_end(folder)
            return cached[1]
        text = self._assemble(folder) if any(stats) else ""
        self._cache[folder] = (stats, text)
        while len(self._cache) > CACHED_SCOPES:
            self._cache.popitem(last=False)
        return text

    def _assemble(self, folder: Path) -> str:
        whose = "this conversation" if self.scope == "conversation" else "this person"
        parts = []
        for name in FILES:
            try:
                text = (folder / name).read_text(encoding="utf-8", errors="replace").strip()
            except OSError:
                continue
            if len(text) > self.max_file_chars:
                text = text[: self.max_file_chars] + f"\n[{name} truncated]"
            if text:
                parts.append(f"## {name} of {whose}\n\n{text}")
        return "\n\n".join(parts)


def _stat(path: Path) -> tuple[int, ...]:
    try:
        st = os.stat(path)
    except OSError:
        return ()
    return (st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


__all__ = ["FILES", "Memory", "scope_dir"]
