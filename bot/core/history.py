"""The conversation history as immutable values, and how they look on the wire.

A file that came with a message is kept as a `Media` reference (kind, name, paths, size,
transcript), never its bytes: a picture or a PDF the model can read is turned into a
content part when the request is built, from the file as it is then (a file removed since
is named as gone instead). Receiving and sending files is `bot.media`'s.
"""

from __future__ import annotations

import base64
import json
import logging
import re
from dataclasses import asdict, dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

MESSAGE_OVERHEAD_TOKENS = 4

THREAD_CONTEXT = "[Earlier in this thread]"
"""Opens a user message that carries earlier messages of a thread (read from the platform,
written by anyone there: content from outside)."""

OUTSIDE_OPEN = "⟦outside content: "
OUTSIDE_CLOSE = "⟦end of outside content⟧"
OUTSIDE = re.compile(r"⟦outside content: ([^⟧\n]*)⟧\n(.*?)\n⟦end of outside content⟧", re.S)
"""Words in a user's message that are not an allowed user's own (a quote of someone
else, a forward, group talk of a member who is not allowed): marked where they stand, so
that the model never takes them for the sender's, and the taint rule finds them."""


def outside(label: str, text: str) -> str:
    """`text` marked as content from outside, described by `label` (the marks themselves
    cannot be forged from inside: their brackets are replaced)."""
    def plain(value: str) -> str:
        return value.replace("⟦", "[").replace("⟧", "]")

    return f"{OUTSIDE_OPEN}{plain(label).replace(chr(10), ' ')}⟧\n{plain(text)}\n{OUTSIDE_CLOSE}"


@dataclass(frozen=True, slots=True)
class Media:
    """A file that came with a user's message, as the history keeps it."""

    kind: str
    """image | audio | pdf | document"""
    name: str
    """The name the user gave it."""
    path: str
    """Where it is in the workspace (relative), as the model is told."""
    file: str
    """The absolute path (what the request reads)."""
    size: int
    mime: str
    transcript: str | None = None
    seen: bool = False
    """Sent to the model as a content part (a picture or a PDF it can read)."""
    tokens: int = 0
    """Estimated cost of its part."""

    def part(self) -> dict[str, Any]:
        """The content part for the model, read from the file now (a picture from the
        scaled copy made when it arrived: nothing is decoded here)."""
        path = Path(self.file)
        try:
            if self.kind == "image":
                from bot.core.images import data_url

                return {"type": "image_url", "image_url": {"url": data_url(path)}}
            data = base64.b64encode(path.read_bytes()).decode("ascii")
            return {"type": "file", "file": {"filename": self.name,
                                             "file_data": f"data:{self.mime};base64,{data}"}}
        except (OSError, ValueError) as exc:
            log.info("media %s is unreadable: %s", self.path, exc)
            if path.is_file():  # a picture that could not be scaled (too large, broken)
                return {"type": "text", "text": f"[{self.name} cannot be shown; it is in "
                                                f"the workspace at {self.path}]"}
            return {"type": "text", "text": f"[{self.name} was sent earlier but is no longer "
                                            f"in the workspace at {self.path}]"}


def media_to_json(media: tuple[Media, ...]) -> str | None:
    return json.dumps([asdict(m) for m in media], ensure_ascii=False) if media else None


def media_from_json(raw: str | None) -> tuple[Media, ...]:
    if not raw:
        return ()
    try:
        return tuple(Media(**item) for item in json.loads(raw))
    except (ValueError, TypeError):
        log.warning("unreadable media reference in the history: %.80s", raw)
        return ()


def wire_content(text: str, media: tuple[Media, ...]) -> str | list[dict[str, Any]]:
    """A user message's content: its text, then the parts of what the model can see."""
    seen = [m for m in media if m.seen]
    if not seen:
        return text
    return [{"type": "text", "text": text or "(no caption)"}, *(m.part() for m in seen)]


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
        """On the wire the arguments are always a JSON object: malformed JSON, or JSON that
        is not an object (`[1]`, `null`), is sent back as `{}` (strict providers parse the
        arguments, and refuse anything else on every later request)."""
        try:
            value = json.loads(self.arguments)
        except ValueError:
            return "{}"
        return self.arguments if isinstance(value, dict) else "{}"


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
