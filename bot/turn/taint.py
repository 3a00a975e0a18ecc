"""Untrusted content taints the conversation while the model can see it.

A tool marked `untrusted` (a fetched page, an MCP server's result) returns content Tandem
did not get from its users; so do files the users upload (their content is not their
words), the earlier messages of a thread, read from the platform when Tandem joins
it, and what a message carries from someone who is not an allowed user: a forward, a
quote, a group member's talk (marked as outside content where it stands). While such
content is in the window the model sees (this turn, or an earlier one the trim has
kept), a call that writes lasting state or sends data out (`Tool.lasting`), or that
reaches a URL the users never gave (`Tool.reaches`: a URL the model composed can carry
chat content out), asks a human whatever its policy says. The taint ends with `/new` or
when the trim drops the content.

Only a voice note a user recorded is their own words: an audio or video file, music and
a forwarded voice note are outside content, and so is an upload read back with a file
tool (`Tool.reads`), however long ago its message left the window.
"""

from __future__ import annotations

import json
from collections.abc import Container
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from bot.core.history import OUTSIDE, THREAD_CONTEXT, Msg
from bot.media import UPLOADS, shared_area
from bot.tools import Registry, Tool, visible

SOURCE_CHARS = 80


@dataclass(frozen=True, slots=True)
class Taint:
    source: str
    """What was read, for the card: "web_fetch of https://…"."""

    def reason(self) -> str:
        return f"this conversation has read content from {self.source}"


def taint(window: list[Msg], tools: Registry,
          unread: Container[str] = frozenset(), workspace: Path | None = None) -> Taint | None:
    """The most recent content from outside in `window`, if any: an untrusted tool's
    result (calls in `unread` never ran, so theirs are not content from outside), a file
    a user uploaded, or earlier messages of a thread read from the platform."""
    calls: dict[str, tuple[str, str]] = {}
    source: str | None = None
    for msg in window:
        for call in msg.tool_calls:
            calls[call.id] = (call.name, call.arguments)
        if msg.role == "user":
            source = _brought(msg) or source
        elif msg.role == "tool" and msg.name:
            tool = tools.get(msg.name)
            if tool is not None and msg.tool_call_id not in unread:
                name, arguments = calls.get(msg.tool_call_id or "", (msg.name, "{}"))
                if tool.untrusted:
                    source = _describe(tools.get(name), name, arguments)
                else:
                    source = read_back(tool, arguments, workspace) or source
    if source is None and tools.outside:
        source = f"the tool descriptions of {tools.outside}"  # offered in every request
    return None if source is None else Taint(source)


def read_back(tool: Tool, arguments: str, workspace: Path | None = None) -> str | None:
    """A call that read an uploaded file back (`Tool.reads` under `uploads/`): its result
    is the file's content, from outside however long ago the file came."""
    if tool.reads is None:
        return None
    try:
        raw = json.loads(arguments or "{}").get(tool.reads)
    except (ValueError, AttributeError):
        return None
    if not isinstance(raw, str) or (found := shared_area(raw, workspace)) is None \
            or found[0] != UPLOADS:
        return None
    shown = raw if len(raw) <= SOURCE_CHARS else raw[:SOURCE_CHARS] + "…"
    return visible(f"{tool.name} of the upload {shown}")


def _brought(msg: Msg) -> str | None:
    """What a user's message brought from outside: an uploaded file (only a voice note
    the user recorded is their own words; an audio file, music or a forwarded voice note
    is not) or a thread's earlier messages."""
    files = [m.name for m in msg.media if m.kind != "voice"]
    if files:
        name = files[-1] if len(files[-1]) <= SOURCE_CHARS else files[-1][:SOURCE_CHARS] + "…"
        return visible(f"the uploaded file {name}")
    if msg.content.startswith(THREAD_CONTEXT):
        return "earlier messages of this thread"
    marked = [m.group(1) for m in OUTSIDE.finditer(msg.content)]
    if marked:
        label = marked[-1]
        return label if len(label) <= SOURCE_CHARS else label[:SOURCE_CHARS] + "…"
    return None


def without_untrusted(messages: list[Msg], tools: Registry) -> list[Msg]:
    """`messages` with untrusted results left out, for a summary that outlives the window
    (so the taint ends when the trim drops the content, summary or not)."""
    out = []
    calls = {c.id: c.arguments for m in messages for c in m.tool_calls}
    for msg in messages:
        tool = tools.get(msg.name) if msg.role == "tool" and msg.name else None
        if tool is not None and (tool.untrusted or read_back(
                tool, calls.get(msg.tool_call_id or "", "{}")) is not None):
            msg = replace(msg, content=f"[the result of {msg.name} is left out: it came from "
                                       "outside and is not kept]")
        elif msg.role == "user" and msg.content.startswith(THREAD_CONTEXT):
            words = msg.content[msg.content.rfind("\n\n[") + 2:]
            msg = replace(msg, content=f"[earlier messages of the thread are left out]\n{words}")
        if msg.role == "user" and OUTSIDE.search(msg.content):
            msg = replace(msg, content=OUTSIDE.sub(
                lambda m: f"[{m.group(1)}: left out, it came from outside and is not kept]",
                msg.content))
        out.append(msg)
    return out


def needs_human(window: list[Msg], turn: int, tool: Tool, args: dict[str, Any],
                found: Taint) -> bool:
    """Under taint, this call must be seen by a human before it runs."""
    if tool.lasting:
        return True
    if tool.reaches is None:
        return False
    target = args.get(tool.reaches)
    return not isinstance(target, str) or not _seen(window, turn, target)


def _seen(window: list[Msg], turn: int, url: str) -> bool:
    """`url` appears verbatim in what the users wrote, or in this turn's tool results."""
    return any(url in msg.content for msg in window
               if msg.role == "user" or (msg.role == "tool" and msg.turn == turn))


def _describe(tool: Tool | None, name: str, arguments: str) -> str:
    source = name
    if tool is not None and tool.reaches is not None:
        try:
            target = json.loads(arguments or "{}").get(tool.reaches)
        except (ValueError, AttributeError):
            target = None
        if isinstance(target, str) and target:
            shown = target if len(target) <= SOURCE_CHARS else target[:SOURCE_CHARS] + "…"
            source = f"{name} of {shown}"
    return visible(source)


__all__ = ["Taint", "needs_human", "read_back", "taint", "without_untrusted"]
