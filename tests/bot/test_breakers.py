"""The four breaker tiers, as a pure check over this turn's calls."""

from __future__ import annotations

from bot import breakers
from bot.config import Breakers
from bot.history import CallState, Outcome, ToolCall
from bot.loop import CallRecord

LIMITS = Breakers()


def done(args: str, outcome: Outcome, name: str = "shell") -> CallRecord:
    return CallRecord(call=ToolCall("x", name, args), state=CallState.FINISHED, outcome=outcome)


def test_same_call_five_times_is_skipped_whatever_the_outcome() -> None:
    history = [done('{"command": "ls"}', Outcome.OK)] * 4
    assert breakers.check(LIMITS, history, "shell", '{"command":"ls"}') is None
    trip = breakers.check(LIMITS, [*history, done('{"command": "ls"}', Outcome.OK)],
                          "shell", '{ "command" : "ls" }')
    assert trip is not None and not trip.fatal and "already" in trip.message


def test_same_call_failing_three_times_in_a_row_is_skipped_and_a_success_resets() -> None:
    fail = done('{"command": "false"}', Outcome.ERROR)
    ok = done('{"command": "false"}', Outcome.OK)
    assert breakers.check(LIMITS, [fail, fail], "shell", '{"command": "false"}') is None
    trip = breakers.check(LIMITS, [fail, fail, fail], "shell", '{"command": "false"}')
    assert trip is not None and not trip.fatal
    assert breakers.check(LIMITS, [fail, fail, ok, fail], "shell", '{"command": "false"}') is None


def test_same_tool_failing_six_times_with_any_args_warns() -> None:
    history = [done(f'{{"command": "c{i}"}}', Outcome.ERROR) for i in range(6)]
    trip = breakers.check(LIMITS, history, "shell", '{"command": "new"}')
    assert trip is not None and not trip.fatal and "failed 6 times" in trip.message
    assert breakers.check(LIMITS, history, "read_file", '{"path": "a"}') is None


def test_same_tool_failing_eight_times_ends_the_turn() -> None:
    history = [done(f'{{"command": "c{i}"}}', Outcome.ERROR) for i in range(6)]
    history += [done('{"command": "x"}', Outcome.SKIPPED)] * 2
    trip = breakers.check(LIMITS, history, "shell", '{"command": "new"}')
    assert trip is not None and trip.fatal and "another way" in trip.message


def test_denials_neither_count_nor_reset() -> None:
    fail = done('{"command": "a"}', Outcome.ERROR)
    denied = done('{"command": "a"}', Outcome.DENIED)
    trip = breakers.check(LIMITS, [fail, denied, fail, denied, fail], "shell", '{"command": "a"}')
    assert trip is not None


def test_ledger_keeps_only_the_last_fifty_calls() -> None:
    old = [done('{"command": "ls"}', Outcome.OK)] * 5
    fresh = [done(f'{{"path": "{i}"}}', Outcome.OK, "read_file") for i in range(50)]
    assert breakers.check(LIMITS, old + fresh, "shell", '{"command": "ls"}') is None
