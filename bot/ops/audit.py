"""The audit log: who asked for what, who decided, what ran, who was turned away.

`Audit` watches the core (`bot.core.watch`) and appends one entry per fact to the store: every
approval asked and decided (the exact call shown, the button pressed, or its expiry),
every tool run (its rendered arguments, outcome and duration), every refused access and
press, every standing rule added or revoked, every budget used up or lifted, every switch
of a conversation's model and the answers another model gave in an outage, and what each
turn's model calls used (tokens, those read from and written to the prompt cache, and
the cost as the provider prices them). The store
only ever appends (its table refuses updates), and entries older than `audit.keep_days`
are pruned with the first write after a start and then once a day. Texts are redacted
like everything else.

Entries are written off the turn's path: gathered, then appended together at most
`FLUSH_S` later (and when Tandem stops), so a turn does not wait for the audit log's
commit. A process killed outright loses at most that last fraction of a second.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Callable
from typing import Any

from bot.core import watch as w
from bot.core.errors import StoreError
from bot.core.redact import Redactor
from bot.ops.strangers import Strangers
from bot.store import AuditRow, Store

log = logging.getLogger(__name__)
DAY_S = 86_400.0
FLUSH_S = 0.5


AUDITED = frozenset({w.Asked, w.Decided, w.ToolRan, w.RuleChanged, w.Refused,
                     w.BudgetReached, w.BudgetLifted, w.FailedOver, w.ModelChosen,
                     w.TurnUsage})
"""The facts that make an entry (the rest are only counted, by the metrics)."""


def entry(fact: w.Fact, at: float) -> AuditRow | None:
    """The audit entry of a fact, or None for facts that are only counted."""
    match fact:
        case w.Asked(conv, approval_id, tool, call, requester, expires_at):
            return AuditRow(at, "asked", str(conv), requester, tool, _json(
                approval=approval_id, call=call, expires=AuditRow.iso(expires_at)))
        case w.Decided(conv, approval_id, tool, call, status, by, waited_s):
            return AuditRow(at, "decided", str(conv), by or "", tool, _json(
                approval=approval_id, call=call, status=status,
                button=status if by and status in ("approved", "denied", "always") else None,
                waited_s=round(waited_s, 1)))
        case w.ToolRan(conv, tool, call, outcome, seconds, requester):
            return AuditRow(at, "tool", str(conv), requester, tool, _json(
                call=call, outcome=outcome, seconds=round(seconds, 3)))
        case w.RuleChanged(conv, tool, key, change, by):
            return AuditRow(at, "rule", str(conv), by or "", tool, _json(change=change, key=key))
        case w.Refused(platform, user, what, why, conv):
            return AuditRow(at, "refused", str(conv) if conv else "", user, "", _json(
                what=what, platform=platform, why=why))
        case w.BudgetReached(conv, user, scope):
            return AuditRow(at, "budget", str(conv), user, "", _json(change="reached",
                                                                     scope=scope))
        case w.BudgetLifted(conv, scope, by):
            return AuditRow(at, "budget", str(conv), by, "", _json(change="lifted", scope=scope))
        case w.FailedOver(conv, model, unavailable):
            return AuditRow(at, "model", str(conv), "", "", _json(
                change="failover", answered=model, unavailable=list(unavailable)))
        case w.ModelChosen(conv, model, by):
            return AuditRow(at, "model", str(conv), by, "", _json(change="switched", model=model))
        case w.TurnUsage(conv, requester, model, calls, prompt, completion, read, written,
                         cost):
            return AuditRow(at, "usage", str(conv), requester, "", _json(
                model=model, calls=calls, prompt_tokens=prompt, completion_tokens=completion,
                cache_read=read, cache_write=written, cost=round(cost, 6)))
    return None


class Audit:
    """The watcher that keeps the audit log."""

    def __init__(self, store: Store, redact: Redactor, keep_days: int,
                 clock: Callable[[], float] = time.time) -> None:
        self.store = store
        self.redact = redact
        self.keep_s = keep_days * DAY_S
        self.clock = clock
        self._pruned = 0.0
        self.strangers = Strangers()
        self._facts: list[tuple[w.Fact, float]] = []
        self._flusher: asyncio.Task[None] | None = None

    async def see(self, fact: w.Fact) -> None:
        if type(fact) not in AUDITED:
            return
        if isinstance(fact, w.Refused):
            kept = self.strangers.entry(fact, self.clock())  # one entry per sender a while
            if kept is None:
                return
            fact = kept
        self._facts.append((fact, self.clock()))
        if self._flusher is None or self._flusher.done():
            self._flusher = asyncio.get_running_loop().create_task(self._later())

    async def _later(self) -> None:
        await asyncio.sleep(FLUSH_S)
        await self.flush()

    async def flush(self) -> None:
        """Append what was gathered (and prune, once a day)."""
        facts, self._facts = self._facts, []
        rows = [self._row(fact, at) for fact, at in facts]
        if rows:
            try:
                await self.store.append_audit(rows)
            except StoreError as exc:
                log.error("audit: could not write %d entries: %s", len(rows), exc)
        if rows and self.clock() - self._pruned >= DAY_S:
            await self.prune()

    def _row(self, fact: w.Fact, at: float) -> AuditRow:
        row = entry(fact, at)
        assert row is not None
        detail = self.redact(row.detail)
        if detail == row.detail:
            return row
        return AuditRow(row.at, row.kind, row.conv, row.actor, row.tool, detail)

    async def close(self) -> None:
        """Write what is gathered; called before the store closes."""
        if self._flusher is not None and not self._flusher.done():
            self._flusher.cancel()
            await asyncio.gather(self._flusher, return_exceptions=True)
        await self.flush()

    async def prune(self) -> int:
        """Delete what is older than `audit.keep_days`; how many entries went."""
        self._pruned = self.clock()
        gone = await self.store.prune_audit(self._pruned - self.keep_s)
        if gone:
            log.info("audit: pruned %d entries older than %d days", gone,
                     int(self.keep_s // DAY_S))
        return gone


def _json(**fields: Any) -> str:
    return json.dumps({k: v for k, v in fields.items() if v is not None}, ensure_ascii=False)
