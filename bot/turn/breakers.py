"""Circuit breakers against tool loops, as pure functions over values.

Thresholds come from `bot.core.config.Breakers` (defaults in brackets):

| trigger                            | counts                         | action        | fatal |
|------------------------------------|--------------------------------|---------------|-------|
| same tool + same args called       | executions in this turn, any   | skip: "result | no    |
| `same_call` [5] times in this turn | outcome (skipped ones do not   | already       |       |
|                                    | count)                         | returned"     |       |
| same tool + same args fails        | failures of that exact call    | skip          | no    |
| `same_call_failures` [3] times in  | since the tool's last success  |               |       |
| a row                              | (session ledger)               |               |       |
| same tool fails                    | failures of that tool since    | skip + warn   | no    |
| `tool_failures_warn` [6] times in  | its last success (session      | the model,    |       |
| a row, any args                    | ledger)                        | once a streak |       |
| same tool fails                    | the same                       | end the turn  | yes   |
| `tool_failures_fatal` [8] times in |                                |               |       |
| a row, any args                    |                                |               |       |
| the model repeats a call after     | skip results of that call in   | end the turn, | yes   |
| `ignored_skips` [2] skip results   | this turn                      | with          |       |
| for that same call in this turn    |                                | loop_message  |       |

Rules:

- "Same call" means the same tool and the same canonical arguments (`call_key`).
- Failure counts live in the session's `Ledger` (the last `ledger_size` failures); the
  per-turn counts come from the turn's finished calls (`Seen`).
- Only `Outcome.ERROR` is a failure. `Outcome.OK` resets the tool's failure streak (all
  arguments). DENIED, EXPIRED and INTERRUPTED neither count nor reset.
- A skipped call is never a failure: it does not add to any failure count, so repeating a
  skipped call can never reach the fatal tier (it reaches the loop breaker instead).
- The warning fires once a streak: the ledger keeps a marker, and the next call of that
  tool runs normally. A success drops the marker with the streak.
- `check` runs before a call, in this order: loop → fatal (in case `after_failure` was
  missed) → warn → same-call failures → same call. `after_failure` runs right after a
  failure is recorded, so the fatal tier ends the turn before another model request.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from enum import StrEnum

from bot.core.config import Breakers
from bot.core.history import Outcome


class TripKind(StrEnum):
    REPEAT = "repeat"
    SAME_FAILING = "same_failing"
    WARN = "warn"
    FATAL = "fatal"
    LOOP = "loop"


@dataclass(frozen=True, slots=True)
class Trip:
    kind: TripKind
    message: str

    @property
    def fatal(self) -> bool:
        """Whether the turn ends (otherwise only this call is skipped)."""
        return self.kind in (TripKind.FATAL, TripKind.LOOP)


@dataclass(frozen=True, slots=True)
class Seen:
    """A finished call of this turn."""

    name: str
    arguments: str
    outcome: Outcome
    skipped_by: TripKind | None = None

    @property
    def skipped(self) -> bool:
        return self.skipped_by is not None or self.outcome is Outcome.SKIPPED


def call_key(name: str, arguments: str) -> tuple[str, str]:
    """Canonical (tool, args) so `{"a":1,"b":2}` and `{"b": 2, "a": 1}` match."""
    try:
        canon = json.dumps(json.loads(arguments), sort_keys=True, separators=(",", ":"))
    except (ValueError, TypeError):
        canon = arguments.strip()
    return name, canon


@dataclass(frozen=True, slots=True)
class Entry:
    """A failure of a call (`warn=False`) or the marker of a warning given for a tool."""

    name: str
    arguments: str
    """Canonical (see `call_key`)."""
    warn: bool = False


@dataclass(frozen=True, slots=True)
class Ledger:
    """The session's last `size` failures (and warn markers), oldest first; immutable.

    Every entry of a tool is newer than that tool's last success: a success drops them.
    """

    size: int = 50
    entries: tuple[Entry, ...] = ()

    def record(
        self, name: str, arguments: str, outcome: Outcome, trip: TripKind | None = None
    ) -> Ledger:
        """The ledger after a finished call; `trip` is the breaker that skipped it, if any."""
        if trip is TripKind.WARN:
            return self._with(Entry(name, call_key(name, arguments)[1], warn=True))
        if trip is not None:
            return self
        if outcome is Outcome.OK:
            kept = tuple(e for e in self.entries if e.name != name)
            return self if len(kept) == len(self.entries) else Ledger(self.size, kept)
        if outcome is Outcome.ERROR:
            return self._with(Entry(name, call_key(name, arguments)[1]))
        return self

    def forgive(self, streak: int) -> Ledger:
        """A person asking again gets another try: streaks of `streak` failures or more,
        which would block a tool, go."""
        ledger = self
        for name in {e.name for e in self.entries}:
            if ledger.failures(name) >= streak:
                ledger = ledger.record(name, "{}", Outcome.OK)
        return ledger

    def _with(self, entry: Entry) -> Ledger:
        """Append, then drop everything older than the oldest of the last `size` failures."""
        entries = (*self.entries, entry)
        failures = 0
        for index in range(len(entries) - 1, -1, -1):
            if not entries[index].warn:
                failures += 1
                if failures > self.size:
                    entries = entries[index + 1 :]
                    break
        return Ledger(self.size, entries)

    def failures(self, name: str) -> int:
        """Failures of the tool since its last success."""
        return sum(1 for e in self.entries if e.name == name and not e.warn)

    def call_failures(self, name: str, arguments: str) -> int:
        """Failures of this exact call (canonical arguments) since the tool's last success."""
        canon = call_key(name, arguments)[1]
        return sum(1 for e in self.entries if e.name == name and e.arguments == canon
                   and not e.warn)

    def warned(self, name: str) -> bool:
        """Whether the model was already warned about the tool's current failure streak."""
        return any(e.warn and e.name == name for e in self.entries)

    @classmethod
    def replay(cls, size: int, calls: Iterable[tuple[str, str, Outcome]]) -> Ledger:
        """Rebuild from a session's finished calls (oldest first) after a restart.

        The calls carry no trip, so warn markers are not rebuilt: a tool in the middle of
        a failure streak may be warned once more.
        """
        ledger = cls(size)
        for name, arguments, outcome in calls:
            ledger = ledger.record(name, arguments, outcome)
        return ledger


