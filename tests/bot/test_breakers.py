"""The breaker tiers: pure checks over this turn's calls and the session's failure ledger."""

from __future__ import annotations

import json
from collections.abc import Sequence

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bot.core.config import Breakers
from bot.core.history import Outcome
from bot.turn.breakers import Ledger, Seen, Trip, TripKind, after_failure, call_key, check

LIMITS = Breakers()
OK, ERR, SKIP = Outcome.OK, Outcome.ERROR, Outcome.SKIPPED
REPEAT, SAME, WARN, FATAL, LOOP = (TripKind.REPEAT, TripKind.SAME_FAILING, TripKind.WARN,
                                   TripKind.FATAL, TripKind.LOOP)


def cmd(command: str) -> str:
    return json.dumps({"command": command})


def ledger_of(calls: Sequence[tuple[str, Outcome]], name: str = "shell",
              size: int = 50) -> Ledger:
    return Ledger.replay(size, [(name, args, outcome) for args, outcome in calls])


def failing(n: int, args: str | None = None) -> list[tuple[str, Outcome]]:
    """`n` failures of one exact call, or of `n` different calls when `args` is None."""
    return [(args if args is not None else cmd(f"c{i}"), ERR) for i in range(n)]


class Session:
    """What the runner does with the breakers: check, run (or skip), record, after_failure."""

    def __init__(self, limits: Breakers = LIMITS) -> None:
        self.limits = limits
        self.ledger = Ledger(limits.ledger_size)
        self.turn: list[Seen] = []
        self.trips: list[Trip] = []

    def call(self, args: str, outcome: Outcome = ERR, name: str = "shell") -> TripKind | None:
        trip = check(self.limits, self.turn, self.ledger, name, args)
        if trip is None:
            self.turn.append(Seen(name, args, outcome))
            self.ledger = self.ledger.record(name, args, outcome)
            trip = after_failure(self.limits, self.ledger, name) if outcome is ERR else None
        elif not trip.fatal:
            self.turn.append(Seen(name, args, SKIP, trip.kind))
            self.ledger = self.ledger.record(name, args, SKIP, trip.kind)
        if trip is not None:
            self.trips.append(trip)
        return None if trip is None else trip.kind

    def run(self, calls: Sequence[tuple[str, Outcome]]) -> list[TripKind | None]:
        """Run calls in one turn until one ends it; the kinds the calls got."""
        kinds: list[TripKind | None] = []
        for args, outcome in calls:
            kinds.append(self.call(args, outcome))
            if kinds[-1] in (FATAL, LOOP):
                break
        return kinds


# -- Each tier at its threshold and one below -------------------------------------------

LS = cmd("ls")
RUNS = [Seen("shell", LS, OK)] * 5
SKIPPED = Seen("shell", LS, SKIP, REPEAT)


def warned_ledger(failures: int) -> Ledger:
    """`failures` different failing calls, with the warning given after the sixth."""
    ledger = Ledger()
    for i, (args, outcome) in enumerate(failing(failures)):
        if i == LIMITS.tool_failures_warn:
            ledger = ledger.record("shell", cmd("w"), SKIP, WARN)
        ledger = ledger.record("shell", args, outcome)
    return ledger


@pytest.mark.parametrize(
    ("turn", "ledger", "args", "expected"),
    [
        pytest.param(RUNS[:4], Ledger(), LS, None, id="same-call-4"),
        pytest.param(RUNS, Ledger(), LS, REPEAT, id="same-call-5"),
        pytest.param([Seen("shell", LS, ERR)] * 2, ledger_of(failing(2, LS)), LS, None,
                     id="same-failing-2"),
        pytest.param([], ledger_of(failing(3, LS)), LS, SAME, id="same-failing-3"),
        pytest.param([], ledger_of(failing(5)), cmd("new"), None, id="warn-5"),
        pytest.param([], ledger_of(failing(6)), cmd("new"), WARN, id="warn-6"),
        pytest.param([], warned_ledger(7), cmd("new"), None, id="fatal-7"),
        pytest.param([], warned_ledger(8), cmd("new"), FATAL, id="fatal-8"),
        pytest.param([*RUNS, SKIPPED], Ledger(), LS, REPEAT, id="loop-1-skip"),
        pytest.param([*RUNS, SKIPPED, SKIPPED], Ledger(), LS, LOOP, id="loop-2-skips"),
    ],
)
def test_each_tier_trips_at_its_threshold(
    turn: list[Seen], ledger: Ledger, args: str, expected: TripKind | None
) -> None:
    trip = check(LIMITS, turn, ledger, "shell", args)
    assert (trip and trip.kind) == expected
    if trip is not None:
        assert trip.fatal == (expected in (FATAL, LOOP))


