"""Each model request, built in one place: system prompt, trimmed history, tools, note.

The request for step k+1 of a turn starts with the request for step k byte for byte
(a summary of trimmed turns, with `context.summary`, follows the system prompt):
the system prompt is reused while the persona is unchanged, finished turns are
sanitized once, and the state note (time, context used, scheduled tasks, and the
`remember` notes of this conversation or person) is the **last** message, after any
tool results, and never stored. So a new note reaches the very next request without
changing the prefix the provider has cached, and until the trim moves the start of the
history, turn k+1's request starts with turn k's. Where a provider caches only up to a
breakpoint, the messages that end a stable stretch carry a mark (`bot.llm.caching`): the
system prompt, the last message of the finished turns and the newest message before the
note. Estimates cover the whole request and are calibrated against the provider's real
counts, so the trim that runs once per turn leaves room for everything that is sent.
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
from bot.llm.caching import mark, markable
from bot.tools import Registry
from bot.turn.compaction import with_summary
from bot.turn.context import check_system_fits
from bot.turn.conversation import Conversation
from bot.turn.memory import Memory
from bot.turn.overlays import Overlays
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
        self._notes: dict[int, tuple[str, str, int]] = {}
        """id of the notes -> (the notes, their section of the state note, its tokens)."""
        self.overlays = Overlays(persona.dir, config.persona.places,
                                 config.persona.max_file_chars)
        self._system_seen: dict[str, tuple[str, str, int]] = {}
        """overlay section -> (the persona prompt it was added to, the whole, its tokens)."""
        self._tools_seen = (-1, 0)
        """(registry version, estimated tokens of its schemas)."""

    def system(self, conv: Conversation | None = None) -> str:
        """The persona's prompt with the overlay of the conversation's place, read again
        (cheaply) for every request; unchanged files give the same string object back.
        (`remember` notes go in the state note.)"""
        return self._system(conv)[0]

    def _system_tokens(self, conv: Conversation | None = None) -> int:
        return self._system(conv)[1]

    def _system(self, conv: Conversation | None) -> tuple[str, int]:
        base = self.persona.system_prompt()
        overlay = self.overlays.section(conv.row.key) if conv is not None else ""
        seen = self._system_seen.get(overlay)
        if seen is None or seen[0] is not base:
            whole = f"{base}\n\n{overlay}" if overlay else base
            if len(self._system_seen) > 1_000:
                self._system_seen.clear()
            seen = self._system_seen[overlay] = (base, whole, estimate_tokens(whole))
        return seen[1], seen[2]

    def notes(self, conv: Conversation | None) -> tuple[str, int]:
        """This conversation's (or person's) `remember` notes as a section of the state
        note, and its estimated tokens ("" when there are none)."""
        if conv is None:
            return "", 0
        notes = self.memory.section(conv.row.key, conv.turn.requester if conv.turn else "")
        if not notes:
            return "", 0
        cached = self._notes.get(id(notes))
        if cached is None or cached[0] is not notes:
            section = f"Notes remembered here (`remember`), newest state:\n\n{notes}"
            if len(self._notes) > 1_000:
                self._notes.clear()
            cached = self._notes[id(notes)] = (notes, section, estimate_tokens(section) + 2)
        return cached[1], cached[2]

    def fixed(self, conv: Conversation | None = None) -> int:
        """Estimated tokens sent with every request: system prompt, tools, summary, notes."""
        summary = estimate_tokens(conv.summary) + 8 if conv is not None and conv.summary else 0
        return self._system_tokens(conv) + self._tool_tokens() + summary + self.notes(conv)[1]

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
        marks = self.config.context.cache_breakpoints
        system = {"role": "system", "content": self.system(conv)}
        messages = with_summary([mark(system) if marks else system], conv.summary)
        finished, current = conv.wire_parts()
        messages += _marked_last(finished) if marks else finished
        messages += _marked_last(current) if marks else current
        state = self.note(conv, window)
        notes = self.notes(conv)[0]
        messages.append({"role": "user", "content": f"{state}\n\n{notes}" if notes else state})
        estimated = self.fixed(conv) + conv.kept + estimate_tokens(state)
        return Request(messages, estimated)


def _marked_last(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """`messages` with a breakpoint mark on the last one that can carry it (a new list;
    the dicts it shares are not changed)."""
    for i in range(len(messages) - 1, -1, -1):
        if markable(messages[i]):
            return [*messages[:i], mark(messages[i]), *messages[i + 1:]]
    return messages
