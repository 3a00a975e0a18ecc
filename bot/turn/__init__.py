"""The turn as one state machine: its state, the next action, and pure transitions.

`next_action` reads a `TurnState` and says what to do; every other function here is a
transition: it takes the state and what happened (a model step, a policy verdict, a
result, a human's press, an expiry, a cancel, a supersede, a scheduled run, a restart)
and returns a `Step`: the new state and the effects to carry out. Nothing here does
I/O. The runner carries out the effects, storing first and emitting second, then
keeps the new state.

A tool call moves PENDING → (ASKING →) ALLOWED → SUBMITTED → FINISHED, or straight to
FINISHED when it is refused, skipped, denied, expired or interrupted. SUBMITTED means
the call was handed to the tool (a subprocess, a server): after a restart nobody knows
whether it completed, so only SUBMITTED calls become "interrupted" then; PENDING,
ASKING and ALLOWED calls of a suspended turn stay as they are.

The package holds the rest of a turn too: `runner` (carries out the effects),
`streaming`, `prompt` and `persona` (the request and its system prompt), `context` and
`compaction` (what fits the window), `breakers`, `policy` and `taint` (the gate before a
tool runs), `conversation` and `conversations` (a conversation in memory), `memory` (where
`remember` notes live) and `budget` (what a turn asks of the daily budgets).

Layer: below `bot.serve`, above `bot.tools`. It may import `bot.tools`, `bot.media`,
`bot.llm`, `bot.store` and `bot.core`; never `bot.serve`, `bot.ops`, `bot.run` or
`bot.cli` (the budgets come in through `budget.Budget`, injected by `bot.run.app`).
"""

from bot.turn.state import (
    Action,
    AddRule,
    Ask,
    CallRecord,
    Close,
    Decide,
    Effect,
    Exit,
    ExitReason,
    Finish,
    Reason,
    Resolve,
    Run,
    SetCall,
    Step,
    Suspend,
    Tell,
    TurnState,
    next_action,
)
from bot.turn.transitions import (
    Allow,
    AskHuman,
    Press,
    Refuse,
    Verdict,
    cancel_waiting,
    decide,
    end_open_calls,
    exit_turn,
    expire,
    final_text,
    finish,
    human_decision,
    model_step,
    restart,
    submitted,
    supersede,
    trigger_arrives,
)

__all__ = [
    "Action", "AddRule", "Allow", "Ask", "AskHuman", "CallRecord", "Close", "Decide", "Effect",
    "Exit", "ExitReason", "Finish", "Press", "Reason", "Refuse", "Resolve", "Run", "SetCall",
    "Step", "Suspend", "Tell", "TurnState", "Verdict", "cancel_waiting", "decide",
    "end_open_calls", "exit_turn", "expire", "final_text", "finish", "human_decision",
    "model_step", "next_action", "restart", "submitted", "supersede", "trigger_arrives",
]