@pytest.mark.parametrize(("failures", "expected"), [(7, None), (8, FATAL)])
def test_after_failure_is_the_fatal_tier(failures: int, expected: TripKind | None) -> None:
    trip = after_failure(LIMITS, ledger_of(failing(failures)), "shell")
    assert (trip and trip.kind) == expected
    assert after_failure(LIMITS, ledger_of(failing(failures)), "read_file") is None


@pytest.mark.parametrize(
    ("kind", "name", "n", "expected"),
    [
        (REPEAT, "shell", 5, "skipped: this exact `shell` call already ran 5 times in this "
         "turn and its result was returned earlier. Use that result or try something else."),
        (SAME, "shell", 3, "skipped: this exact `shell` call failed 3 times in a row. "
         "Change the arguments or the approach."),
        (WARN, "shell", 6, "skipped: `shell` failed 6 times in a row. Stop using it for now "
         "and tell the user what is going wrong."),
        (FATAL, "shell", 8, "`shell` failed 8 times in a row, so Tandem stopped this turn. "
         "Please try another way."),
        (LOOP, "shell", 0, LIMITS.loop_message.format(tool="shell")),
    ],
)
def test_messages(kind: TripKind, name: str, n: int, expected: str) -> None:
    turn: list[Seen] = []
    ledger = Ledger()
    if kind is REPEAT:
        turn = RUNS
    elif kind is SAME:
        ledger = ledger_of(failing(n, LS))
    elif kind in (WARN, FATAL):
        ledger = warned_ledger(n) if kind is FATAL else ledger_of(failing(n))
    else:
        turn = [*RUNS, SKIPPED, SKIPPED]
    trip = check(LIMITS, turn, ledger, name, LS)
    assert trip == Trip(kind, expected)
    assert "{" not in trip.message


# -- Skipped calls are not failures -------------------------------------------------------

@pytest.mark.parametrize("repeats", [1, 2, 30])
def test_repeated_skips_never_become_fatal(repeats: int) -> None:
    session = Session(Breakers(ignored_skips=1000))
    assert session.run([(LS, OK)] * 5) == [None] * 5
    assert session.run([(LS, OK)] * repeats) == [REPEAT] * repeats
    assert session.ledger.failures("shell") == 0
    assert after_failure(session.limits, session.ledger, "shell") is None
    assert not any("stopped" in t.message or "failed" in t.message for t in session.trips)


@pytest.mark.parametrize(
    ("calls", "expected"),
    [
        pytest.param([(LS, OK)] * 9, [None] * 5 + [REPEAT, REPEAT, LOOP], id="repeat"),
        pytest.param([(LS, ERR)] * 9, [None, None, None, SAME, SAME, LOOP],
                     id="same-failing"),
        pytest.param([(LS, OK)] * 5 + [(cmd("pwd"), OK)] + [(LS, OK)] * 3,
                     [None] * 6 + [REPEAT, REPEAT, LOOP], id="other-calls-between"),
    ],
)
def test_ignoring_skips_ends_the_turn_with_the_loop_message(
    calls: list[tuple[str, Outcome]], expected: list[TripKind | None]
) -> None:
    session = Session()
    assert session.run(calls) == expected
    assert session.trips[-1] == Trip(LOOP, LIMITS.loop_message.format(tool="shell"))
    assert session.ledger.failures("shell") == sum(1 for _, o in calls[:3] if o is ERR)


def test_skips_are_counted_per_call_and_per_turn() -> None:
    session = Session()
    session.run([(LS, OK)] * 5 + [(LS, OK)] * 2)
    assert session.call(cmd("pwd"), OK) is None
    session.turn = []
    assert session.run([(LS, OK)] * 8) == [None] * 5 + [REPEAT, REPEAT, LOOP]


# -- The warning: once a streak, then the fatal tier --------------------------------------

K1, K2 = cmd("k1"), cmd("k2")
LENIENT = Breakers(same_call=100, same_call_failures=100)


