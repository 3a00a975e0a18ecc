"""The approval policy: what a tool call may do before any human is involved.

Per tool `allow | ask | deny` (config over the tool's default), standing "always"
rules for the exact command or path in a conversation, and unattended runs (nobody
to ask: denied unless configured to ask). The breakers run before this, in
`bot.turn.decide`.
"""

from __future__ import annotations

from bot import turn as t
from bot.config import Config
from bot.errors import ToolError
from bot.history import Outcome, ToolCall
from bot.store import Store, new_id
from bot.tools import Registry, parse_arguments


async def verdict(config: Config, tools: Registry, store: Store, conv_id: int,
                  call: ToolCall, *, unattended: bool) -> t.Verdict:
    tool = tools.get(call.name)
    if tool is None:
        return t.Refuse(Outcome.ERROR, f"error: there is no tool named `{call.name}`; "
                        f"available: {', '.join(tools.names())}")
    try:
        args = parse_arguments(call.arguments)
    except ToolError as exc:
        return t.Refuse(Outcome.ERROR, f"error: {exc}")
    approvals = config.approvals
    policy = approvals.tools.get(call.name, tool.policy)
    if policy == "deny":
        return t.Refuse(Outcome.DENIED,
                        f"denied: the `{call.name}` tool is disabled by Tandem's policy")
    if policy == "allow" or await store.has_rule(conv_id, call.name, tool.rule_key(args)):
        return t.Allow()
    if unattended and approvals.unattended == "deny":
        return t.Refuse(Outcome.DENIED, "denied: this is a scheduled run and nobody is there "
                        f"to approve `{call.name}`; tell the user what you would have run")
    return t.AskHuman(tool.summary(args), new_id(), approvals.expire_after_s)
