"""Refused strangers in the audit log: at most one entry per sender every `EVERY_S`.

A stranger can message Tandem as fast as the platform lets them, and each message is
refused; without a limit each would add an audit entry. The first refusal of a sender
makes an entry; later ones within `EVERY_S` are counted, and the sender's next entry says
how many were left out. The metrics still count every one (`tandem_refusals_total`).
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, replace

from bot.core import watch as w

EVERY_S = 600.0
REMEMBERED = 10_000
"""Senders remembered (the longest quiet is forgotten first: it gets an entry again)."""


@dataclass(slots=True)
class _Sender:
    last: float
    left_out: int = 0


class Strangers:
    def __init__(self) -> None:
        self._seen: OrderedDict[tuple[str, str], _Sender] = OrderedDict()

    def entry(self, fact: w.Refused, at: float) -> w.Refused | None:
        """The fact to write for this refusal (saying how many were left out before it),
        or None: this sender had an entry less than `EVERY_S` ago."""
        if fact.what != "access":
            return fact  # a press that could not count: an allowed user's, each one told
        key = (fact.platform, fact.user)
        sender = self._seen.get(key)
        if sender is not None and at - sender.last < EVERY_S:
            sender.left_out += 1
            return None
        left_out = sender.left_out if sender is not None else 0
        self._seen[key] = _Sender(at)
        self._seen.move_to_end(key)
        while len(self._seen) > REMEMBERED:
            self._seen.popitem(last=False)
        if left_out:
            return replace(fact, why=f"{fact.why} ({left_out} more refusals of this sender "
                                     "since the last entry)")
        return fact


__all__ = ["EVERY_S", "Strangers"]
