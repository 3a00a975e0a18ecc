"""Rules on a call's arguments (`approvals.rules`, then Tandem's read-only defaults).

A rule applies to a call when its `tool` glob matches the tool's name and its `users`
(if any) include the person whose turn made the call. Its `match` is a glob on the
call's canonical argument, or a regex (`re:…`, matched whole):

* `shell`: every part of the command (`bot.turn.shell_parse`): each simple command as its
  words joined by single spaces, each file redirection as `>file`;
* a file tool (one whose argument is a `path`): the path resolved (symlinks followed)
  relative to the workspace (`src/app.py`); a path outside it is never allowed by a rule;
* any other tool (MCP tools included): its JSON arguments, keys sorted, compact
  (`{"query":"x"}`), or the one argument its card shows (`web_fetch`: the URL).

Deny wins: a deny rule that matches any part, or the whole argument, denies the call. Else
an ask rule that matches asks. Else the call is allowed only when every part is covered
by an allow rule or a read-only default, and the parse is exact. Otherwise the rules say
nothing and the tool's policy decides (`bot.turn.policy`).
"""

from __future__ import annotations

import fnmatch
import glob
import re
import time
from collections.abc import Callable, Container, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bot.core.approvals_config import REGEX_PREFIX, ApprovalRule, ApprovalsConfig, RuleVerdict
from bot.core.config import Config
from bot.tools import Tool
from bot.turn.shell_parse import Part, parse
from bot.turn.state import AddRule

SHELL = "shell"
PATH_KEY = "path"


@dataclass(frozen=True, slots=True)
class Subject:
    """What the rules look at in one call."""

    parts: tuple[Part, ...]
    """Each must be covered for an allow."""
    whole: str
    """The canonical argument as one string (deny and ask rules see it too)."""
    allowable: bool
    """False: no rule can allow this call (an inexact parse, a path outside)."""


def protected(config: Config) -> frozenset[Path]:
    """Files no read-only default may touch (besides every `.env`)."""
    paths = [Path(config.store.path), Path(config.persona.dir) / "RULES.md",
             Path("config.yaml")]
    if config.source:
        paths.append(Path(config.source))
    db = Path(config.store.path)
    paths += [db.with_name(db.name + "-wal"), db.with_name(db.name + "-shm")]
    return frozenset(p.resolve() for p in paths)


def subject(tool: Tool, args: dict[str, Any], workspace: Path) -> Subject:
    if tool.name == SHELL and isinstance(args.get("command"), str):
        command = args["command"]
        parsed = parse(command)
        return Subject(parsed.parts, command, parsed.exact and bool(parsed.parts))
    raw = args.get(PATH_KEY)
    if tool.summary_key == PATH_KEY and isinstance(raw, str):
        root = workspace.resolve()
        target = (root / raw).resolve() if "\x00" not in raw else root.parent
        inside = target == root or root in target.parents
        text = target.relative_to(root).as_posix() if inside else str(target)
        return Subject((Part(text),), text, inside)
    key = tool.rule_key(args)
    return Subject((Part(key),), key, True)


def _matches(rule: ApprovalRule, text: str) -> bool:
    if rule.match.startswith(REGEX_PREFIX):
        return re.fullmatch(rule.match[len(REGEX_PREFIX):], text, re.DOTALL) is not None
    return fnmatch.fnmatchcase(text, rule.match)


def applicable(rules: Sequence[ApprovalRule], tool: str, user: str) -> list[ApprovalRule]:
    return [r for r in rules if fnmatch.fnmatchcase(tool, r.tool)
            and (not r.users or user in r.users)]


def evaluate(rules: Sequence[ApprovalRule], tool: Tool, args: dict[str, Any], user: str,
             workspace: Path, default: Callable[[Part], bool] | None = None
             ) -> RuleVerdict | None:
    """The rules' verdict on one call, or None when they say nothing. `default` tells
    whether a part is covered by a read-only default."""
    found = applicable(rules, tool.name, user)
    if not found and default is None:
        return None
    subj = subject(tool, args, workspace)
    texts = [*(p.text for p in subj.parts), subj.whole]
    for verdict in ("deny", "ask"):
        if any(r.verdict == verdict and _matches(r, text) for r in found for text in texts):
            return verdict
    allows = [r for r in found if r.verdict == "allow"]
    if subj.allowable and all(any(_matches(r, p.text) for r in allows)
                              or (default is not None and default(p)) for p in subj.parts):
        return "allow"
    return None


