"""One conversation in memory: its history, the trim cut, and the current turn.

Token estimates are cached per message and the kept total is kept up to date, so a
turn costs O(new messages) rather than O(history).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from bot.context import trim
from bot.history import Msg
from bot.loop import TurnState
from bot.store import ConvRow


@dataclass(kw_only=True, slots=True)
class Conversation:
    row: ConvRow
    history: list[Msg] = field(default_factory=list)
    """Every message of the current session, oldest first."""
    starts: list[int] = field(default_factory=list)
    """Index of each turn's first message."""
    cut: int = 0
    """Messages before this index are trimmed away (whole turns only)."""
    kept: int = 0
    """Estimated tokens of history[cut:]."""
    turn: TurnState | None = None
    last_turn: int = 0
    calibration: float = 1.0
    """Provider tokens per estimated token, learned from real usage."""
    call_ids: set[str] = field(default_factory=set)
    notices: list[str] = field(default_factory=list)
    """Things to tell the user the next time they hear from Tandem (after a restart)."""

    @classmethod
    def load(cls, row: ConvRow, history: list[Msg]) -> Conversation:
        conv = cls(row=row)
        for msg in history:
            conv.append(msg)
        return conv

    def append(self, msg: Msg) -> None:
        if not self.history or msg.turn != self.history[-1].turn:
            self.starts.append(len(self.history))
            self.last_turn = max(self.last_turn, msg.turn)
        self.history.append(msg)
        self.kept += msg.tokens
        self.call_ids.update(c.id for c in msg.tool_calls)

    def trim_to(self, budget: int) -> int:
        """Drop whole turns, oldest first, never the current one. Returns turns dropped."""
        scaled = int(budget / self.calibration)
        before = self.cut
        self.cut, self.kept = trim(self.history, self.starts, self.cut, self.kept, scaled)
        return sum(1 for s in self.starts if before <= s < self.cut)

    @property
    def dropped_turns(self) -> int:
        return sum(1 for s in self.starts if s < self.cut)

    def window(self) -> list[Msg]:
        return self.history[self.cut :]

    def calibrate(self, estimated: int, actual: int) -> None:
        if estimated > 0 and actual > 0:
            ratio = min(4.0, max(0.25, actual / estimated))
            self.calibration = 0.7 * self.calibration + 0.3 * ratio

    def unique_call_id(self, call_id: str) -> str:
        """Providers sometimes reuse ids like `call_0`; ids must be unique in a history."""
        candidate, n = call_id or "call", 1
        while candidate in self.call_ids:
            n += 1
            candidate = f"{call_id}_{n}"
        return candidate