def _fatal(name: str, failures: int) -> Trip:
    return Trip(TripKind.FATAL, f"`{name}` failed {failures} times in a row, so Tandem "
                                "stopped this turn. Please try another way.")


def check(
    limits: Breakers, turn: Sequence[Seen], ledger: Ledger, name: str, arguments: str
) -> Trip | None:
    """Whether a new call may run, given this turn's finished calls and the session ledger."""
    key = call_key(name, arguments)
    same = [s for s in turn if call_key(s.name, s.arguments) == key]
    if sum(1 for s in same if s.skipped) >= limits.ignored_skips:
        return Trip(TripKind.LOOP, limits.loop_message.format(tool=name))
    failures = ledger.failures(name)
    if failures >= limits.tool_failures_fatal:
        return _fatal(name, failures)
    if failures >= limits.tool_failures_warn and not ledger.warned(name):
        return Trip(TripKind.WARN, f"skipped: `{name}` failed {failures} times in a row. "
                                   "Stop using it for now and tell the user what is going wrong.")
    call_failures = ledger.call_failures(name, arguments)
    if call_failures >= limits.same_call_failures:
        return Trip(TripKind.SAME_FAILING,
                    f"skipped: this exact `{name}` call failed {call_failures} times in a row. "
                    "Change the arguments or the approach.")
    runs = sum(1 for s in same if not s.skipped)
    if runs >= limits.same_call:
        return Trip(TripKind.REPEAT,
                    f"skipped: this exact `{name}` call already ran {runs} times in this turn "
                    "and its result was returned earlier. Use that result or try something else.")
    return None


def after_failure(limits: Breakers, ledger: Ledger, name: str) -> Trip | None:
    """Right after a failure of `name` was recorded: the fatal tier, which ends the turn."""
    failures = ledger.failures(name)
    return _fatal(name, failures) if failures >= limits.tool_failures_fatal else None
