"""After a stop: load a conversation and repair it, and replay what was received.

A turn that was running when Tandem stopped has its unfinished calls finished as
`interrupted` (with a result message), and the user is told. Inbound messages and
triggers are recorded before they are processed; one that never reached its turn is
rebuilt from its record and processed at the next start.
"""

from __future__ import annotations

import json
import logging
from dataclasses import asdict

from bot.conversation import Conversation
from bot.events import ConvKey, Inbound, Trigger, User, UserMessage
from bot.history import CallState, Outcome
from bot.loop import CallRecord, TurnState
from bot.runner import Runner
from bot.store.sqlite import SQLiteStore

log = logging.getLogger(__name__)


async def load_conversation(store: SQLiteStore, runner: Runner, key: ConvKey,
                            max_steps: int) -> Conversation:
    """Load and repair: calls a crash left unfinished become FINISHED(interrupted)."""
    row = await store.conversation(key)
    conv = Conversation.load(row, await store.history(row.id, row.session))
    last = await store.last_turn(row.id, row.session)
    if last is None or last.status == "done":
        conv.trim_to(runner.budget())
        return conv
    records = [CallRecord(call=c.call, state=c.state, outcome=c.outcome)
               for c in await store.turn_calls(row.id, last.turn)]
    state = TurnState(turn=last.turn, steps=last.steps, max_steps=max_steps,
                      calls=records, unattended=last.unattended, requester=last.requester)
    conv.turn = state
    interrupted = []
    for record in records:
        if record.state in (CallState.FINISHED, CallState.ASKING):
            continue
        await runner.finish(conv, state, record, Outcome.INTERRUPTED,
                                 "interrupted: Tandem stopped while this call was pending "
                                 "or running; it may or may not have completed")
        interrupted.append(record.call.name)
    if last.status == "running":
        asking = any(r.state is CallState.ASKING for r in records)
        await store.end_turn(row.id, last.turn, "suspended" if asking else "done",
                             None if asking else "interrupted")
        if not asking:
            conv.turn = None
        what = f" (`{'`, `'.join(interrupted)}` was interrupted)" if interrupted else ""
        conv.notices.append(f"An earlier answer here was interrupted{what}. "
                            "Send your message again if you still need the answer.")
    conv.trim_to(runner.budget())
    return conv


def encode_inbound(item: Inbound) -> tuple[str, str]:
    match item:
        case UserMessage():
            return "message", json.dumps({"conv": asdict(item.conv), "user": asdict(item.user),
                                          "text": item.text, "context": item.context})
        case Trigger():
            return "trigger", json.dumps({"conv": asdict(item.conv), "job_id": item.job_id,
                                          "prompt": item.prompt, "late": item.late,
                                          "requester": item.requester})
        case _:
            return type(item).__name__.lower(), "{}"


def replay(kind: str, payload: str, ref: str) -> Inbound | None:
    """Rebuild an inbound recorded before a crash (only messages and triggers replay)."""
    try:
        data = json.loads(payload)
        conv = ConvKey(**data["conv"])
        if kind == "message":
            return UserMessage(conv, User(**data["user"]), data["text"], ref=ref,
                               context=data.get("context"))
        if kind == "trigger":
            return Trigger(conv, data["job_id"], data["prompt"], data["late"], ref=ref,
                           requester=data.get("requester", ""))
    except (ValueError, KeyError, TypeError):
        log.warning("could not replay inbound %s", ref)
    return None
