"""Sanitizer and trimming: literal histories and property tests."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import example, find, given, settings
from hypothesis import strategies as st

from bot.core.errors import ContextOverflowError
from bot.core.history import Msg, ToolCall
from bot.turn.context import (
    INTERRUPTED_RESULT,
    adjacency,
    check_system_fits,
    sanitize,
    trim,
    turn_starts,
)


def call(i: str, name: str = "shell") -> ToolCall:
    return ToolCall(i, name, '{"command": "ls"}')


def asst(turn: int, *ids: str, text: str = "") -> Msg:
    return Msg("assistant", text, turn, tuple(call(i) for i in ids))


def res(turn: int, i: str) -> Msg:
    return Msg("tool", "ok", turn, tool_call_id=i, name="shell")


def u(turn: int, text: str = "hi") -> Msg:
    return Msg("user", text, turn)


# -- independent validators: what OpenAI and Anthropic accept --------------------------


def openai_violations(history: list[Msg]) -> list[str]:
    problems = []
    open_ids: set[str] = set()
    answered: set[str] = set()
    for i, m in enumerate(history):
        if m.role == "tool":
            if m.tool_call_id not in open_ids:
                problems.append(f"{i}: orphan result {m.tool_call_id}")
            open_ids.discard(m.tool_call_id or "")
            if m.tool_call_id in answered:
                problems.append(f"{i}: duplicate result")
            answered.add(m.tool_call_id or "")
            continue
        if open_ids:
            problems.append(f"{i}: unanswered {sorted(open_ids)}")
        open_ids = {c.id for c in m.tool_calls} if m.role == "assistant" else set()
    if open_ids:
        problems.append(f"end: unanswered {sorted(open_ids)}")
    ids = [c.id for m in history for c in m.tool_calls]
    if len(ids) != len(set(ids)):
        problems.append("duplicate call ids")
    return problems


def anthropic_violations(history: list[Msg]) -> list[str]:
    problems = openai_violations(history)
    if history and history[0].role != "user":
        problems.append("first message is not from the user")
    for i, m in enumerate(history):
        if m.role == "assistant" and not m.content and not m.tool_calls:
            problems.append(f"{i}: empty assistant message")
    return problems


# -- literal cases ---------------------------------------------------------------------


def test_missing_result_gets_an_interrupted_result_right_after_the_call() -> None:
    out = sanitize([u(1), asst(1, "a"), u(2)])
    assert [m.role for m in out] == ["user", "assistant", "tool", "user"]
    assert out[2].tool_call_id == "a" and out[2].content == INTERRUPTED_RESULT


def test_orphan_and_misplaced_results_are_dropped() -> None:
    history = [res(1, "x"), u(1), asst(1, "a"), u(1, "interjection"), res(1, "a")]
    out = sanitize(history)
    assert openai_violations(out) == []
    assert [m.role for m in out] == ["user", "assistant", "tool", "user"]


def test_duplicate_results_keep_the_first() -> None:
    out = sanitize([u(1), asst(1, "a"), res(1, "a"), res(1, "a")])
    assert sum(1 for m in out if m.role == "tool") == 1


def test_leading_assistant_and_results_are_dropped() -> None:
    out = sanitize([asst(1, "a"), res(1, "a"), Msg("assistant", "hello", 1), u(2)])
    assert out == [u(2)]


def test_valid_history_is_unchanged() -> None:
    history = [u(1), asst(1, "a", "b"), res(1, "a"), res(1, "b"), Msg("assistant", "done", 1)]
    assert sanitize(history) == history


def test_adjacency_never_mutates_input() -> None:
    history = [u(1), asst(1, "a")]
    before = list(history)
    adjacency(history)
    assert history == before


# -- property tests --------------------------------------------------------------------


@st.composite
def histories(draw: st.DrawFn) -> list[Msg]:
    """Random conversations, then damaged: cut, crashed, duplicated, shuffled results."""
    msgs: list[Msg] = []
    n = 0
    for turn in range(1, draw(st.integers(1, 6)) + 1):
        msgs.append(u(turn))
        for _ in range(draw(st.integers(0, 3))):
            ids = []
            for _ in range(draw(st.integers(0, 3))):
                n += 1
                ids.append(draw(st.sampled_from([f"c{n}", "call_0", f"c{n}"])))
            msgs.append(asst(turn, *ids, text=draw(st.sampled_from(["", "t"]))))
            results = [res(turn, i) for i in ids if draw(st.booleans())]
            if draw(st.booleans()):
                results = draw(st.permutations(results))
            msgs.extend(results[: draw(st.integers(0, len(results)))])
        if draw(st.booleans()):
            msgs.append(Msg("assistant", "answer", turn))
    # damage: a cut point, a crash (truncated end), a duplicate, a stray orphan
    cut = draw(st.integers(0, len(msgs)))
    end = draw(st.integers(cut, len(msgs)))
    damaged = msgs[cut:end]
    if damaged and draw(st.booleans()):
        i = draw(st.integers(0, len(damaged) - 1))
        damaged.insert(draw(st.integers(0, len(damaged))), damaged[i])
    if draw(st.booleans()):
        damaged.insert(draw(st.integers(0, len(damaged))), res(1, "ghost"))
    early = [i for i, m in enumerate(damaged) if m.role == "tool" and call_at(damaged, m) < i]
    if early and draw(st.booleans()):  # a result stored before its own call
        result = damaged.pop(draw(st.sampled_from(early)))
        at = call_at(damaged, result)
        damaged.insert(draw(st.integers(max(0, at - 2), at)), result)
    return damaged


def call_at(history: list[Msg], result: Msg) -> int:
    """Where the call a result answers is (len(history) when nowhere)."""
    return next((i for i, m in enumerate(history)
                 if any(c.id == result.tool_call_id for c in m.tool_calls)), len(history))


def result_before_its_call(history: list[Msg]) -> bool:
    return any(m.role == "tool" and i < call_at(history, m) < len(history)
               for i, m in enumerate(history))


def test_the_history_generator_reaches_a_result_before_its_own_call() -> None:
    found = find(histories(), result_before_its_call, settings=settings(database=None))
    assert result_before_its_call(found)


@settings(max_examples=400, deadline=None)
@given(histories())
@example([u(1), res(1, "a"), asst(1, "a"), Msg("assistant", "done", 1)])
@example([u(1), asst(1, "a", "b"), res(1, "b"), res(1, "a")])
def test_sanitized_history_passes_openai_and_anthropic_rules(history: list[Msg]) -> None:
    out = sanitize(history)
    assert openai_violations(out) == []
    assert anthropic_violations(out) == []


@settings(max_examples=400, deadline=None)
@given(histories())
def test_sanitize_is_idempotent(history: list[Msg]) -> None:
    once = sanitize(history)
    assert sanitize(once) == once


# -- trimming --------------------------------------------------------------------------


def conversation(turns: int, size: int) -> list[Msg]:
    out = []
    for t in range(1, turns + 1):
        out += [u(t, "x" * size), asst(t, f"c{t}"), res(t, f"c{t}"),
                Msg("assistant", "y" * size, t)]
    return out


def test_trim_drops_whole_turns_oldest_first() -> None:
    history = conversation(10, 400)
    total = sum(m.tokens for m in history)
    starts = turn_starts(history)
    start, kept = trim(history, starts, 0, total, total // 2)
    assert start in starts
    assert kept == sum(m.tokens for m in history[start:]) <= total // 2
    assert history[start].role == "user"
    assert openai_violations(history[start:]) == []


def test_trim_never_cuts_the_current_turn() -> None:
    history = conversation(3, 10) + [u(4, "z" * 40_000)]
    total = sum(m.tokens for m in history)
    start, kept = trim(history, turn_starts(history), 0, total, 100)
    assert history[start:] == [history[-1]]
    assert kept > 100  # over budget, but the current turn stays whole


def test_trim_is_incremental_from_the_previous_cut() -> None:
    history = conversation(6, 400)
    starts = turn_starts(history)
    total = sum(m.tokens for m in history)
    first, kept = trim(history, starts, 0, total, total * 2 // 3)
    again, kept2 = trim(history, starts, first, kept, total * 2 // 3)
    assert (again, kept2) == (first, kept)


def test_a_system_prompt_larger_than_the_window_is_a_clear_error() -> None:
    with pytest.raises(ContextOverflowError, match="context window"):
        check_system_fits(50_000, 32_000, 4_000)


def from_wire(wire: list[dict[str, object]]) -> list[Msg]:
    out = []
    for d in wire:
        calls = tuple(ToolCall(c["id"], c["function"]["name"], c["function"]["arguments"])
                      for c in d.get("tool_calls") or [])  # type: ignore[attr-defined]
        out.append(Msg(str(d["role"]), str(d.get("content") or ""), 0, calls,
                       d.get("tool_call_id")))  # type: ignore[arg-type]
    return out


@settings(max_examples=300, deadline=None)
@given(histories(), st.integers(0, 6))
def test_the_turn_by_turn_window_is_as_valid_as_a_whole_sanitize(history: list[Msg],
                                                                  drop: int) -> None:
    from bot.core.events import ConvKey
    from bot.store import ConvRow
    from bot.turn.conversation import Conversation

    history = unique_ids(history)
    conv = Conversation.load(ConvRow(1, ConvKey("t", "1"), 1), history)
    if conv.starts:
        conv.cut = conv.starts[min(drop, len(conv.starts) - 1)]
    first = conv.wire_window()
    assert anthropic_violations(from_wire(first)) == []
    assert conv.wire_window() == first  # the cached turns give the same answer
    if all(conv.history[s].role == "user" for s in conv.starts):
        assert first == [m.wire() for m in sanitize(conv.window())]
    conv.trim_to(conv.kept // 2)  # the cut moves: cached turns before it are forgotten
    fresh = Conversation.load(ConvRow(1, ConvKey("t", "1"), 1), history)
    fresh.cut = conv.cut
    assert conv.wire_window() == fresh.wire_window()


def unique_ids(history: list[Msg]) -> list[Msg]:
    """Stored sessions never repeat a call id (the runner renames repeats)."""
    seen: set[str] = set()
    out = []
    for m in history:
        calls = []
        for c in m.tool_calls:
            if c.id not in seen:
                seen.add(c.id)
                calls.append(c)
        out.append(Msg(m.role, m.content, m.turn, tuple(calls), m.tool_call_id, m.name)
                   if m.tool_calls else m)
    return out


# -- a turn that outgrows the budget in its middle ---------------------------------------


@st.composite
def growing_turns(draw: st.DrawFn) -> tuple[list[Msg], list[list[Msg]], int]:
    """Finished turns and the current turn's user message; the turn's steps (calls with
    their results, then the answer); and a budget the whole turn outgrows, often in its
    middle (the window fits it when the turn starts)."""
    history: list[Msg] = []
    turns = draw(st.integers(1, 5))
    for t in range(1, turns + 1):
        history += [u(t, "x" * draw(st.integers(1, 800))),
                    Msg("assistant", "y" * draw(st.integers(1, 800)), t)]
    turn = turns + 1
    history.append(u(turn, "go"))
    steps: list[list[Msg]] = []
    n = 0
    for _ in range(draw(st.integers(1, 4))):
        ids = [f"g{n + k}" for k in range(draw(st.integers(1, 3)))]
        n += len(ids)
        steps.append([asst(turn, *ids)] + [
            Msg("tool", "o" * draw(st.integers(1, 3000)), turn, tool_call_id=i, name="shell")
            for i in ids])
    steps.append([Msg("assistant", "done", turn)])
    at_start = sum(m.tokens for m in history)
    total = at_start + sum(m.tokens for step in steps for m in step)
    budget = draw(st.integers(history[-1].tokens, total - 1))
    return history, steps, budget


def load(history: list[Msg]) -> Any:
    from bot.core.events import ConvKey
    from bot.store import ConvRow
    from bot.turn.conversation import Conversation

    return Conversation.load(ConvRow(1, ConvKey("t", "1"), 1), history)


def outgrows_mid_turn(case: tuple[list[Msg], list[list[Msg]], int]) -> bool:
    history, steps, budget = case
    conv = load(history)
    conv.trim_to(budget)
    if conv.kept > budget:
        return False
    for step in steps[:-1]:
        for m in step:
            conv.append(m)
        if conv.kept > budget:
            return True
    return False


def test_the_turn_generator_reaches_a_turn_that_outgrows_the_budget_mid_turn() -> None:
    found = find(growing_turns(), outgrows_mid_turn, settings=settings(database=None))
    assert outgrows_mid_turn(found)


@settings(max_examples=300, deadline=None)
@given(growing_turns())
def test_a_turn_trimmed_once_sends_requests_that_extend_each_other(
        case: tuple[list[Msg], list[list[Msg]], int]) -> None:
    history, steps, budget = case
    conv = load(history)
    conv.trim_to(budget)  # the turn's one trim, before its first request
    current = conv.starts[-1]
    assert conv.cut <= current  # never into the current turn
    requests = [conv.wire_window()]
    for step in steps:
        for m in step:
            conv.append(m)
        requests.append(conv.wire_window())
    for before, after in zip(requests, requests[1:], strict=False):
        assert after[: len(before)] == before  # one prefix, grown (what a cache reuses)
    assert anthropic_violations(from_wire(requests[-1])) == []
    # a trim in the middle of the turn (which the runner does only when the provider
    # refuses a request as too long) keeps the current turn whole too
    kept_turn = [m.wire() for m in conv.history[current:]]
    conv.trim_to(budget)
    assert conv.cut <= current
    assert conv.wire_window()[-len(kept_turn):] == kept_turn
