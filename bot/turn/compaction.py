"""Optional summary compaction (`context.summary`, off by default).

When the trim drops turns, the model may be asked to summarize them; the stored summary
then enters every later request, so facts from the dropped turns stay in view.

Everything here is pure except `summarize`, which makes one model call. Every failure of
that call (an error, a tool call, an empty or oversized answer) yields `None`, and the
caller falls back to the plain trim: the summary can never break a turn.

Where the summary goes: `with_summary` folds it into the leading system message. A
separate second `system` message would be the obvious choice, but strict servers (the
fake model server, several OpenAI-compatible local servers) accept `system` only as the
first message, and Anthropic takes a single system prompt; a `user` message would break
the user/assistant alternation some providers require. Appending to the one system
prompt is accepted everywhere and keeps the static system prompt a cacheable prefix.
"""

from __future__ import annotations

import json
import logging
from bisect import bisect_left, bisect_right
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from bot.core.errors import TandemError
from bot.core.history import Msg, ToolCall, estimate_tokens
from bot.llm import Completion, ModelClient

log = logging.getLogger(__name__)

SUMMARY_WORDS = 300
SUMMARY_PROMPT = (
    "You are compacting a chat between users and an assistant (Tandem). The earlier part "
    "of the conversation below is about to leave the assistant's view. Write a summary "
    "the assistant can continue from: the facts learned, decisions made, open tasks and "
    "promises, names of people, file paths, commands and their outcomes. If a previous "
    "summary is given, merge it in and keep what still matters. Write plain prose or "
    "bullet points, in the conversation's language. Do not call tools and do not write "
    "tool call syntax. Use at most {words} words."
)
SUMMARY_HEADER = "[Summary of earlier turns, which are no longer in view]"

TOOL_RESULT_CHARS = 500
ARGUMENT_CHARS = 300
TEXT_CHARS = 2000
MAX_TRANSCRIPT_CHARS = 48_000


# -- the cut ---------------------------------------------------------------------------


def _pairs(history: Sequence[Msg]) -> list[tuple[int, int]]:
    """(call index, result index) for every result; its call is the nearest earlier one."""
    last_call: dict[str, int] = {}
    pairs = []
    for i, m in enumerate(history):
        if m.role == "tool":
            c = last_call.get(m.tool_call_id or "")
            if c is not None:
                pairs.append((c, i))
        for call in m.tool_calls:
            last_call[call.id] = i
    return pairs


def safe_cut(history: Sequence[Msg], starts: Sequence[int], cut: int) -> int:
    """The first turn start >= `cut` (or `len(history)`) that keeps no result without its call.

    A result at index r >= cut whose call (the nearest earlier assistant message carrying
    its id) is at index < cut would be an orphan, so the cut moves past r, to the next
    turn start; that can drop another call whose result is kept, hence the fixed point.
    A result that has no call at all is left alone (`sanitize` drops it). The answer is
    the smallest valid cut >= `cut`, so `safe_cut` is idempotent. O(len(history)).
    """
    end = len(history)

    def start_at_or_after(i: int) -> int:
        k = bisect_left(starts, i)
        return starts[k] if k < len(starts) else end

    cut = start_at_or_after(max(0, cut))
    pairs = _pairs(history)
    while cut < end:
        worst = max((r for c, r in pairs if c < cut <= r), default=-1)
        if worst < 0:
            break
        k = bisect_right(starts, worst)
        cut = starts[k] if k < len(starts) else end
    return cut


# -- the request -----------------------------------------------------------------------


def _clip(text: str, limit: int) -> str:
    text = text.strip()
    if len(text) <= limit:
        return text
    return f"{text[:limit]}… [{len(text) - limit} more characters]"


def _call_text(call: ToolCall) -> str:
    try:
        args = json.dumps(json.loads(call.arguments), ensure_ascii=False)
    except ValueError:
        args = call.arguments
    return f"called {call.name}({_clip(args, ARGUMENT_CHARS)})"


def _lines(msg: Msg) -> list[str]:
    if msg.role == "tool":
        return [f"tool result ({msg.name or 'tool'}): {_clip(msg.content, TOOL_RESULT_CHARS)}"]
    out = []
    if msg.content.strip():
        out.append(f"{msg.role}: {_clip(msg.content, TEXT_CHARS)}")
    out.extend(f"{msg.role} {_call_text(c)}" for c in msg.tool_calls)
    return out


