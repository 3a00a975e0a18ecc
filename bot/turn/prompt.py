"""Each model request, built in one place: system prompt, trimmed history, tools, note.

The request for step k+1 of a turn starts with the request for step k byte for byte
(a summary of trimmed turns, with `context.summary`, follows the system prompt):
the system prompt is reused while the persona is unchanged, finished turns are
sanitized once, and the state note (time, context used, scheduled tasks) is the
**last** message, after any tool results, and never stored. Estimates cover the whole
request and are calibrated against the provider's real counts, so the trim that runs
once per turn leaves room for everything that is sent.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any
from zoneinfo import ZoneInfo

from bot.core.config import Config
from bot.core.history import estimate_tokens
from bot.tools import Registry
from bot.turn.compaction import with_summary
from bot.turn.context import check_system_fits
from bot.turn.conversation import Conversation
from bot.turn.memory import Memory
from bot.turn.persona import Persona

NOTE_RESERVE_TOKENS = 200


@dataclass(frozen=True, slots=True)
class Request:
    messages: list[dict[str, Any]]
    estimated: int
    """Uncalibrated token estimate of the whole request (calibration compares this)."""


class Prompt:
    def __init__(self, config: Config, persona: Persona, tools: Registry,
                 jobs: Callable[[int], int] = lambda _conv_id: 0,
                 memory: Memory | None = None) -> None:
        self.config = config
        self.persona = persona
        self.tools = tools
        self.jobs = jobs
        """Active scheduled tasks of a conversation (for the note)."""
        self.memory = memory or Memory(persona.dir, config.memory.scope,
                                       config.persona.max_file_chars)
        self.tz = ZoneInfo(config.scheduler.timezone)
        self._systems: dict[tuple[int, int], tuple[str, str, str, int]] = {}
        """(id of the persona prompt, id of the notes) -> (both, the prompt, its tokens)."""
        self._tools_seen = (-1, 0)
        """(registry version, estimated tokens of its schemas)."""

    def system(self, conv: Conversation | None = None) -> str:
        """The persona's prompt with this conversation's notes, read again (cheaply) for
        every request; unchanged files give the same string object back."""
        return self._system(conv)[0]

    def _system(self, conv: Conversation | None) -> tuple[str, int]:
        base = self.persona.system_prompt()
        notes = ""
        if conv is not None:
            notes = self.memory.section(conv.row.key, conv.turn.requester if conv.turn else "")
        key = (id(base), id(notes))
        cached = self._systems.get(key)
        if cached is None or cached[0] is not base or cached[1] is not notes:
            prompt = f"{base}\n\n{notes}" if notes else base
            if len(self._systems) > 1_000:
                self._systems.clear()
            cached = self._systems[key] = (base, notes, prompt, estimate_tokens(prompt))
        return cached[2], cached[3]

    def fixed(self, conv: Conversation | None = None) -> int:
        """Estimated tokens sent with every request: system prompt, tools, summary."""
        summary = estimate_tokens(conv.summary) + 8 if conv is not None and conv.summary else 0
        return self._system(conv)[1] + self._tool_tokens() + summary

    def _tool_tokens(self) -> int:
        version, tokens = self._tools_seen
        if version != self.tools.version:  # MCP servers add and change tools at runtime
            tokens = estimate_tokens(str(self.tools.schemas()))
            self._tools_seen = (self.tools.version, tokens)
        return tokens

    def reserve(self) -> int:
        return self.config.llm.max_output_tokens + NOTE_RESERVE_TOKENS

    def history_budget(self, conv: Conversation, window: int) -> int:
        """Estimated tokens the history may take so the calibrated request fits."""
        check_system_fits(int(self.fixed(conv) * conv.calibration), window, self.reserve())
        return int((window - self.reserve()) / conv.calibration) - self.fixed(conv)

    def used(self, conv: Conversation) -> int:
        """Calibrated tokens of the request as it stands (the note and `/status` agree)."""
        return int((self.fixed(conv) + conv.kept) * conv.calibration)

    def fits(self, request: Request, conv: Conversation, window: int) -> bool:
        return request.estimated * conv.calibration + self.config.llm.max_output_tokens <= window

    def note(self, conv: Conversation, window: int) -> str:
        now = datetime.fromtimestamp(time.time(), self.tz)
        dropped = conv.dropped_turns
        older = f"; {dropped} older turns are out of view" if dropped else ""
        jobs = self.jobs(conv.row.id)
        tasks = f" Scheduled tasks here: {jobs} (list_tasks shows them)." if jobs else ""
        return (f"[Current state; earlier state notes are stale. Time: "
                f"{now:%Y-%m-%d %H:%M %Z}. Context: ~{self.used(conv):,} of {window:,} "
                f"tokens{older}.{tasks}]")

    def build(self, conv: Conversation, window: int) -> Request:
        system = [{"role": "system", "content": self.system(conv)}]
        messages = with_summary(system, conv.summary)
        messages.extend(conv.wire_window())
        note = self.note(conv, window)
        messages.append({"role": "user", "content": note})
        estimated = self.fixed(conv) + conv.kept + estimate_tokens(note)
        return Request(messages, estimated)
