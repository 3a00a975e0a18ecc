"""Context work, all pure: trim whole turns once per turn, sanitize before every send.

`sanitize` makes any history acceptable to the strictest pairing rules (OpenAI and
Anthropic): every assistant tool call is answered by a `tool` message right after it,
and every `tool` message answers a call of the assistant message just before it.
It never mutates its input and `sanitize(sanitize(h)) == sanitize(h)`.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Sequence

from bot.core.errors import ContextOverflowError
from bot.core.history import Msg, ToolCall

INTERRUPTED_RESULT = "error: interrupted (this call never returned a result)"
MAX_ROUNDS = 5


def _synthetic(call: ToolCall, turn: int) -> Msg:
    return Msg("tool", INTERRUPTED_RESULT, turn, tool_call_id=call.id, name=call.name)


def adjacency(history: Sequence[Msg]) -> list[Msg]:
    """Answer every call right after its assistant message; drop misplaced results.

    A call without an adjacent result gets a synthetic error result; a `tool` message
    that does not answer an open call of the preceding assistant message is dropped,
    as is a second result for the same call.
    """
    out: list[Msg] = []
    open_calls: dict[str, ToolCall] = {}
    owner_turn = 0

    def close() -> None:
        out.extend(_synthetic(call, owner_turn) for call in open_calls.values())
        open_calls.clear()

    for msg in history:
        if msg.role == "tool":
            if msg.tool_call_id in open_calls:
                del open_calls[msg.tool_call_id]
                out.append(msg)
            continue
        close()
        out.append(msg)
        if msg.role == "assistant" and msg.tool_calls:
            open_calls = {c.id: c for c in msg.tool_calls}
            owner_turn = msg.turn
    close()
    return out


def drop_leading_orphans(history: Sequence[Msg]) -> list[Msg]:
    """Drop what cannot start a conversation: results, and assistant turns before a user."""
    start = 0
    while start < len(history) and history[start].role in ("tool", "assistant"):
        start += 1
    return list(history[start:])


def unique_calls(history: Sequence[Msg]) -> list[Msg]:
    """A call id may appear once in a history: later repeats are dropped."""
    seen: set[str] = set()
    out = []
    for m in history:
        if m.tool_calls:
            calls = []
            for c in m.tool_calls:
                if c.id not in seen:
                    seen.add(c.id)
                    calls.append(c)
            if len(calls) != len(m.tool_calls):
                m = Msg(m.role, m.content, m.turn, tuple(calls), id=m.id)
        out.append(m)
    return out


def drop_unmatched(history: Sequence[Msg]) -> list[Msg]:
    """Remove calls without results and results without calls, repeating until stable."""
    current = list(history)
    for _ in range(MAX_ROUNDS):
        call_ids = {c.id for m in current for c in m.tool_calls}
        result_ids: set[str] = set()
        kept: list[Msg] = []
        for m in current:
            if m.role == "tool":
                if m.tool_call_id not in call_ids or m.tool_call_id in result_ids:
                    continue
                result_ids.add(m.tool_call_id)
            kept.append(m)
        result: list[Msg] = []
        for m in kept:
            if m.tool_calls and any(c.id not in result_ids for c in m.tool_calls):
                calls = tuple(c for c in m.tool_calls if c.id in result_ids)
                m = Msg(m.role, m.content, m.turn, calls, id=m.id)
            if m.role == "assistant" and not m.content and not m.tool_calls:
                continue
            result.append(m)
        if result == current:
            break
        current = result
    return current


def sanitize(history: Sequence[Msg]) -> list[Msg]:
    """The four steps: adjacency, leading orphans, set difference, adjacency again.

    (Repeated call ids are dropped first: a history may hold each id once.)
    """
    out = adjacency(unique_calls(history))
    out = drop_leading_orphans(out)
    out = drop_unmatched(out)
    return adjacency(out)


def turn_starts(history: Sequence[Msg]) -> list[int]:
    """Indexes where a turn begins (the first message of each turn number)."""
    starts: list[int] = []
    last = None
    for i, m in enumerate(history):
        if m.turn != last:
            starts.append(i)
            last = m.turn
    return starts


def trim(
    history: Sequence[Msg], starts: Sequence[int], start: int, kept: int, budget: int
) -> tuple[int, int]:
    """Move the cut forward by whole turns, oldest first, until `kept` fits `budget`.

    Messages carry their cached token estimate; `starts` are the turn boundaries, `start` the
    current cut and `kept` = sum(tokens[start:]). The current (last) turn is never cut.
    Costs O(turns dropped), so a turn costs O(new messages), not O(history).
    """
    if not starts:
        return start, kept
    i = bisect_right(starts, start)
    while kept > budget and i < len(starts):
        nxt = starts[i]
        kept -= sum(m.tokens for m in history[start:nxt])
        start = nxt
        i += 1
    return start, kept


def check_system_fits(system_tokens: int, window: int, reserve: int) -> None:
    if system_tokens + reserve > window:
        raise ContextOverflowError(
            f"the system prompt needs ~{system_tokens} tokens but the context window is "
            f"{window} (with {reserve} reserved for the answer)"
        )