def transcript(dropped: Sequence[Msg], max_chars: int = MAX_TRANSCRIPT_CHARS) -> str:
    """Plain text, one entry per line; beyond `max_chars` the oldest entries are left out.

    User messages already carry their author (`[Ann] hello`); tool calls read
    `assistant called shell({...})`, results are clipped to ~500 characters.
    """
    entries = [line for m in dropped for line in _lines(m)]
    kept: list[str] = []
    size = 0
    for line in reversed(entries):
        size += len(line) + 1
        if size > max_chars and kept:
            break
        kept.append(line)
    kept.reverse()
    if len(kept) < len(entries):
        kept.insert(0, f"[{len(entries) - len(kept)} earlier entries left out]")
    return "\n".join(kept)


def summary_request(
    dropped: Sequence[Msg], previous: str | None, *, words: int = SUMMARY_WORDS,
    max_chars: int = MAX_TRANSCRIPT_CHARS,
) -> list[dict[str, Any]]:
    """The wire messages: the instruction, then one user message with the transcript.

    It holds no `tool_calls` and no `tool` messages, so no pairing rule applies to it.
    """
    parts = []
    if previous and previous.strip():
        parts.append(f"Previous summary:\n{previous.strip()}")
    parts.append(f"Conversation to summarize:\n{transcript(dropped, max_chars)}")
    return [
        {"role": "system", "content": SUMMARY_PROMPT.format(words=words)},
        {"role": "user", "content": "\n\n".join(parts)},
    ]


# -- the call --------------------------------------------------------------------------


async def summarize(
    model: ModelClient, dropped: Sequence[Msg], previous: str | None, max_tokens: int,
    *, max_chars: int = MAX_TRANSCRIPT_CHARS,
    spend: Callable[[Completion], Awaitable[None]] | None = None,
) -> str | None:
    """The model's summary of `dropped` (merged with `previous`), or None to fall back.
    The call's usage goes to `spend` (the daily budgets count it), used or not.

    None (with one warning line) when the call fails, or the answer has tool calls, is
    empty or exceeds `max_tokens` (estimated). Nothing dropped: `previous`, no call.
    Cancellation propagates.
    """
    if not dropped:
        return previous
    messages = summary_request(dropped, previous, words=max(20, max_tokens // 2),
                               max_chars=max_chars)
    completion: Completion | None = None
    try:
        async for item in model.stream(messages, tools=[]):
            if isinstance(item, Completion):
                completion = item
    except TandemError as exc:
        log.warning("summary failed, falling back to the plain trim: %s: %s",
                    type(exc).__name__, exc)
        return None
    except Exception as exc:  # an optional step must never break the turn
        log.warning("summary failed unexpectedly, falling back to the plain trim: %s: %s",
                    type(exc).__name__, str(exc).splitlines()[0] if str(exc) else "")
        return None
    if completion is not None and spend is not None:
        await spend(completion)
    if completion is None:
        problem = "the stream ended without a completion"
    elif completion.tool_calls:
        problem = f"the model called {len(completion.tool_calls)} tool(s)"
    elif not completion.text.strip():
        problem = "the answer was empty"
    elif (size := estimate_tokens(completion.text.strip())) > max_tokens:
        problem = f"the answer has ~{size} tokens (limit {max_tokens})"
    else:
        return completion.text.strip()
    log.warning("summary rejected, falling back to the plain trim: %s", problem)
    return None


# -- the summary in a request ----------------------------------------------------------


def summary_message(text: str) -> dict[str, Any]:
    """The summary as a system message. Send it through `with_summary`, not on its own:
    strict servers accept `system` only as the first message (see the module docstring)."""
    return {"role": "system", "content": f"{SUMMARY_HEADER}\n{text.strip()}"}


def with_summary(messages: Sequence[dict[str, Any]], text: str | None) -> list[dict[str, Any]]:
    """`messages` with the summary appended to the leading system message (a new list;
    the input and its dicts are not changed). No system message: the summary becomes it.
    No summary (None or blank): the messages unchanged."""
    out = list(messages)
    if not text or not text.strip():
        return out
    note = summary_message(text)
    if out and out[0].get("role") == "system" and isinstance(out[0].get("content"), str):
        out[0] = {**out[0], "content": f"{out[0]['content']}\n\n{note['content']}"}
    else:
        out.insert(0, note)
    return out
