"""The approval policy: what a tool call may do before any human is involved.

Per tool `allow | ask | deny` (config over the tool's default), standing "always"
rules for the exact command or path in a conversation, unattended runs (nobody to ask:
denied unless configured to ask), and the taint rule (`bot.turn.taint`): while the model can
see untrusted content, a call that writes lasting state or sends data out asks a human
whatever its policy, and an unattended run never makes one without a standing rule.
A file tool reaching into another conversation's uploads (or the folder of them all) asks
too, as one chat's memory never reaches another's.
The breakers run before this, in `bot.turn.decide`.
"""

from __future__ import annotations

from collections.abc import Container
from pathlib import Path
from typing import Any

from bot import turn as t
from bot.core.config import Config
from bot.core.errors import ToolError
from bot.core.events import ConvKey
from bot.core.history import Msg, Outcome, ToolCall
from bot.media import foreign
from bot.store import Store, new_id
from bot.tools import Registry, Tool, parse_arguments, sandbox
from bot.turn import rules, taint


async def verdict(config: Config, tools: Registry, store: Store, conv_id: int,
                  call: ToolCall, *, unattended: bool, window: list[Msg] | None = None,
                  turn: int = 0, unread: Container[str] = frozenset(),
                  conv: ConvKey | None = None, user: str = "",
                  session: int = 0) -> t.Verdict:
    """`window` is what the model sees (for the taint rule), `turn` the current one,
    `unread` the calls that finished without running, and `conv` the conversation (whose
    own folders of uploads a file tool may read without asking); `user` is whose turn it
    is and `session` the conversation's (for rules limited to some people, or to one
    session)."""
    tool = tools.get(call.name)
    if tool is None:
        return t.Refuse(Outcome.ERROR, f"error: there is no tool named `{call.name}`; "
                        f"available: {', '.join(tools.names())}")
    try:
        args = parse_arguments(call.arguments)
    except ToolError as exc:
        return t.Refuse(Outcome.ERROR, f"error: {exc}")
    approvals = config.approvals
    policy = _policy(config, tool, args, user)
    if isinstance(policy, t.Refuse):
        return policy
    # `sandboxed`: allow in the shell's sandbox without the network, ask otherwise
    policy = sandbox.policy(policy, tool.name, config.tools.shell, args)
    if await store.has_rule(conv_id, call.name, tool.rule_key(args), session=session,
                            user=user):
        return t.Allow()  # a human allowed this exact call here for good
    workspace = Path(config.workspace.dir)
    raw = args.get(tool.reads) if tool.reads else None
    elsewhere = foreign(raw, conv, workspace) if conv and isinstance(raw, str) else None
    if elsewhere is not None:
        if unattended:
            return t.Refuse(Outcome.DENIED, f"denied: {elsewhere}, and in a scheduled run "
                            f"nobody is there to approve `{call.name}`")
        return t.AskHuman(tool.summary(args), new_id(), approvals.expire_after_s,
                          f"Asked because {elsewhere}.")
    found = (taint.taint(window, tools, unread, workspace)
             if window and (tool.lasting or tool.reaches) else None)
    if found is not None and taint.needs_human(window or [], turn, tool, args, found):
        if unattended:
            return t.Refuse(Outcome.DENIED, f"denied: {found.reason()}, and in a scheduled run "
                            f"nobody is there to approve `{call.name}`; tell the user what "
                            "you would have done")
        return t.AskHuman(tool.summary(args), new_id(), approvals.expire_after_s,
                          f"Asked because {found.reason()}.")
    if policy == "allow":
        return t.Allow()
    if unattended and approvals.unattended == "deny":
        return t.Refuse(Outcome.DENIED, "denied: this is a scheduled run and nobody is there "
                        f"to approve `{call.name}`; tell the user what you would have run")
    return t.AskHuman(tool.summary(args), new_id(), approvals.expire_after_s)


def _policy(config: Config, tool: Tool, args: dict[str, Any], user: str) -> str | t.Refuse:
    """The tool's policy (config over its default), unless a rule on these arguments
    (`approvals.rules`, then for the shell the read-only defaults: `bot.turn.rules`)
    speaks over it; a deny of either is a refusal."""
    approvals = config.approvals
    policy = approvals.tools.get(tool.name, tool.policy)
    if policy == "deny":
        return t.Refuse(Outcome.DENIED,
                        f"denied: the `{tool.name}` tool is disabled by Tandem's policy")
    workspace = Path(config.workspace.dir)
    default = (rules.read_only_inside(workspace, rules.protected(config))
               if approvals.default_rules and tool.name == rules.SHELL else None)
    ruled = rules.evaluate(approvals.rules, tool, args, user, workspace, default)
    if ruled == "deny":
        return t.Refuse(Outcome.DENIED, f"denied: Tandem's rules do not allow this "
                        f"`{tool.name}` call; do not retry it")
    return ruled or policy
