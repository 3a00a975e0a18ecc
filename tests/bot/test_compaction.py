"""Summary compaction: the safe cut, the summary request, and the model call."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bot.core.history import Msg, ToolCall
from bot.llm import LiteLLMClient
from bot.turn.compaction import (
    SUMMARY_HEADER,
    TOOL_RESULT_CHARS,
    safe_cut,
    summarize,
    summary_message,
    summary_request,
    transcript,
    with_summary,
)
from bot.turn.context import turn_starts
from tests.conftest import make_config
from tests.fakes.model_server import FakeModelServer, Reply, ToolCallSpec


def call(i: str, name: str = "shell") -> ToolCall:
    return ToolCall(i, name, '{"command": "ls"}')


def asst(turn: int, *ids: str, text: str = "") -> Msg:
    return Msg("assistant", text, turn, tuple(call(i) for i in ids))


def res(turn: int, i: str, text: str = "ok") -> Msg:
    return Msg("tool", text, turn, tool_call_id=i, name="shell")


def u(turn: int, text: str = "[Ann] hi") -> Msg:
    return Msg("user", text, turn)


def cut_of(history: list[Msg], cut: int) -> int:
    return safe_cut(history, turn_starts(history), cut)


# -- safe_cut: literal cases -----------------------------------------------------------


def test_a_cut_that_orphans_nothing_stays() -> None:
    history = [u(1), asst(1, "a"), res(1, "a"), u(2), asst(2, "b"), res(2, "b")]
    assert cut_of(history, 3) == 3
    assert cut_of(history, 0) == 0


def test_a_result_in_a_later_turn_moves_the_cut_past_it() -> None:
    # turn 2 starts with the (late) result of turn 1's call
    history = [u(1), asst(1, "a"), res(2, "a"), u(2), u(3)]
    assert turn_starts(history) == [0, 2, 4]
    assert cut_of(history, 2) == 4


def test_moving_the_cut_can_orphan_another_result_so_it_iterates() -> None:
    history = [
        u(1), asst(1, "a"),                 # turn 1: 0-1, call a
        u(2), res(2, "a"), asst(2, "b"),    # turn 2: 2-4, a's late result, call b
        u(3), res(3, "b"),                  # turn 3: 5-6, b's late result
        u(4),                               # turn 4: 7
    ]
    assert turn_starts(history) == [0, 2, 5, 7]
    # cut 2 orphans a's result (3) -> 5, which orphans b's result (6) -> 7
    assert cut_of(history, 2) == 7
    assert cut_of(history, 5) == 7
    assert cut_of(history, 7) == 7


def test_no_safe_turn_start_left_means_everything() -> None:
    history = [u(1), asst(1, "a"), u(2), res(2, "a")]
    assert cut_of(history, 2) == 4


def test_a_cut_between_turn_starts_snaps_forward() -> None:
    history = [u(1), asst(1, "a"), res(1, "a"), u(2)]
    assert cut_of(history, 1) == 3


def test_results_without_a_call_do_not_move_the_cut() -> None:
    history = [u(1), u(2), res(2, "ghost"), u(3)]
    assert cut_of(history, 1) == 1


def test_the_nearest_earlier_call_owns_a_result() -> None:
    # a repeated id: the result after the second call belongs to it, not the first
    history = [u(1), asst(1, "a"), res(1, "a"), u(2), asst(2, "a"), res(2, "a")]
    assert cut_of(history, 3) == 3


def test_empty_history() -> None:
    assert safe_cut([], [], 0) == 0


# -- safe_cut: properties --------------------------------------------------------------


@st.composite
def cut_cases(draw: st.DrawFn) -> tuple[list[Msg], int]:
    """Histories with unique call ids whose results land anywhere, even in later turns."""
    msgs: list[Msg] = []
    calls: list[str] = []
    answered: set[str] = set()
    turn = 1
    for _ in range(draw(st.integers(0, 25))):
        if msgs and draw(st.booleans()):
            turn += 1
        kind = draw(st.sampled_from(["user", "assistant", "tool", "tool"]))
        open_ids = [c for c in calls if c not in answered]
        if kind == "tool" and open_ids:
            cid = draw(st.sampled_from(open_ids))
            answered.add(cid)
            msgs.append(res(turn, cid))
        elif kind == "tool":
            msgs.append(res(turn, f"ghost{len(msgs)}"))
        elif kind == "assistant":
            ids = [f"c{len(calls) + k}" for k in range(draw(st.integers(0, 2)))]
            calls.extend(ids)
            msgs.append(asst(turn, *ids, text="" if ids else "sure"))
        else:
            msgs.append(u(turn))
    cut = draw(st.integers(0, len(msgs)))
    return msgs, cut


def orphaned(history: list[Msg], cut: int) -> list[int]:
    where = {c.id: i for i, m in enumerate(history) for c in m.tool_calls}
    return [r for r in range(cut, len(history))
            if history[r].role == "tool" and where.get(history[r].tool_call_id or "", cut) < cut]


@settings(max_examples=400, deadline=None)
@given(cut_cases())
def test_safe_cut_properties(case: tuple[list[Msg], int]) -> None:
    history, cut = case
    starts = turn_starts(history)
    out = safe_cut(history, starts, cut)
    assert out >= cut
    assert out in starts or out == len(history)
    assert orphaned(history, out) == []
    assert safe_cut(history, starts, out) == out
    # and it is the smallest such cut: every turn start skipped would orphan a result
    for s in starts:
        if cut <= s < out:
            assert orphaned(history, s)


# -- the summary request ---------------------------------------------------------------


DROPPED = [
    u(1, "[Ann] please list the repo"),
    asst(1, "a", text="Looking."),
    res(1, "a", "x" * 2000),
    Msg("assistant", "It holds /work/main/bot/hub.py.", 1),
    u(2, "[Bob] thanks"),
]


def test_summary_request_is_a_system_and_one_user_message() -> None:
    messages = summary_request(DROPPED, None)
    assert [m["role"] for m in messages] == ["system", "user"]
    assert all(set(m) == {"role", "content"} for m in messages)
    assert "300 words" in messages[0]["content"]
    text = messages[1]["content"]
    assert "Previous summary" not in text
    assert "user: [Ann] please list the repo" in text
    assert "assistant: Looking." in text
    assert 'assistant called shell({"command": "ls"})' in text
    assert "/work/main/bot/hub.py" in text
    assert "user: [Bob] thanks" in text
    assert text.index("[Ann]") < text.index("called shell") < text.index("[Bob]")


def test_summary_request_includes_the_previous_summary_first() -> None:
    text = summary_request(DROPPED, "Ann owns the repo.", words=120)[1]["content"]
    assert text.startswith("Previous summary:\nAnn owns the repo.")
    assert text.index("Ann owns the repo.") < text.index("[Ann] please")
    assert "120 words" in summary_request(DROPPED, None, words=120)[0]["content"]


def test_tool_results_are_truncated() -> None:
    text = summary_request(DROPPED, None)[1]["content"]
    line = next(x for x in text.splitlines() if x.startswith("tool result"))
    assert "x" * TOOL_RESULT_CHARS in line
    assert "x" * (TOOL_RESULT_CHARS + 1) not in line
    assert "[1500 more characters]" in line


def test_malformed_arguments_are_shown_verbatim() -> None:
    msg = Msg("assistant", "", 1, (ToolCall("a", "shell", '{"command": '),))
    assert 'assistant called shell({"command":)' in transcript([msg])


def test_a_long_transcript_keeps_the_newest_entries() -> None:
    dropped = [u(t, f"[Ann] message {t} " + "y" * 100) for t in range(100)]
    text = transcript(dropped, max_chars=1000)
    assert len(text) < 1200
    assert "message 99 " in text and "message 0 " not in text
    assert text.startswith("[") and "earlier entries left out]" in text.splitlines()[0]


# -- the summary in a request ----------------------------------------------------------


def test_with_summary_folds_into_the_system_prompt() -> None:
    wire = [{"role": "system", "content": "You are Tandem."}, {"role": "user", "content": "hi"}]
    out = with_summary(wire, " Ann owns the repo. ")
    assert [m["role"] for m in out] == ["system", "user"]
    assert out[0]["content"] == f"You are Tandem.\n\n{SUMMARY_HEADER}\nAnn owns the repo."
    assert wire[0]["content"] == "You are Tandem."  # input untouched
    assert with_summary(wire, None) == wire
    assert with_summary(wire, "  ") == wire
    assert with_summary(wire[1:], "s") == [summary_message("s"), wire[1]]
    assert summary_message("s") == {"role": "system", "content": f"{SUMMARY_HEADER}\ns"}


# -- summarize against the fake server, through the real client ------------------------


def client(tmp_path: Path, model: FakeModelServer) -> LiteLLMClient:
    return LiteLLMClient(make_config(tmp_path, model, llm__retries=0).llm)


def warnings_of(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records
            if r.name == "bot.turn.compaction" and r.levelno == logging.WARNING]


async def test_summarize_returns_the_stripped_summary(
    tmp_path: Path, model: FakeModelServer, caplog: pytest.LogCaptureFixture
) -> None:
    model.script(Reply(text="  Ann asked for the repo listing; it holds bot/hub.py.\n"))
    out = await summarize(client(tmp_path, model), DROPPED, "Earlier: hello.", 800)
    assert out == "Ann asked for the repo listing; it holds bot/hub.py."
    assert warnings_of(caplog) == []
    body = model.requests[-1]
    assert "tools" not in body
    assert body["messages"] == summary_request(DROPPED, "Earlier: hello.", words=400)
    assert all(m["role"] in ("system", "user") for m in body["messages"])


async def test_a_summarized_window_is_accepted_by_the_strict_server(
    tmp_path: Path, model: FakeModelServer
) -> None:
    window = [u(3, "[Ann] next?"), asst(3, "c"), res(3, "c")]
    wire = with_summary([{"role": "system", "content": "You are Tandem."}]
                        + [m.wire() for m in window], "Ann owns the repo.")
    model.script(Reply(text="fine"))
    items = [i async for i in client(tmp_path, model).stream(wire, tools=[])]
    assert items[-1].text == "fine"  # type: ignore[union-attr]
    assert model.violations == []


async def test_a_model_error_gives_none(
    tmp_path: Path, model: FakeModelServer, caplog: pytest.LogCaptureFixture
) -> None:
    model.script(Reply(fault="500"))
    assert await summarize(client(tmp_path, model), DROPPED, None, 800) is None
    assert len(warnings_of(caplog)) == 1
    assert "ModelUnreachable" in warnings_of(caplog)[0]


async def test_an_oversized_summary_gives_none(
    tmp_path: Path, model: FakeModelServer, caplog: pytest.LogCaptureFixture
) -> None:
    model.script(Reply(text="word " * 200, chunk_size=64))  # ~250 tokens
    assert await summarize(client(tmp_path, model), DROPPED, None, 100) is None
    assert len(warnings_of(caplog)) == 1
    assert "limit 100" in warnings_of(caplog)[0]


async def test_a_summary_with_tool_calls_gives_none(
    tmp_path: Path, model: FakeModelServer, caplog: pytest.LogCaptureFixture
) -> None:
    model.script(Reply(text="let me check",
                       tool_calls=[ToolCallSpec("shell", {"command": "ls"})]))
    assert await summarize(client(tmp_path, model), DROPPED, None, 800) is None
    assert len(warnings_of(caplog)) == 1
    assert "tool" in warnings_of(caplog)[0]


async def test_an_empty_summary_gives_none(
    tmp_path: Path, model: FakeModelServer, caplog: pytest.LogCaptureFixture
) -> None:
    model.script(Reply(text="   "))
    assert await summarize(client(tmp_path, model), DROPPED, None, 800) is None
    assert len(warnings_of(caplog)) == 1


async def test_nothing_dropped_keeps_the_previous_summary_without_a_call(
    tmp_path: Path, model: FakeModelServer
) -> None:
    assert await summarize(client(tmp_path, model), [], "kept", 800) == "kept"
    assert model.requests == []
