"""Configuration of approvals: per-tool policies, rules on a call's arguments, how long
and for whom an "always" holds, and where approvers are reached. `bot.core.config`
assembles this into `Config`; the matching itself is `bot.turn.rules`."""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

from pydantic import BeforeValidator, Field, field_validator
from pydantic_core import PydanticCustomError

from bot.core.sections import Policy, Section

RuleVerdict = Literal["allow", "ask", "deny"]
REGEX_PREFIX = "re:"
"""A rule's `match` that starts with this is a regular expression (matched whole)."""
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}
_DURATION = re.compile(r"^\s*(\d+)\s*([smhdw])\s*$")


def duration_s(text: str) -> int:
    """Seconds in `30d`, `12h`, `90m`, `45s` or `2w`; ValueError otherwise."""
    found = _DURATION.match(text)
    if found is None or int(found.group(1)) <= 0:
        raise ValueError(f"not a duration like 30d, 12h or 90m: {text!r}")
    return int(found.group(1)) * _UNITS[found.group(2)]


def _duration(value: Any) -> Any:
    if value is None or value == "" or (isinstance(value, str) and value.strip() == "never"):
        return None
    if isinstance(value, int) and not isinstance(value, bool) and value > 0:
        return f"{value}s"
    if isinstance(value, str):
        try:
            duration_s(value)
        except ValueError:
            pass
        else:
            return value.strip()
    raise PydanticCustomError("duration", "must be a duration like 30d, 12h or 90m, or "
                              "never, not {value}", {"value": repr(value)[:40]})


def _ids(value: Any) -> Any:
    if isinstance(value, (str, int)) and not isinstance(value, bool):
        value = [value]
    if isinstance(value, list):
        return [str(v).strip() for v in value if str(v).strip()]
    return value


class ApprovalRule(Section):
    """One rule: `verdict` for calls of `tool` whose canonical argument matches `match`."""

    tool: str
    """A tool name, or a glob on tool names (`shell`, `read_file`, `tracker__*`)."""
    match: str = "*"
    """A glob on the canonical argument (`git log*`), or a regex written `re:…`."""
    verdict: RuleVerdict
    users: Annotated[list[str], BeforeValidator(_ids)] = Field(default_factory=list)
    """Only for calls these people's turns make (user ids); empty: everyone."""

    @field_validator("match")
    @classmethod
    def _compiles(cls, value: str) -> str:
        if value.startswith(REGEX_PREFIX):
            try:
                re.compile(value[len(REGEX_PREFIX):])
            except re.error as exc:
                raise PydanticCustomError("regex", "not a valid regular expression: {why}",
                                          {"why": str(exc)}) from None
        return value


class ApprovalsConfig(Section):
    tools: dict[str, Policy] = Field(default_factory=dict)
    expire_after_s: int = Field(default=1800, ge=1)
    unattended: Literal["deny", "ask"] = "deny"
    rules: list[ApprovalRule] = Field(default_factory=list)
    """Ordered; every rule that matches counts and the strictest verdict wins."""
    default_rules: bool = True
    """Tandem's read-only shell rules (`ls`, `cat`, `git status`, `git diff` inside the
    workspace: README, Approvals) apply after `rules`."""
    always_for: Annotated[str | None, BeforeValidator(_duration)] = None
    """How long an "always" holds (`30d`); None: until revoked."""
    always_scope: Literal["chat", "user"] = "chat"
    """An "always" holds for everyone in the chat, or only for the person who made it."""

    @property
    def always_for_s(self) -> int | None:
        return duration_s(self.always_for) if self.always_for else None
