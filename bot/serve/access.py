"""Who may use Tandem: one access check, in the core, for every platform.

The hub asks `Access.check` before it looks at an inbound item at all (before dedupe,
before the store), so a stranger's message is never recorded and a stranger's button press
changes nothing. Adapters only translate platform ids into `User(id, name, team)` and show
the refusal text the hub returns.

Rules, per platform (`telegram`, `slack`):

* Ids are compared as strings (Telegram's numeric ids included); display names never count.
* Fail closed: an empty `allowed_users` lets nobody in, and so does a platform with no rules.
* Approvers are always allowed, whatever `allowed_users` says.
* `"*"` in `allowed_users` lets everyone in.
* On Slack, Tandem serves the bot's own workspace only: once the adapter has told it with
  `set_home_team`, a user whose team is known and differs is refused, whatever the lists
  say (`"*"` means this workspace's members; a listed id or an approver from another
  workspace is someone else). The adapter drops such payloads before they get here; this
  rule holds even so.
* The console platform (the local terminal user) is always allowed.
* A `Trigger` comes from the scheduler, not from a person: always allowed.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from bot.core.config import Config
from bot.core.events import Inbound, Trigger, User

log = logging.getLogger(__name__)

EVERYONE = "*"
"""In `allowed_users`: every user (on Slack, every member of the bot's workspace)."""
LOCAL_PLATFORMS = frozenset({"console"})
"""Platforms whose only user is whoever runs Tandem: always allowed."""
WORKSPACE_PLATFORMS = frozenset({"slack"})
"""Platforms where `"*"` stops at the bot's own workspace (`User.team`)."""
PLATFORM_NAMES = {"telegram": "Telegram", "slack": "Slack", "console": "console"}
LOGGED_STRANGERS = 10_000
"""Strangers remembered so each refusal is logged once (a flood does not fill the log)."""


@dataclass(frozen=True, slots=True)
class Rules:
    """One platform's lists, as strings."""

    allowed: frozenset[str]
    approvers: frozenset[str]
    everyone: bool


def _ids(values: Iterable[str | int]) -> frozenset[str]:
    return frozenset(s for s in (str(v).strip() for v in values) if s)


def _lists(config: Config, field: str) -> dict[str, Iterable[str | int]]:
    return {"telegram": getattr(config.telegram, field), "slack": getattr(config.slack, field)}


class Access:
    def __init__(self, config: Config | None = None, *,
                 allowed: Mapping[str, Iterable[str | int]] | None = None,
                 approvers: Mapping[str, Iterable[str | int]] | None = None,
                 local: Iterable[str] = LOCAL_PLATFORMS) -> None:
        """The lists of `config` (`telegram.*`, `slack.*`); `allowed` and `approvers` map a
        platform to its ids (ints or strings) and replace that platform's lists."""
        allowed = {**(_lists(config, "allowed_users") if config else {}), **(allowed or {})}
        approvers = {**(_lists(config, "approvers") if config else {}), **(approvers or {})}
        self._local = frozenset(local)
        self._rules: dict[str, Rules] = {}
        for platform in {*allowed, *approvers}:
            listed = _ids(allowed.get(platform, ()))
            self._rules[platform] = Rules(
                allowed=listed - {EVERYONE},
                approvers=_ids(approvers.get(platform, ())) - {EVERYONE},  # never a wildcard
                everyone=EVERYONE in listed)
        self._home: dict[str, str] = {}
        self._logged: OrderedDict[tuple[str, str], None] = OrderedDict()

    @classmethod
    def from_config(cls, config: Config) -> Access:
        return cls(config)

    def set_home_team(self, platform: str, team: str | None) -> None:
        """The bot's own workspace on `platform` (Slack's team id), once the adapter knows it."""
        if team:
            self._home[platform] = team
        else:
            self._home.pop(platform, None)

    # -- the rules ----------------------------------------------------------------------

    def allows(self, platform: str, user: User) -> bool:
        """`user` may use Tandem on `platform`."""
        if platform in self._local:
            return True
        rules = self._rules.get(platform)
        if rules is None or not user.id or not self._in_home(platform, user):
            return False
        return user.id in rules.allowed or user.id in rules.approvers or rules.everyone

    def is_approver(self, platform: str, user_id: str | int) -> bool:
        """`user_id` may decide anyone's approvals on `platform`."""
        rules = self._rules.get(platform)
        return rules is not None and str(user_id) in rules.approvers

    @property
    def approvers(self) -> dict[str, set[str]]:
        """Every platform's approver ids (a copy)."""
        return {platform: set(rules.approvers) for platform, rules in self._rules.items()}

    def nobody(self, platform: str) -> bool:
        """Nobody at all may use Tandem on `platform` (for a warning at start)."""
        if platform in self._local:
            return False
        rules = self._rules.get(platform)
        return rules is None or not (rules.allowed or rules.approvers or rules.everyone)

    def refusal(self, platform: str, user: User) -> str:
        """The plain text shown to a stranger: their id, and where an admin adds it."""
        name = PLATFORM_NAMES.get(platform, platform.capitalize())
        return (f"Sorry, you are not on Tandem's allowed list. Your {name} user id is "
                f"`{user.id}`; an admin can add it to {platform}.allowed_users.")

    def check(self, item: Inbound) -> str | None:
        """None when `item` may go on; else the refusal to show its sender."""
        if isinstance(item, Trigger):
            return None  # from the scheduler: its job was created by an allowed user
        platform, user = item.conv.platform, item.user
        if self.allows(platform, user):
            return None
        self._log_once(platform, user, type(item).__name__)
        return self.refusal(platform, user)

    # -- details ------------------------------------------------------------------------

    def _in_home(self, platform: str, user: User) -> bool:
        if platform not in WORKSPACE_PLATFORMS:
            return True
        home = self._home.get(platform)
        return home is None or not user.team or user.team == home

    def _log_once(self, platform: str, user: User, kind: str) -> None:
        key = (platform, user.id)
        if key in self._logged:
            return
        self._logged[key] = None
        while len(self._logged) > LOGGED_STRANGERS:
            self._logged.popitem(last=False)
        if not self._in_home(platform, user):
            why = f"from workspace {user.team}, not this bot's {self._home.get(platform)}"
        else:
            why = f"not in {platform}.allowed_users"
        log.info("access: refused a %s from %s user %s (%s); later refusals of this user "
                 "are not logged", kind, platform, user.id or "(no id)", why)


__all__ = ["EVERYONE", "Access"]
