"""The system prompt, rebuilt from `persona/` before every model call.

The files are read every time (a persona edit takes effect on the very next request),
but an unchanged set of contents returns the previously assembled string itself, byte
for byte, so the provider's prefix cache keeps hitting.

Tandem ships a default persona as package data (`bot/_persona`, a link to the
repository's `persona/`). When `persona.dir` holds neither AGENT.md nor RULES.md (it
does not exist, say, or holds only the notes Tandem wrote there), those two come from
the default, and so do USER.md and MEMORY.md where `persona.dir` has none; Tandem says
so once in its log. Notes are always written to `persona.dir` (`bot.tools.memory`).
"""

from __future__ import annotations

import hashlib
import logging
import os
from importlib.resources import files
from importlib.resources.abc import Traversable
from pathlib import Path

FILES = ("AGENT.md", "RULES.md", "USER.md", "MEMORY.md")
HEADER = (
    "You are Tandem, an AI agent working with a team in their chat. The sections below "
    "come from your persona files; follow RULES.md above everything else."
)
DEFAULT: Traversable = files("bot") / "_persona"
"""The default persona shipped with Tandem."""

log = logging.getLogger(__name__)


def _packaged(name: str) -> str:
    try:
        return DEFAULT.joinpath(name).read_text(encoding="utf-8")
    except (FileNotFoundError, IsADirectoryError):
        return ""


class Persona:
    def __init__(self, directory: str | Path, max_file_chars: int = 20_000) -> None:
        self.dir = Path(directory)
        self.max_file_chars = max_file_chars
        self._paths = [os.path.join(self.dir, name) for name in FILES]
        self._contents: tuple[str, ...] | None = None
        self._stats: tuple[tuple[int, ...], ...] | None = None
        self._prompt = ""
        self._said = False
        self.fingerprint = ""
        self._say_once(self._stat())

    def _stat(self) -> tuple[tuple[int, ...], ...]:
        out: list[tuple[int, ...]] = []
        for path in self._paths:
            try:
                st = os.stat(path)
                out.append((st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns))
            except OSError:
                out.append(())
        return tuple(out)

    @staticmethod
    def _default(stats: tuple[tuple[int, ...], ...]) -> bool:
        """Whether the default persona stands in: neither AGENT.md nor RULES.md is there
        (the two files only an admin writes)."""
        return not stats[0] and not stats[1]

    def packaged(self) -> bool:
        """Whether the default persona shipped with Tandem is used for `persona.dir`."""
        return self._default(self._stat())

    def note(self) -> str:
        return (f"persona.dir {self.dir}/ has no AGENT.md or RULES.md, so Tandem uses its "
                f"default persona ({DEFAULT}); copy its files to {self.dir}/ to change "
                f"it. Notes are still written to {self.dir}/")

    def _say_once(self, stats: tuple[tuple[int, ...], ...]) -> None:
        if not self._said and self._default(stats):
            self._said = True
            log.warning("%s", self.note())

    def _read(self, default: bool) -> tuple[str, ...]:
        out = []
        for name in FILES:
            try:
                out.append((self.dir / name).read_text(encoding="utf-8", errors="replace"))
            except (FileNotFoundError, IsADirectoryError):
                out.append(_packaged(name) if default else "")
        return tuple(out)

    def system_prompt(self) -> str:
        """The prompt for the next request: re-read when any persona file changed."""
        stats = self._stat()
        if stats == self._stats:
            return self._prompt
        self._stats = stats
        self._say_once(stats)
        contents = self._read(self._default(stats))
        if contents != self._contents:
            self._contents = contents
            self._prompt = self._assemble(contents)
            self.fingerprint = hashlib.sha256(self._prompt.encode()).hexdigest()[:12]
        return self._prompt

    def _assemble(self, contents: tuple[str, ...]) -> str:
        parts = [HEADER]
        for name, text in zip(FILES, contents, strict=True):
            text = text.strip()
            if not text:
                continue
            if len(text) > self.max_file_chars:
                text = text[: self.max_file_chars] + f"\n[{name} truncated]"
            parts.append(f"## {name}\n\n{text}")
        return "\n\n".join(parts)

    def missing(self) -> list[str]:
        return [n for n in FILES[:3] if not (self.dir / n).is_file()]
