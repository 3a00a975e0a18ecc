"""Circuit breakers against tool loops, as a pure check over this turn's calls.

| trigger                                   | action                     | fatal |
| same tool + same args called N times      | skip: "already returned"   | no    |
| same tool + same args fails N in a row    | skip                       | no    |
| same tool fails N in a row, any args      | skip and warn the model    | no    |
| same tool fails N in a row, any args      | end the turn               | yes   |

Skipped calls count as failures of their tool (the model insisted on a failing tool),
so the warning tier leads to the fatal one. A success resets the failure counts.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass

from bot.config import Breakers
from bot.history import Outcome
from bot.loop import CallRecord


@dataclass(frozen=True, slots=True)
class Trip:
    message: str
    fatal: bool = False


def call_key(name: str, arguments: str) -> tuple[str, str]:
    """Canonical (tool, args) so `{"a":1,"b":2}` and `{"b": 2, "a": 1}` match."""
    try:
        canon = json.dumps(json.loads(arguments), sort_keys=True, separators=(",", ":"))
    except (ValueError, TypeError):
        canon = arguments.strip()
    return name, canon


def _trailing_failures(outcomes: Sequence[Outcome]) -> int:
    count = 0
    for outcome in reversed(outcomes):
        if outcome is Outcome.OK:
            break
        if outcome.failed:
            count += 1
    return count


def check(
    limits: Breakers, history: Sequence[CallRecord], name: str, arguments: str
) -> Trip | None:
    """Whether a new call may run, given this turn's earlier finished calls (newest last)."""
    ledger = [(r.call, r.outcome) for r in history if r.outcome is not None]
    ledger = ledger[-limits.ledger_size :]
    key = call_key(name, arguments)
    same = [o for c, o in ledger if call_key(c.name, c.arguments) == key]
    tool_failures = _trailing_failures([o for c, o in ledger if c.name == name])
    if tool_failures >= limits.tool_failures_fatal:
        return Trip(
            f"`{name}` failed or was refused as a repeat {tool_failures} times in a row, so "
            "Tandem stopped this turn. Please try another way.",
            fatal=True,
        )
    if sum(1 for o in same if o is not Outcome.SKIPPED) >= limits.same_call:
        return Trip(
            f"skipped: this exact `{name}` call already ran {limits.same_call} times in this "
            "turn and its result was returned earlier. Use that result or try something else."
        )
    if _trailing_failures(same) >= limits.same_call_failures:
        return Trip(
            f"skipped: this exact `{name}` call failed {limits.same_call_failures} times in a "
            "row. Change the arguments or the approach."
        )
    if tool_failures >= limits.tool_failures_warn:
        return Trip(
            f"skipped: `{name}` failed {tool_failures} times in a row. Stop using it for now "
            "and tell the user what is going wrong."
        )
    return None
