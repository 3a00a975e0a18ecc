"""Prompt caching: breakpoints where the provider needs them, and the cached tokens of a
response's usage.

OpenAI, DeepSeek and xAI cache the longest prefix a request shares with a recent one on
their own. Anthropic (also Claude on Bedrock, Vertex AI and OpenRouter, or behind an
OpenAI-compatible gateway) and Gemini cache only up to a `cache_control` breakpoint.
`bot.turn.prompt` marks where breakpoints belong with a message-level `MARK`: the system
prompt (it follows the tool schemas, so both are cached), the summary of trimmed turns, the
end of the finished turns and the newest message before the state note (at most 4, as
Anthropic allows). `for_model` turns each mark into `cache_control` on the message's last
content block for a model that needs breakpoints and removes the marks for every other
model, so what those are sent is byte for byte the request without caching.

`cached_tokens` reads what a response's usage says was read from and written to the cache,
in OpenAI's shape (`prompt_tokens_details.cached_tokens`) or Anthropic's
(`cache_read_input_tokens`, `cache_creation_input_tokens`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

MARK = "cache_control"
EPHEMERAL = {"type": "ephemeral"}
MAX_BREAKPOINTS = 4
EXPLICIT_PROVIDERS = frozenset({"anthropic", "gemini"})
GEMINI_HOSTS = frozenset({"vertex_ai", "vertex_ai_beta", "openrouter"})
"""Where litellm turns breakpoints into Gemini's context cache. (Through Google's
OpenAI-compatible endpoint Gemini caches on its own, and `cache_control` is refused.)"""


def needs_breakpoints(model: str) -> bool:
    """Claude through any provider (Bedrock, Vertex AI, OpenRouter, a gateway), and Gemini
    where litellm speaks its own API."""
    provider, _, name = model.lower().partition("/")
    if provider in EXPLICIT_PROVIDERS or "claude" in (name or provider):
        return True
    return provider in GEMINI_HOSTS and "gemini" in name


def mark(message: dict[str, Any]) -> dict[str, Any]:
    """`message` with a breakpoint mark (a new dict)."""
    return {**message, MARK: dict(EPHEMERAL)}


def markable(message: dict[str, Any]) -> bool:
    """A breakpoint needs a block to sit on: text that is not empty (or a picture)."""
    content = message.get("content")
    if isinstance(content, str):
        return bool(content.strip())
    if isinstance(content, list) and content:
        last = content[-1]
        return isinstance(last, dict) and (last.get("type") != "text"
                                           or bool(str(last.get("text") or "").strip()))
    return False


def _with_breakpoint(message: dict[str, Any]) -> dict[str, Any]:
    out = {k: v for k, v in message.items() if k != MARK}
    content = out.get("content")
    if isinstance(content, str):
        out["content"] = [{"type": "text", "text": content, MARK: dict(EPHEMERAL)}]
    elif isinstance(content, list) and content:
        out["content"] = [*content[:-1], {**content[-1], MARK: dict(EPHEMERAL)}]
    return out


def for_model(model: str, messages: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """The messages as `model` is sent them: marks made breakpoints (the last 4 at most,
    on blocks that can carry one), or removed."""
    explicit = needs_breakpoints(model)
    marked = [i for i, m in enumerate(messages) if MARK in m and markable(m)]
    if explicit and len(marked) > MAX_BREAKPOINTS:  # the system prompt's mark is kept first
        marked = marked[:1] + marked[-(MAX_BREAKPOINTS - 1):]
    keep = set(marked) if explicit else set()
    out = []
    for i, message in enumerate(messages):
        if i in keep:
            out.append(_with_breakpoint(message))
        elif MARK in message:
            out.append({k: v for k, v in message.items() if k != MARK})
        else:
            out.append(message)
    return out


def _int(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0


def cached_tokens(usage: Any) -> tuple[int, int]:
    """(tokens read from the cache, tokens written to it) of a response's usage; both are
    part of its `prompt_tokens`."""
    if usage is None:
        return 0, 0
    details = getattr(usage, "prompt_tokens_details", None)
    read = _int(getattr(usage, "cache_read_input_tokens", None)) or \
        _int(getattr(details, "cached_tokens", None))
    written = _int(getattr(usage, "cache_creation_input_tokens", None)) or \
        _int(getattr(details, "cache_creation_tokens", None))
    return read, written
