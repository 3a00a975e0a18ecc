"""The conversation history as immutable values, and how they look on the wire."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from bot.media import Media, wire_content

MESSAGE_OVERHEAD_TOKENS = 4

THREAD_CONTEXT = "[Earlier in this thread]"
"""Opens a user message that carries earlier messages of a thread (read from the platform,
written by anyone there: content from outside)."""

Said = tuple[str, tuple[Media, ...]]
"""What a user said in one message: the text for the model and the media with it."""


class CallState(StrEnum):
    """A tool call's lifecycle. Every call ends FINISHED with a result message."""

    PENDING = "pending"
    ASKING = "asking"
    ALLOWED = "allowed"
    SUBMITTED = "submitted"
    FINISHED = "finished"


class Outcome(StrEnum):
    OK = "ok"
    ERROR = "error"
    DENIED = "denied"
    EXPIRED = "expired"
    INTERRUPTED = "interrupted"
    SKIPPED = "skipped"

    @property
    def failed(self) -> bool:
        return self in (Outcome.ERROR, Outcome.SKIPPED)


@dataclass(frozen=True, slots=True)
class ToolCall:
    id: str
    name: str
    arguments: str
    """The raw JSON text the model produced (it may be malformed)."""

    def wire(self) -> dict[str, Any]:
        return {"id": self.id, "type": "function",
                "function": {"name": self.name, "arguments": self.wire_arguments()}}

    def wire_arguments(self) -> str:
        """Malformed JSON is sent back as `{}`: strict providers parse the arguments."""
        try:
            json.loads(self.arguments)
        except ValueError:
            return "{}"
        return self.arguments


def estimate_tokens(text: str) -> int:
    """Conservative: UTF-8 bytes / 4 (about 0.75 per CJK character)."""
    return len(text.encode("utf-8", "surrogatepass")) // 4 + 1


@dataclass(frozen=True, slots=True)
class Msg:
    role: str
    content: str = ""
    turn: int = 0
    tool_calls: tuple[ToolCall, ...] = ()
    tool_call_id: str | None = None
    name: str | None = None
    id: int | None = field(default=None, compare=False)
    tokens: int = field(default=-1, compare=False)
    _wire: dict[str, Any] = field(default_factory=dict, compare=False, repr=False)
    media: tuple[Media, ...] = ()
    """Files that came with a user's message (references; the bytes stay in the workspace)."""

    def __post_init__(self) -> None:
        if self.tokens < 0:
            size = estimate_tokens(self.content) + MESSAGE_OVERHEAD_TOKENS
            size += sum(m.tokens for m in self.media)
            for call in self.tool_calls:
                size += estimate_tokens(call.name) + estimate_tokens(call.arguments) + 8
            object.__setattr__(self, "tokens", size)

    def wire(self) -> dict[str, Any]:
        """The OpenAI-format dict, built once per message (with pictures or PDFs, built
        from the files each time: the history never holds their bytes)."""
        if any(m.seen for m in self.media):
            return {"role": self.role, "content": wire_content(self.content, self.media)}
        if not self._wire:
            out: dict[str, Any] = {"role": self.role, "content": self.content}
            if self.tool_calls:
                out["tool_calls"] = [c.wire() for c in self.tool_calls]
                if not self.content:
                    out["content"] = None
            if self.tool_call_id is not None:
                out["tool_call_id"] = self.tool_call_id
                if self.name:
                    out["name"] = self.name
            self._wire.update(out)
        return self._wire

    def with_id(self, row_id: int) -> Msg:
        return Msg(self.role, self.content, self.turn, self.tool_calls, self.tool_call_id,
                   self.name, row_id, self.tokens, media=self.media)


def user(text: str, turn: int) -> Msg:
    return Msg("user", text, turn)


def tool_result(call: ToolCall, text: str, turn: int) -> Msg:
    return Msg("tool", text, turn, tool_call_id=call.id, name=call.name)


def calls_to_json(calls: tuple[ToolCall, ...]) -> str | None:
    if not calls:
        return None
    return json.dumps([[c.id, c.name, c.arguments] for c in calls], ensure_ascii=False)


def calls_from_json(raw: str | None) -> tuple[ToolCall, ...]:
    if not raw:
        return ()
    return tuple(ToolCall(i, n, a) for i, n, a in json.loads(raw))
