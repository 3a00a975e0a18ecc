"""What a conversation's recent turns used: tokens, the prompt cache's share, cost.

Each model call's usage is added to its turn (`Recent.add`); the last `RECENT_TURNS` turns
are kept in memory for `/status` (the hit ratio: input tokens read from the cache, of all
input tokens), and a turn's totals are told to the watchers when it ends (`TurnUsage`:
the audit log). Cached tokens are part of the prompt tokens, as litellm reports them.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field

from bot.core.events import ConvKey
from bot.core.watch import TurnUsage
from bot.llm import Completion

RECENT_TURNS = 10


@dataclass(slots=True)
class Spent:
    """The usage of one turn's model calls."""

    calls: int = 0
    prompt: int = 0
    completion: int = 0
    cache_read: int = 0
    cache_write: int = 0
    cost: float = 0.0
    model: str = ""
    """The model that answered last."""

    @classmethod
    def of(cls, completion: Completion) -> Spent:
        """One model call's usage (its tokens are unknown when the provider sent none)."""
        return cls(1, completion.prompt_tokens or 0, completion.completion_tokens or 0,
                   completion.cache_read, completion.cache_write, completion.cost,
                   completion.model)

    def told(self, conv: ConvKey, requester: str) -> TurnUsage:
        return TurnUsage(conv, requester, self.model, self.calls, self.prompt,
                         self.completion, self.cache_read, self.cache_write, self.cost)

    def add(self, other: Spent) -> None:
        self.calls += other.calls
        self.prompt += other.prompt
        self.completion += other.completion
        self.cache_read += other.cache_read
        self.cache_write += other.cache_write
        self.cost += other.cost
        self.model = other.model or self.model


@dataclass(slots=True)
class Recent:
    """The usage of a conversation's last turns, by turn number."""

    turns: OrderedDict[int, Spent] = field(default_factory=OrderedDict)

    def add(self, turn: int, spent: Spent) -> None:
        kept = self.turns.setdefault(turn, Spent())
        kept.add(spent)
        while len(self.turns) > RECENT_TURNS:
            self.turns.popitem(last=False)

    def of(self, turn: int) -> Spent | None:
        return self.turns.get(turn)

    def total(self) -> Spent:
        out = Spent()
        for spent in self.turns.values():
            out.add(spent)
        return out

    def status(self) -> str | None:
        """The `/status` line: the cache's hit ratio over the last turns (None: no call)."""
        total = self.total()
        if not total.calls or not total.prompt:
            return None
        share = 100 * total.cache_read // total.prompt
        written = f", {total.cache_write:,} written to it" if total.cache_write else ""
        turns = len(self.turns)
        return (f"Prompt cache, last {turns} turn{'s' if turns != 1 else ''}: {share}% of "
                f"input tokens read from the cache ({total.cache_read:,} of "
                f"{total.prompt:,}){written}")
