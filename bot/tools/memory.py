"""The `remember` tool: append a dated note to USER.md or MEMORY.md of its scope.

A note is a file write: its policy is `ask` like every other write. Where it goes (this
conversation, this person, or the persona itself) is `memory.scope` (`bot.turn.memory`).
The prompt is rebuilt before every model call, so a note reaches the very next request.
Only those two files can be written; RULES.md and AGENT.md never can. Memory folders
are created 0700 and memory files 0600.
"""

from __future__ import annotations

import asyncio
import re
from datetime import UTC, datetime, tzinfo
from pathlib import Path
from typing import Any

from bot.core.config import PersonaConfig
from bot.core.errors import ToolError
from bot.core.file_modes import private_dir, private_file
from bot.tools import Tool, ToolContext, require_str

MAX_FACT_CHARS = 1_000
FILES = {"USER": "USER.md", "MEMORY": "MEMORY.md"}
HEADERS = {"USER.md": "# About the people you work with\n",
           "MEMORY.md": "# Things to remember\n"}
_SPACE = re.compile(r"\s+")


def clean_fact(raw: str) -> str:
    """One line of text: a note can never start a section of the system prompt."""
    printable = "".join(c if c.isprintable() else " " for c in raw)
    return _SPACE.sub(" ", printable).strip()


def target_file(raw: Any) -> str:
    name = str(raw or "USER").strip()
    key = name.upper().removesuffix(".MD")
    if key not in FILES:
        raise ToolError(f"`file` must be \"USER\" (facts about the people) or \"MEMORY\" "
                        f"(anything else), not {name!r}; no other persona file can be written")
    return FILES[key]


def _today(ctx: ToolContext) -> str:
    """Today's date in the configured zone when one is given, else the machine's."""
    tz = ctx.extras.get("tz")
    zone = tz if isinstance(tz, tzinfo) else None
    return datetime.now(UTC).astimezone(zone).strftime("%Y-%m-%d")


async def remember(ctx: ToolContext, args: dict[str, Any]) -> str:
    fact = clean_fact(require_str(args, "fact", allow_empty=True))
    if not fact:
        raise ToolError("`fact` is empty; say what to remember in one sentence")
    if len(fact) > MAX_FACT_CHARS:
        raise ToolError(f"the fact is {len(fact):,} characters; keep it to at most "
                        f"{MAX_FACT_CHARS:,} (one or two sentences)")
    name = target_file(args.get("file"))
    directory = ctx.extras.get("memory_dir", ctx.extras.get("persona_dir"))
    if not isinstance(directory, Path):
        raise ToolError("memory is not available here (no persona directory)")
    root = directory.resolve()
    path = (root / name).resolve()
    if path != root / name or (path.exists() and not path.is_file()):
        raise ToolError(f"{name} is not a plain file in the persona directory; "
                        "an admin needs to fix it")
    limit = ctx.extras.get("persona_max_chars")
    limit = limit if isinstance(limit, int) else PersonaConfig().max_file_chars
    line = f"- {_today(ctx)}: {fact}\n"

    persona = ctx.extras.get("persona_dir")
    top = persona.resolve() if isinstance(persona, Path) and persona.resolve() in \
        (root, *root.parents) else None

    def append() -> str:
        private_dir(root, below=top)  # memory/ and memory/conversations/ private too
        private_file(path)
        current = path.read_text(encoding="utf-8")
        if any(row.partition(": ")[2] == fact for row in current.splitlines()
               if row.startswith("- ")):
            return f"already in {name}: {fact}"
        prefix = "" if current else HEADERS[name] + "\n"
        if current and not current.endswith("\n"):
            prefix = "\n"
        if len(current) + len(prefix) + len(line) > limit:
            raise ToolError(f"{name} is full ({len(current):,} of {limit:,} characters the "
                            "system prompt keeps); tell the user an admin needs to tidy it")
        with path.open("a", encoding="utf-8") as fh:
            fh.write(prefix + line)
        return f"remembered in {name}: {fact}"

    return await asyncio.to_thread(append)


TOOLS = [
    Tool("remember",
         "Remember a fact for future conversations by appending a dated note to your "
         "memory (a person approves each note): file \"USER\" for facts about the people "
         "you work with (names, what to call them, preferences), \"MEMORY\" for anything "
         "else worth keeping. Use it when someone asks you to remember something or states "
         "a lasting preference. One short sentence per fact; it is part of your "
         "instructions from the next step on.",
         {"type": "object", "properties": {
             "fact": {"type": "string", "maxLength": MAX_FACT_CHARS,
                      "description": "The fact, as one self-contained sentence"},
             "file": {"type": "string", "enum": ["USER", "MEMORY"], "default": "USER"}},
          "required": ["fact"]},
         remember, policy="ask", summary_key="fact", lasting=True),
]