def scope(approvals: ApprovalsConfig, rule: AddRule, requester: str,
          session: int) -> dict[str, Any]:
    """How a human's "this conversation" or "always" is stored: who made it, for whom
    (`always_scope: user`: the person whose turn asked), for which session and until
    when (`always_for`)."""
    lasts = approvals.always_for_s
    return {"author": rule.by.id if rule.by else "",
            "author_name": rule.by.name if rule.by else "",
            "user": requester if approvals.always_scope == "user" else "",
            "session": session if rule.session else None,
            "expires_at": time.time() + lasts if lasts and not rule.session else None}


# -- the read-only defaults ------------------------------------------------------------

_LS_OPTION = re.compile(r"-[1aAbBcCdFghiklmnopqrRsStuUvxXZ]+|--(all|almost-all|"
                        r"human-readable|classify|reverse|recursive|size|directory|inode|"
                        r"numeric-uid-gid|group-directories-first|color(=(auto|never|always))?"
                        r"|sort=\w+|time-style=[\w+%-]+|full-time)")
_CAT_OPTION = re.compile(r"-[AbeEnstTuv]+|--(number|number-nonblank|show-all|show-ends|"
                         r"show-tabs|show-nonprinting|squeeze-blank)")
_STATUS_OPTION = re.compile(r"-[sbvz]+|-u(no|normal|all)?|--(short|branch|long|verbose|"
                            r"porcelain(=v[12])?|untracked-files(=(no|normal|all))?|ignored|"
                            r"show-stash|ahead-behind|no-ahead-behind|no-renames|column|"
                            r"no-column)")
_DIFF_OPTION = re.compile(r"-[pRwbM]+|-U\d+|--(stat|cached|staged|name-only|name-status|"
                          r"numstat|shortstat|summary|check|patch|minimal|patience|histogram|"
                          r"ignore-space-change|ignore-all-space|no-ext-diff|no-textconv|"
                          r"word-diff|color|no-color|find-renames|relative|exit-code|quiet|"
                          r"unified=\d+|diff-filter=[ACDMRTUXB]+)")
READ_ONLY: dict[tuple[str, ...], re.Pattern[str]] = {
    ("ls",): _LS_OPTION, ("cat",): _CAT_OPTION, ("git", "status"): _STATUS_OPTION,
    ("git", "diff"): _DIFF_OPTION}
"""The read-only commands allowed by default, with the options each may take; every
other argument must be a path inside the workspace."""


def _confined(word: str, root: Path, shielded: Container[Path]) -> bool:
    """`word`, as the shell passes it, names only paths inside the workspace (none
    protected): no `~`, no brace list, and a glob's every match checked."""
    if word.startswith("~") or "=~" in word or ":~" in word or "\x00" in word:
        return False
    if "{" in word and ("," in word or ".." in word):
        return False
    names = [word]
    if glob.has_magic(word):
        names = glob.glob(word, root_dir=root) or names
    for name in names:
        target = (root / name).resolve()
        if not (target == root or root in target.parents) or target in shielded \
                or target.name == ".env":
            return False
    return True


def read_only_inside(workspace: Path, shielded: Container[Path]) -> Callable[[Part], bool]:
    """Whether a part of a shell command is one of the `READ_ONLY` commands, with allowed
    options and paths inside `workspace` only."""
    root = workspace.resolve()

    def check(part: Part) -> bool:
        words = part.words
        program = next((p for p in READ_ONLY if words[:len(p)] == p), None)
        if program is None:
            return False
        options, rest = READ_ONLY[program], list(words[len(program):])
        only_paths = False
        for word in rest:
            if word == "--" and not only_paths:
                only_paths = True
            elif word.startswith("-") and not only_paths:
                if options.fullmatch(word) is None:
                    return False
            elif not _confined(word, root, shielded):
                return False
        return True

    return check
