"""The fake model's prompt cache: usage reported as providers report it, and
``cache_control`` checked as Anthropic checks it.

A request is read as a sequence of blocks, in the order a provider caches them: each tool
schema, then each message's content parts (a string content is one text block, as
Anthropic reads it), its tool calls and its tool result. What a request shares with
earlier requests of the last ``ttl_s`` seconds is counted in whole blocks:

* ``"openai"`` (OpenAI, DeepSeek, xAI: automatic): the longest prefix shared with any
  earlier request is read from the cache, reported as ``prompt_tokens_details.cached_tokens``.
* ``"anthropic"`` (Anthropic and its hosts: explicit): only prefixes that end at a
  ``cache_control`` breakpoint are written; a breakpoint reads the longest written prefix
  ending at it or at one of the 20 blocks before it. Reported as ``cache_read_input_tokens``
  and ``cache_creation_input_tokens`` (what was written beyond what was read). Without
  breakpoints nothing is cached.

In both shapes ``prompt_tokens`` counts every input token, cached or not (as litellm
reports usage). Token counts are the request's ``prompt_tokens`` shared out by characters.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

SHAPES = ("openai", "anthropic")
MAX_BREAKPOINTS = 4
LOOKBACK_BLOCKS = 20
TTL_S = 300.0
TOO_MANY_BREAKPOINTS = "A maximum of {max} blocks with cache_control may be provided. Found {n}."
EMPTY_TEXT_BREAKPOINT = "{where}: cache_control cannot be set for empty text blocks"
BAD_CACHE_CONTROL = "{where}.cache_control.type: Input should be 'ephemeral'"
BAD_TTL = "{where}.cache_control.ttl: Input should be '5m' or '1h'"
NOT_CACHEABLE = "{where}: cache_control is not permitted on this block"
CACHEABLE_PARTS = frozenset({"text", "image_url", "file"})


@dataclass(frozen=True, slots=True)
class CacheRefusal:
    """Anthropic's 400 for a request whose breakpoints it does not accept."""

    message: str

    def body(self) -> dict[str, Any]:
        return {"type": "error", "error": {"type": "invalid_request_error",
                                           "message": self.message}}


def _control_problem(where: str, control: Any) -> str | None:
    if not isinstance(control, dict) or control.get("type") != "ephemeral":
        return BAD_CACHE_CONTROL.format(where=where)
    if "ttl" in control and control["ttl"] not in ("5m", "1h"):
        return BAD_TTL.format(where=where)
    return None


def _part_marks(i: int, msg: dict[str, Any]) -> tuple[int, str | None]:
    """(breakpoints, first problem) among a message's content parts and tool calls."""
    marks, problem = 0, None
    content = msg.get("content")
    for j, part in enumerate(content if isinstance(content, list) else []):
        if not isinstance(part, dict) or "cache_control" not in part:
            continue
        marks += 1
        where = f"messages.{i}.content.{j}"
        kind = part.get("type")
        if kind not in CACHEABLE_PARTS:
            problem = problem or NOT_CACHEABLE.format(where=where)
        elif kind == "text" and not str(part.get("text") or "").strip():
            problem = problem or EMPTY_TEXT_BREAKPOINT.format(where=f"{where}.text")
        problem = problem or _control_problem(where, part["cache_control"])
    for j, call in enumerate(msg.get("tool_calls") or []):
        if isinstance(call, dict) and "cache_control" in call:
            marks += 1
            problem = problem or NOT_CACHEABLE.format(where=f"messages.{i}.tool_calls.{j}")
    return marks, problem


def check_cache_control(body: dict[str, Any]) -> CacheRefusal | None:
    """What Anthropic refuses: more than 4 breakpoints, a breakpoint on an empty text block
    or on a block that cannot carry one, a ``cache_control`` that is not ephemeral."""
    marks, problem = 0, None
    for k, tool in enumerate(body.get("tools") or []):
        if isinstance(tool, dict) and "cache_control" in tool:
            marks += 1
            problem = problem or _control_problem(f"tools.{k}", tool["cache_control"])
    for i, msg in enumerate(body.get("messages") or []):
        if not isinstance(msg, dict):
            continue
        if "cache_control" in msg:  # message level: the last block of its content
            marks += 1
            content = msg.get("content")
            empty = not content or (isinstance(content, str) and not content.strip())
            if empty and msg.get("role") != "tool" and not msg.get("tool_calls"):
                problem = problem or EMPTY_TEXT_BREAKPOINT.format(where=f"messages.{i}")
            problem = problem or _control_problem(f"messages.{i}", msg["cache_control"])
        n, found = _part_marks(i, msg)
        marks += n
        problem = problem or found
    if marks > MAX_BREAKPOINTS:
        return CacheRefusal(TOO_MANY_BREAKPOINTS.format(max=MAX_BREAKPOINTS, n=marks))
    return CacheRefusal(problem) if problem else None