@pytest.mark.parametrize(
    ("limits", "calls", "expected"),
    [
        pytest.param(LIMITS, [*failing(6), (cmd("c6"), ERR), (cmd("c6"), ERR), (cmd("c7"), ERR)],
                     [None] * 6 + [WARN, None, FATAL], id="varying-args"),
        pytest.param(LIMITS, [(K1, ERR), (K2, ERR)] * 3 + [(K1, ERR), (K1, ERR),
                                                           (cmd("k3"), ERR), (cmd("k4"), ERR)],
                     [None] * 6 + [WARN, SAME, None, FATAL], id="alternating-k1-k2"),
        pytest.param(LENIENT, [(K1, ERR)] * 9, [None] * 6 + [WARN, None, FATAL],
                     id="identical-args"),
    ],
)
def test_the_warning_fires_once_a_streak_then_two_more_failures_are_fatal(
    limits: Breakers, calls: list[tuple[str, Outcome]], expected: list[TripKind | None]
) -> None:
    session = Session(limits)
    assert session.run(calls) == expected
    assert session.ledger.failures("shell") == limits.tool_failures_fatal
    assert session.trips[-1].fatal and "failed 8 times" in session.trips[-1].message


def test_the_warning_comes_back_with_a_new_streak() -> None:
    session = Session()
    assert session.run([*failing(6), (cmd("x"), ERR)]) == [None] * 6 + [WARN]
    assert session.call(cmd("fixed"), OK) is None
    assert not session.ledger.warned("shell")
    session.turn = []
    assert session.run([*failing(6), (cmd("x"), ERR)]) == [None] * 6 + [WARN]


def test_the_warning_holds_across_turns() -> None:
    session = Session()
    session.run([*failing(6), (cmd("x"), ERR)])
    session.turn = []
    assert session.run([(cmd("y"), ERR), (cmd("z"), ERR)]) == [None, FATAL]


# -- What resets and what does not --------------------------------------------------------

@pytest.mark.parametrize(
    ("calls", "failures", "call_failures"),
    [
        pytest.param(failing(5, LS) + [(cmd("other"), OK)], 0, 0, id="success-any-args"),
        pytest.param(failing(2, LS) + [(LS, OK)] + failing(1, LS), 1, 1, id="success-then-fail"),
        pytest.param([(LS, ERR), (LS, Outcome.DENIED), (LS, ERR), (LS, Outcome.EXPIRED),
                      (LS, ERR), (LS, Outcome.INTERRUPTED)], 3, 3, id="neither-count-nor-reset"),
        pytest.param(failing(3, LS) + [(LS, SKIP)] * 4, 3, 3, id="skips-do-not-count"),
        pytest.param([(LS, ERR), (K1, ERR), (LS, ERR)], 3, 2, id="other-args-between"),
    ],
)
def test_failure_counts(
    calls: list[tuple[str, Outcome]], failures: int, call_failures: int
) -> None:
    ledger = ledger_of(calls)
    assert (ledger.failures("shell"), ledger.call_failures("shell", LS)) == (
        failures, call_failures)


def test_a_success_resets_only_its_own_tool() -> None:
    ledger = ledger_of(failing(7)).record("read_file", "{}", ERR).record("read_file", "{}", OK)
    assert (ledger.failures("shell"), ledger.failures("read_file")) == (7, 0)
    ledger = ledger.record("shell", "{}", OK)
    assert ledger.failures("shell") == 0
    assert check(LIMITS, [], ledger, "shell", cmd("c0")) is None


def test_a_warning_marker_is_dropped_by_a_success() -> None:
    ledger = ledger_of(failing(6)).record("shell", K1, SKIP, WARN)
    assert ledger.warned("shell") and ledger.failures("shell") == 6
    assert not ledger.record("shell", K1, OK).warned("shell")


# -- The ledger ---------------------------------------------------------------------------

@pytest.mark.parametrize(
    ("old", "newer", "expected"),
    [(5, 45, 5), (5, 46, 4), (5, 50, 0), (0, 60, 0)],
)
def test_the_ledger_keeps_only_the_last_fifty_failures(old: int, newer: int,
                                                        expected: int) -> None:
    ledger = ledger_of(failing(old))
    for i in range(newer):
        ledger = ledger.record("read_file", json.dumps({"path": str(i)}), ERR)
    assert ledger.failures("shell") == expected
    assert ledger.failures("read_file") == min(newer, 50)
    assert sum(1 for e in ledger.entries if not e.warn) <= 50


def test_one_tool_failing_more_than_fifty_times_counts_fifty() -> None:
    assert ledger_of(failing(60)).failures("shell") == 50


def test_warn_markers_take_no_failure_slot() -> None:
    ledger = ledger_of(failing(6)).record("shell", K1, SKIP, WARN)
    for i in range(44):
        ledger = ledger.record("read_file", str(i), ERR)
    assert ledger.failures("shell") == 6 and ledger.warned("shell")
    assert ledger.record("read_file", "x", ERR).failures("shell") == 5


