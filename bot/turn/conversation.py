"""One conversation in memory: its history, the trim cut, and the current turn.

Token estimates are cached per message and the kept total is kept up to date, so a
turn costs O(new messages) rather than O(history).
"""

from __future__ import annotations

from bisect import bisect_left
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from bot.core.history import Msg
from bot.store import ConvRow
from bot.turn import TurnState
from bot.turn.breakers import Ledger
from bot.turn.compaction import safe_cut
from bot.turn.context import sanitize, trim
from bot.turn.usage import Recent


@dataclass(kw_only=True, slots=True)
class Conversation:
    row: ConvRow
    history: list[Msg] = field(default_factory=list)
    """The messages of the current session in memory, oldest first: the window, and what
    was trimmed but not summarized yet (`release` forgets the rest; the store keeps it)."""
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
    ledger: Ledger = field(default_factory=Ledger)
    """Recent tool failures of this session (the circuit breakers' memory)."""
    summary: str | None = None
    """The model's summary of the turns trimmed away (with `context.summary`)."""
    summary_through: int = 0
    """Id of the last message the summary covers."""
    released_turns: int = 0
    """Turns trimmed away and forgotten from memory (`release`)."""
    unread: set[str] = field(default_factory=set)
    """Calls that finished without running (denied, expired, skipped, interrupted): their
    results are Tandem's own words, so they hold nothing read from outside."""
    model: str | None = None
    """The model this conversation switched to (`/model`; None: `llm.model`)."""
    answered_by: str = ""
    """The model that gave the last answer (a fallback, in an outage)."""
    told: set[tuple[str, int]] = field(default_factory=set)
    """Outages of models (model, outage number) this chat was told of."""
    usage: Recent = field(default_factory=Recent)
    """Tokens, cached tokens and cost of the last turns (`/status`)."""
    _prefix: _Prefix = field(default_factory=lambda: _Prefix())
    """Sanitized wire messages of the finished turns in view (extended, never redone)."""

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

    def trim_to(self, budget: int, low: int | None = None) -> bool:
        """When the estimated tokens of what is kept exceed `budget`, drop whole turns,
        oldest first, never the current one, until they fit `low` (the low-water mark,
        default `budget`). True if anything was dropped."""
        before = self.cut
        if self.kept <= budget:
            return False
        low = budget if low is None else min(low, budget)
        self.cut, self.kept = trim(self.history, self.starts, self.cut, self.kept, low)
        if self.cut != before and self.starts:  # no kept result may lose its call
            safe = min(safe_cut(self.history, self.starts, self.cut), self.starts[-1])
            if safe > self.cut:
                self.kept -= sum(m.tokens for m in self.history[self.cut:safe])
                self.cut = safe
        self._prefix.drop_before(self.cut)
        return self.cut != before

    def skip_summarized(self) -> None:
        """Move the cut past the turns the stored summary already covers."""
        start = self.cut
        for i in self.starts:
            if i >= len(self.history) or (self.history[i].id or 0) > self.summary_through:
                start = max(start, i)
                break
        else:
            start = self.starts[-1] if self.starts else 0
        if start > self.cut:
            self.kept -= sum(m.tokens for m in self.history[self.cut:start])
            self.cut = start
            self._prefix.drop_before(start)

    @property
    def dropped_turns(self) -> int:
        return self.released_turns + bisect_left(self.starts, self.cut)

    def release(self, *, summarized_only: bool) -> int:
        """Forget the messages trimmed away (they stay in the store), so that memory holds
        what a turn needs rather than the whole session. With `summarized_only`, those
        the summary does not cover yet are kept for it. Returns how many went."""
        end = self.cut
        if summarized_only:
            end = min(end, next((i for i, m in enumerate(self.history[:end])
                                 if (m.id or 0) > self.summary_through), end))
        first = bisect_left(self.starts, end)
        end = self.starts[first] if first < len(self.starts) else end  # whole turns only
        if end <= 0 or end > self.cut:
            return 0
        del self.history[:end]
        self.released_turns += first
        self.starts = [i - end for i in self.starts[first:]]
        self.cut -= end
        self._prefix.shift(end)
        return end

    def window(self) -> list[Msg]:
        return self.history[self.cut :]

    def wire_window(self) -> list[dict[str, Any]]:
        """The sanitized window as wire dicts (`wire_parts`, joined)."""
        finished, current = self.wire_parts()
        return finished + current

    def wire_parts(self) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        """The sanitized window as wire dicts: the finished turns, and the current one.

        A finished turn starts with a user message, which closes every earlier call, so
        sanitizing turn by turn gives the same result as sanitizing the whole window
        (call ids are unique in a session). Finished turns are sanitized once and
        reused; only the current turn is sanitized on every call.
        """
        if not self.starts:
            return [], []
        current = self.starts[-1]
        prefix = self._prefix
        if prefix.start != self.cut or prefix.end > current:
            prefix.reset(self.cut)
        if prefix.end < current:  # turns finished since: sanitize each one once
            i = bisect_left(self.starts, prefix.end)
            for start, end in zip(self.starts[i:], self.starts[i + 1 :], strict=False):
                prefix.add(start, end, [m.wire() for m in sanitize(self.history[start:end])])
        return list(prefix.wire), [m.wire() for m in sanitize(self.history[current:])]

    def switch(self, model: str | None) -> None:
        """Use `model` from the next request on; the whole window is sanitized again."""
        self.model = model
        self._prefix.reset(self.cut)

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


@dataclass(slots=True)
class _Prefix:
    """The finished turns in view, already sanitized, as one list of wire dicts."""

    start: int = 0
    end: int = 0
    wire: list[dict[str, Any]] = field(default_factory=list)
    turns: deque[tuple[int, int]] = field(default_factory=deque)
    """(start index, number of wire dicts) of each turn in `wire`."""

    def reset(self, start: int) -> None:
        self.start = self.end = start
        self.wire = []
        self.turns.clear()

    def add(self, start: int, end: int, chunk: list[dict[str, Any]]) -> None:
        self.wire.extend(chunk)
        self.turns.append((start, len(chunk)))
        self.end = end

    def shift(self, by: int) -> None:
        """The first `by` messages of the history went (all before `start`)."""
        self.start -= by
        self.end -= by
        self.turns = deque((start - by, n) for start, n in self.turns)

    def drop_before(self, cut: int) -> None:
        """The cut moved forward (whole turns): forget the turns before it."""
        if cut <= self.start:
            return
        if cut > self.end:
            self.reset(cut)
            return
        dropped = 0
        while self.turns and self.turns[0][0] < cut:
            dropped += self.turns.popleft()[1]
        del self.wire[:dropped]
        self.start = cut