def _plain(value: Any) -> Any:
    """`value` without any `cache_control` (a mark does not change what is cached)."""
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items() if k != "cache_control"}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    return value


def blocks(body: dict[str, Any]) -> list[tuple[str, bool]]:
    """(serialized block, carries a breakpoint) in the order a provider caches them."""
    out: list[tuple[str, bool]] = []

    def add(head: dict[str, Any], part: Any, marked: bool) -> None:
        out.append((json.dumps([head, _plain(part)], sort_keys=True), marked))

    for tool in body.get("tools") or []:
        add({"tool": True}, tool, isinstance(tool, dict) and "cache_control" in tool)
    for msg in body.get("messages") or []:
        if not isinstance(msg, dict):
            continue
        head = {"role": msg.get("role"), "id": msg.get("tool_call_id"), "name": msg.get("name")}
        start = len(out)
        content = msg.get("content")
        if isinstance(content, str) and content:  # a string is one text block
            content = [{"type": "text", "text": content}]
        for part in content if isinstance(content, list) else []:
            add(head, part, isinstance(part, dict) and "cache_control" in part)
        for call in msg.get("tool_calls") or []:
            add(head, call, isinstance(call, dict) and "cache_control" in call)
        if len(out) == start:
            add(head, "", False)
        if "cache_control" in msg:
            out[-1] = (out[-1][0], True)
    return out


@dataclass(slots=True)
class PromptCache:
    """What requests of the last ``ttl_s`` seconds left in the cache, and the usage fields
    a new request is reported with."""

    shape: str
    ttl_s: float = TTL_S
    clock: Callable[[], float] = time.monotonic
    _seen: dict[bytes, float] = field(default_factory=dict)
    """Digest of a cached prefix -> when it was last written or read."""

    def __post_init__(self) -> None:
        if self.shape not in SHAPES:
            raise ValueError(f"unknown cache shape {self.shape!r}; expected one of {SHAPES}")

    def usage(self, body: dict[str, Any], prompt_tokens: int) -> dict[str, Any]:
        """The extra usage fields of this request (and the cache updated with it)."""
        now = self.clock()
        self._seen = {k: t for k, t in self._seen.items() if now - t <= self.ttl_s}
        found = blocks(body)
        digests, sizes = [], []
        h, size = hashlib.sha256(), 0
        for text, _ in found:
            h.update(text.encode())
            h.update(b"\x00")
            size += len(text)
            digests.append(h.copy().digest())
            sizes.append(size)
        total = sizes[-1] if sizes else 0

        def tokens(chars: int) -> int:
            return prompt_tokens * chars // total if total else 0

        if self.shape == "openai":
            hit = max((i for i, d in enumerate(digests) if d in self._seen), default=-1)
            for d in digests:
                self._seen[d] = now
            read = tokens(sizes[hit]) if hit >= 0 else 0
            return {"prompt_tokens_details": {"cached_tokens": read}}
        marks = [i for i, (_, marked) in enumerate(found) if marked]
        hit = -1
        for mark in marks:
            for i in range(mark, max(-1, mark - LOOKBACK_BLOCKS - 1), -1):
                if digests[i] in self._seen:
                    hit = max(hit, i)
                    break
        if hit >= 0:
            self._seen[digests[hit]] = now
        for mark in marks:
            self._seen[digests[mark]] = now
        read = tokens(sizes[hit]) if hit >= 0 else 0
        written = max(0, tokens(sizes[marks[-1]]) - read) if marks else 0
        return {"cache_read_input_tokens": read, "cache_creation_input_tokens": written}