def test_replay_rebuilds_the_ledger_recorded_one_by_one() -> None:
    calls = [("shell", cmd(f"c{i % 4}"), [ERR, OK, ERR, Outcome.DENIED, SKIP][i % 5])
             for i in range(40)]
    calls += [("read_file", str(i), ERR) for i in range(20)]
    ledger = Ledger(10)
    for name, args, outcome in calls:
        ledger = ledger.record(name, args, outcome)
    assert Ledger.replay(10, calls) == ledger
    assert Ledger.replay(10, calls).entries[-1].name == "read_file"


def test_the_ledger_is_immutable() -> None:
    ledger = Ledger()
    assert ledger.record("shell", LS, ERR) is not ledger
    assert ledger.entries == ()
    with pytest.raises(AttributeError):
        ledger.size = 3  # type: ignore[misc]


# -- Canonical arguments ------------------------------------------------------------------

A, B = '{"a":1,"b":2}', '{"b": 2, "a": 1}'


@pytest.mark.parametrize(
    ("left", "right", "same"),
    [(A, B, True), (A, '{"a": 1, "b": 3}', False), ("not json ", " not json", True),
     ("{}", "{ }", True), ("", "  ", True)],
)
def test_canonical_arguments(left: str, right: str, same: bool) -> None:
    assert (call_key("shell", left) == call_key("shell", right)) is same
    assert (ledger_of(failing(3, left)).call_failures("shell", right) == 3) is same
    trip = check(LIMITS, [Seen("shell", left, OK)] * 5, Ledger(), "shell", right)
    assert (trip is not None and trip.kind is REPEAT) is same


def test_same_args_of_another_tool_are_another_call() -> None:
    assert check(LIMITS, RUNS, ledger_of(failing(3, LS)), "read_file", LS) is None


# -- Property: failures(name) is the tool's failure streak, capped by the ledger ----------

TOOLS = ("shell", "read_file", "web")
ARGS = ('{"x": 1}', '{"x":1}', '{"x": 2}', "bad")
calls_st = st.lists(st.tuples(st.sampled_from(TOOLS), st.sampled_from(ARGS),
                              st.sampled_from(list(Outcome)),
                              st.none() | st.sampled_from(list(TripKind))), max_size=80)


def model(size: int, calls: list[tuple[str, str, Outcome, TripKind | None]]
          ) -> list[tuple[str, str]]:
    """The live failures as plain (tool, canonical args): a success clears its tool's, and
    only the newest `size` are kept."""
    live: list[tuple[str, str]] = []
    for name, args, outcome, trip in calls:
        if trip is not None:
            continue
        if outcome is OK:
            live = [f for f in live if f[0] != name]
        elif outcome is ERR:
            live = [*live, call_key(name, args)][-size:]
    return live


def streak(name: str, calls: list[tuple[str, str, Outcome, TripKind | None]]) -> int:
    """ERROR outcomes of the tool after its last OK (skips excluded)."""
    count = 0
    for tool, _, outcome, trip in calls:
        if tool == name and trip is None:
            count = 0 if outcome is OK else count + (outcome is ERR)
    return count


@settings(max_examples=300, deadline=None)
@given(st.integers(1, 12), calls_st)
def test_failures_are_the_streak_capped_by_the_ledger(
    size: int, calls: list[tuple[str, str, Outcome, TripKind | None]]
) -> None:
    ledger = Ledger(size)
    for name, args, outcome, trip in calls:
        ledger = ledger.record(name, args, outcome, trip)
    live = model(size, calls)
    uncapped = size >= sum(1 for _, _, o, t in calls if o is ERR and t is None)
    for name in TOOLS:
        assert ledger.failures(name) == sum(1 for f in live if f[0] == name)
        assert ledger.failures(name) <= min(streak(name, calls), size)
        if uncapped:
            assert ledger.failures(name) == streak(name, calls)
        for args in ARGS:
            assert ledger.call_failures(name, args) == live.count(call_key(name, args))
    assert sum(1 for e in ledger.entries if not e.warn) <= size
    plain = [(n, a, o) for n, a, o, t in calls if t is None]
    assert [e for e in ledger.entries if not e.warn] == [
        e for e in Ledger.replay(size, plain).entries if not e.warn]


@pytest.mark.parametrize("outcome", [OK, ERR, SKIP])
def test_a_call_skipped_by_a_breaker_counts_as_skipped_whatever_its_outcome(
    outcome: Outcome
) -> None:
    turn = [*RUNS[:4], Seen("shell", LS, outcome, REPEAT), Seen("shell", LS, outcome, SAME)]
    trip = check(LIMITS, turn, Ledger(), "shell", LS)
    assert trip is not None and trip.kind is LOOP
    assert check(LIMITS, turn[:5], Ledger(), "shell", LS) is None
