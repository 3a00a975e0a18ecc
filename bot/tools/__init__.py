"""Tools the model can call: a registry of JSON-schema'd async functions.

A tool returns text for the model or raises `ToolError` (its message goes to the model).
`summary()` renders a call for the approval card and `rule_key()` is what an
"always in this chat" rule binds to: the exact command or path, never a program.

The built-in tools are modules here (`shell`, `files`, `send`, `web`, `tasks`,
`memory`); `mcp` brings in the tools of MCP servers.

Layer: below `bot.turn`, above `bot.media`. It may import `bot.media`, `bot.llm`,
`bot.store` and `bot.core`; never the turn or anything above it.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bot.core.errors import ToolError
from bot.core.history import Outcome
from bot.core.invisible import visible as visible
from bot.core.redact import Redactor

log = logging.getLogger(__name__)

Runner = Callable[["ToolContext", dict[str, Any]], Awaitable[str]]


@dataclass(frozen=True, slots=True)
class ToolContext:
    workspace: Path
    protected: frozenset[Path]
    env: dict[str, str]
    shell_timeout_s: float = 120.0
    output_chars: int = 16_000
    extras: dict[str, Any] = field(default_factory=dict)
    """Services some tools need (persona dir, scheduler, conversation key...)."""
    redactor: Redactor = field(default_factory=Redactor)
    """The runner's: a tool that cuts its output itself (the shell) redacts what it keeps."""


@dataclass(frozen=True, slots=True)
class Tool:
    name: str
    description: str
    parameters: dict[str, Any]
    run: Runner
    policy: str = "ask"
    """Default approval policy: allow | ask | deny."""
    summary_key: str | None = None
    """The argument shown (and bound by "always" rules); None shows all arguments."""
    render: Callable[[dict[str, Any]], str] | None = None
    """A custom approval-card summary; it must show everything the call will do."""
    lasting: bool = False
    """It writes lasting state or sends data out: under taint a human is always asked."""
    reaches: str | None = None
    """The argument naming a URL the call contacts: under taint, a URL nobody gave asks."""
    untrusted: bool = False
    """Its results are content from outside (a web page...): they taint the conversation."""
    outside: str | None = None
    """Who wrote its description and schema when Tandem did not and nobody vouched for them
    (an MCP server not marked `trusted`): while it is offered, every conversation has read
    content from outside."""
    reads: str | None = None
    """The argument naming a workspace path it reads: another conversation's uploads ask,
    and an upload read back is content from outside."""

    def schema(self) -> dict[str, Any]:
        return {"type": "function", "function": {
            "name": self.name, "description": self.description, "parameters": self.parameters}}

    def summary(self, args: dict[str, Any]) -> str:
        """The call as the approval card shows it, invisible characters made visible."""
        return visible(self._summary(args))

    def _summary(self, args: dict[str, Any]) -> str:
        if self.render is not None:
            return self.render(args)
        if self.summary_key and isinstance(args.get(self.summary_key), str):
            rest = {k: v for k, v in args.items() if k != self.summary_key}
            head = str(args[self.summary_key])
            return head if not rest else f"{head}\n{json.dumps(rest, ensure_ascii=False, indent=1)}"
        return json.dumps(args, ensure_ascii=False, indent=1, sort_keys=True)

    def rule_key(self, args: dict[str, Any]) -> str:
        """What an "always" rule covers: the exact command or path, else every argument."""
        if self.summary_key and isinstance(args.get(self.summary_key), str):
            return str(args[self.summary_key])
        return json.dumps(args, ensure_ascii=False, sort_keys=True, separators=(",", ":"))


class Registry:
    """Tandem's own tools, then each group of outside tools (an MCP server's), groups in
    name order and their tools in name order: an unchanged set keeps the same order, so
    the tools part of the prompt stays byte-identical."""

    def __init__(self, tools: Iterable[Tool] = ()) -> None:
        self._tools: dict[str, Tool] = {}
        self._groups: dict[str, list[Tool]] = {"": []}
        self._schemas: list[dict[str, Any]] = []
        self.outside: str | None = None
        """The first offered tool's `outside` (None: every description is trusted)."""
        self.version = 0
        """Goes up whenever the set of tools changes."""
        for tool in tools:
            self.add(tool)

    def add(self, tool: Tool) -> None:
        self._groups[""] = [t for t in self._groups[""] if t.name != tool.name] + [tool]
        self._rebuild()

    def set_group(self, group: str, tools: Iterable[Tool]) -> None:
        """Replace the tools of `group` (none: the group goes)."""
        listed = sorted(tools, key=lambda t: t.name)
        if [t.schema() for t in listed] == [t.schema() for t in self._groups.get(group, [])]:
            self._groups[group] = listed  # same offer: keep the prompt as it is
            self._tools.update((t.name, t) for t in listed)
            return
        if listed:
            self._groups[group] = listed
        else:
            self._groups.pop(group, None)
        self._rebuild()

    def _rebuild(self) -> None:
        ordered = [*self._groups[""], *(t for g in sorted(self._groups) if g
                                        for t in self._groups[g])]
        self._tools = {t.name: t for t in ordered}
        self._schemas = [t.schema() for t in self._tools.values()]
        self.outside = next((t.outside for t in self._tools.values() if t.outside), None)
        self.version += 1

    def get(self, name: str) -> Tool | None:
        return self._tools.get(name)

    def names(self) -> list[str]:
        return list(self._tools)

    def schemas(self) -> list[dict[str, Any]]:
        return self._schemas


ERROR = "error: "
"""What a tool's error starts with for the model."""


def cut_note(count: int) -> str:
    """What stands between the head and the tail of an output cut in the middle."""
    return f"\n\n[... {count} characters cut ...]\n\n"


def cap(text: str, limit: int) -> str:
    """Keep the head and the tail of a long output, with a note of what was cut."""
    if len(text) <= limit:
        return text
    head = limit * 2 // 3
    tail = limit - head
    cut = len(text) - head - tail
    return f"{text[:head]}{cut_note(cut)}{text[-tail:]}"


def parse_arguments(raw: str) -> dict[str, Any]:
    """The model's JSON arguments, or a ToolError the model can act on."""
    try:
        value = json.loads(raw or "{}")
    except json.JSONDecodeError as exc:
        raise ToolError(f"the arguments are not valid JSON ({exc.msg} at {exc.pos}); "
                        "call the tool again with a JSON object") from None
    if not isinstance(value, dict):
        raise ToolError("the arguments must be a JSON object")
    return value


def require_str(args: dict[str, Any], key: str, *, allow_empty: bool = False) -> str:
    value = args.get(key)
    if not isinstance(value, str) or (not allow_empty and not value):
        raise ToolError(f"`{key}` is required and must be a string")
    return value


def outcome_of(task: asyncio.Future[str], name: str, limit: int,
               redact: Callable[[str], str]) -> tuple[Outcome, str]:
    """What a finished tool task gives the model: redacted first (a cap could cut a
    secret in two), then capped. A crash is logged; the model gets one plain line."""
    exc = task.exception()
    if exc is None:
        return Outcome.OK, cap(redact(task.result()), limit)
    if isinstance(exc, ToolError):
        return Outcome.ERROR, cap(redact(f"{ERROR}{exc}"), limit)
    log.error("tool %s crashed", name, exc_info=exc)
    return Outcome.ERROR, f"error: `{name}` failed unexpectedly (details are in Tandem's logs)"
