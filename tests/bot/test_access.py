"""The one access check (`bot.serve.access`): the rules on both platforms, the config that feeds
them, and the hub refusing strangers before anything is recorded."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest

from bot.cli.cli import main as cli
from bot.core.config import Config, load_config
from bot.core.errors import ConfigError
from bot.core.events import (
    Cancel,
    Command,
    ConvKey,
    Decision,
    Inbound,
    Trigger,
    TurnEnded,
    User,
    UserMessage,
    Verdict,
)
from bot.serve.access import Access
from tests.conftest import Core
from tests.fakes.model_server import FakeModelServer, Reply

# Per platform: a listed id as the config holds it, the same id as the adapter passes it,
# another user's id, and a workspace for Slack's "*".
PLATFORMS: dict[str, dict[str, Any]] = {
    "telegram": {"listed": 42, "id": "42", "other": "77", "name": "Telegram"},
    "slack": {"listed": "U1", "id": "U1", "other": "U9", "name": "Slack"},
}
HOME, FOREIGN = "T1", "T-OTHER"


def access(platform: str, allowed: list[Any] | None = None,
           approvers: list[Any] | None = None, home: str | None = None) -> Access:
    rules = Access(allowed={platform: allowed or []}, approvers={platform: approvers or []})
    rules.set_home_team(platform, home)
    return rules


# (case, allowed_users, approvers, home team, user: (which id, display name, team), allowed?)
# "id" is the listed user, "other" someone else; names and teams are what a client sends.
CASES: list[tuple[str, list[str], list[str], str | None, tuple[str, str, str | None], bool]] = [
    ("empty list: nobody", [], [], None, ("id", "Ann", None), False),
    ("listed id", ["listed"], [], None, ("id", "Ann", None), True),
    ("unlisted id", ["listed"], [], None, ("other", "Eve", None), False),
    ("star: anyone", ["*"], [], None, ("other", "Eve", None), True),
    ("star, home team unknown", ["*"], [], None, ("other", "Eve", FOREIGN), True),
    ("star, user's team unknown", ["*"], [], HOME, ("other", "Eve", None), True),
    ("star, same team", ["*"], [], HOME, ("other", "Eve", HOME), True),
    ("listed, own team", ["listed"], [], HOME, ("id", "Ann", HOME), True),
    ("approver only", [], ["listed"], None, ("id", "Cat", None), True),
    ("approver only, someone else", [], ["listed"], None, ("other", "Eve", None), False),
    ("a name is not an id", ["listed"], [], None, ("other", "listed-name", None), False),
    ("the id counts, not the name", ["listed"], [], None, ("id", "Someone Else", None), True),
]


def _user(platform: str, spec: tuple[str, str, str | None]) -> User:
    which, name, team = spec
    ids = PLATFORMS[platform]
    listed_name = str(ids["id"])  # "listed-name": a stranger showing the allowed id as name
    return User(str(ids[which]), listed_name if name == "listed-name" else name, team)


@pytest.mark.parametrize("platform", PLATFORMS)
@pytest.mark.parametrize(("case", "allowed", "approvers", "home", "who", "expected"), CASES,
                         ids=[c[0] for c in CASES])
def test_the_rules(platform: str, case: str, allowed: list[str], approvers: list[str],
                   home: str | None, who: tuple[str, str, str | None], expected: bool) -> None:
    ids = PLATFORMS[platform]
    rules = access(platform, [ids["listed"] if a == "listed" else a for a in allowed],
                   [ids["listed"] for _ in approvers], home)
    user = _user(platform, who)
    assert rules.allows(platform, user) is expected, case
    item = UserMessage(ConvKey(platform, "c1"), user, "hi", ref="r1")
    assert (rules.check(item) is None) is expected, case


@pytest.mark.parametrize("platform", PLATFORMS)
def test_a_star_stops_at_the_workspace_on_slack_only(platform: str) -> None:
    rules = access(platform, ["*"], home=HOME)
    outsider = User(str(PLATFORMS[platform]["other"]), "Eve", FOREIGN)
    assert rules.allows(platform, outsider) is (platform == "telegram")
    rules.set_home_team(platform, None)  # forgotten: both must be known to compare
    assert rules.allows(platform, outsider)


@pytest.mark.parametrize("platform", PLATFORMS)
@pytest.mark.parametrize("listed_as", ["allowed", "approver"])
def test_a_listed_id_from_another_workspace_is_refused_on_slack(
        platform: str, listed_as: str, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="bot.serve.access")
    ids = PLATFORMS[platform]
    lists: dict[str, list[Any]] = {"allowed": ["*"], "approver": []}
    lists[listed_as].append(ids["listed"])
    rules = access(platform, lists["allowed"], lists["approver"], home=HOME)
    namesake = User(str(ids["id"]), "Ann", FOREIGN)  # the same id, another workspace's user
    assert rules.allows(platform, namesake) is (platform == "telegram")
    refused = rules.check(UserMessage(ConvKey(platform, "c1"), namesake, "hi"))
    assert (refused is None) is (platform == "telegram")
    assert rules.allows(platform, User(str(ids["id"]), "Ann", HOME))
    if platform == "slack":
        [line] = [r.getMessage() for r in caplog.records if r.name == "bot.serve.access"]
        assert f"from workspace {FOREIGN}, not this bot's {HOME}" in line


@pytest.mark.parametrize("platform", PLATFORMS)
def test_fails_closed(platform: str) -> None:
    nobody = User(str(PLATFORMS[platform]["id"]), "Ann")
    assert not Access().allows(platform, nobody)  # no rules for the platform at all
    assert Access().nobody(platform) and access(platform).nobody(platform)
    assert not access(platform, ["*"]).nobody(platform)
    assert not access(platform, approvers=[PLATFORMS[platform]["listed"]]).nobody(platform)
    assert not access(platform, ["*"]).allows(platform, User("", "no id"))
    assert not access(platform, ["*"]).allows("matrix", nobody)  # an unknown platform


def test_ids_compare_as_strings() -> None:
    rules = Access(allowed={"telegram": [42, " 43 "]}, approvers={"telegram": [44]})
    assert rules.allows("telegram", User("42")) and rules.allows("telegram", User("43"))
    assert rules.allows("telegram", User("44"))  # approvers are always allowed
    assert rules.is_approver("telegram", 44) and rules.is_approver("telegram", "44")
    assert not rules.is_approver("telegram", "42") and not rules.is_approver("slack", "44")
    assert not rules.allows("telegram", User("042"))
    assert rules.approvers == {"telegram": {"44"}}


def test_a_star_is_never_an_approver() -> None:
    rules = Access(allowed={"slack": []}, approvers={"slack": ["*"]})
    assert not rules.is_approver("slack", "U9") and not rules.allows("slack", User("U9"))
    assert not rules.is_approver("slack", "*")


@pytest.mark.parametrize("platform", PLATFORMS)
def test_the_refusal_names_the_id_and_the_key(platform: str) -> None:
    ids = PLATFORMS[platform]
    text = access(platform).refusal(platform, User(str(ids["other"]), "Eve"))
    assert text == (f"Sorry, you are not on Tandem's allowed list. Your {ids['name']} user id "
                    f"is `{ids['other']}`; an admin can add it to {platform}.allowed_users.")


@pytest.mark.parametrize("platform", PLATFORMS)
def test_check_covers_every_kind_of_inbound(platform: str) -> None:
    ids = PLATFORMS[platform]
    rules = access(platform, [ids["listed"]])
    conv = ConvKey(platform, "c1")

    def items(user: User) -> list[Inbound]:
        return [UserMessage(conv, user, "hi"), Command(conv, user, "status"),
                Cancel(conv, user), Decision(conv, user, "a1", Verdict.APPROVE)]

    for item in items(User(str(ids["id"]), "Ann")):
        assert rules.check(item) is None
    stranger = User(str(ids["other"]), "Eve")
    for item in items(stranger):
        assert rules.check(item) == rules.refusal(platform, stranger)
    # the scheduler's runs carry no person: their job was made by an allowed user
    assert rules.check(Trigger(conv, "job1", "report", requester="77")) is None


def test_the_console_is_always_allowed() -> None:
    rules = Access()
    me = User("alice", "alice")
    assert rules.allows("console", me) and not rules.nobody("console")
    assert rules.check(UserMessage(ConvKey("console", "alice"), me, "hi")) is None
    assert not rules.is_approver("console", "alice")  # deciding others' calls: not implied


def test_built_from_the_config(tmp_path: Path) -> None:
    config = Config.model_validate({
        "telegram": {"allowed_users": [42, "43"], "approvers": ["44"]},
        "slack": {"allowed_users": ["*"], "approvers": ["U7"]}})
    rules = Access(config)
    assert config.telegram.allowed_users == [42, 43] and config.telegram.approvers == [44]
    assert rules.allows("telegram", User("43")) and rules.is_approver("telegram", "44")
    assert not rules.allows("telegram", User("45"))
    assert rules.allows("slack", User("U5")) and rules.is_approver("slack", "U7")
    assert Access.from_config(config).approvers == rules.approvers


def test_each_refused_user_is_logged_once(caplog: pytest.LogCaptureFixture) -> None:
    rules = access("slack", ["U1"])
    caplog.set_level(logging.INFO, logger="bot.serve.access")
    for _ in range(3):
        rules.check(UserMessage(ConvKey("slack", "D9"), User("U9", "Eve"), "secret text"))
    rules.check(UserMessage(ConvKey("slack", "D8"), User("U8", "Mallory"), "more"))
    lines = [r.getMessage() for r in caplog.records if r.name == "bot.serve.access"]
    assert len(lines) == 2 and "U9" in lines[0] and "slack.allowed_users" in lines[0]
    assert not any("secret text" in line for line in lines)


# ---- the config ------------------------------------------------------------------------


def _write(tmp: Path, text: str) -> str:
    path = tmp / "config.yaml"
    path.write_text(text)
    return str(path)


def test_telegram_takes_ids_as_numbers_or_digits_and_a_star(tmp_path: Path) -> None:
    config = load_config(_write(tmp_path, "telegram:\n  allowed_users: [1, '2', '*']\n"
                                          "  approvers: ['3']\n"), environ={})
    assert config.telegram.allowed_users == [1, 2, "*"] and config.telegram.approvers == [3]
    env = {"TANDEM_TELEGRAM__ALLOWED_USERS": '["*"]'}
    assert load_config(_write(tmp_path, ""), environ=env).telegram.allowed_users == ["*"]


@pytest.mark.parametrize(("text", "key"), [
    ("telegram:\n  allowed_users: [ann]\n", "telegram.allowed_users.0"),
    ("telegram:\n  allowed_users: [1, -100555]\n", "telegram.allowed_users.1"),
    ("telegram:\n  allowed_users: [true]\n", "telegram.allowed_users.0"),
    ("telegram:\n  approvers: ['*']\n", "telegram.approvers.0"),
    ("slack:\n  allowed_users: ['']\n", "slack.allowed_users.0"),
    ("slack:\n  approvers: ['*']\n", "slack.approvers.0"),
])
def test_a_bad_id_names_its_key(tmp_path: Path, text: str, key: str) -> None:
    with pytest.raises(ConfigError) as err:
        load_config(_write(tmp_path, text), environ={})
    assert err.value.key == key


def test_a_bad_id_exits_2_with_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    path = _write(tmp_path, "telegram:\n  allowed_users: ['@ann']\n")
    assert cli(["--config", path, "doctor"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "telegram.allowed_users.0" in err


# ---- the hub -------------------------------------------------------------------------


TG = ConvKey("telegram", "42")
ANN, EVE = User("42", "Ann"), User("77", "Eve")


async def test_a_strangers_message_is_refused_before_it_is_recorded(
        model: FakeModelServer, config_factory: Any) -> None:
    model.script(Reply(text="Hello Ann."))
    async with Core(config_factory(telegram__allowed_users=[42])) as core:
        core.dispatch.sinks["telegram"] = core.sink
        refused = await core.hub.submit(UserMessage(TG, EVE, "hi", ref="tg:1"))
        assert not refused.accepted and refused.note == core.hub.access.refusal("telegram", EVE)
        assert not (await core.hub.cancel(Cancel(TG, EVE))).accepted
        assert not (await core.hub.submit(Cancel(TG, EVE, ref="tg:2"))).accepted
        # the same refs are still new: nothing of the stranger's was recorded
        assert (await core.hub.submit(UserMessage(TG, ANN, "hi", ref="tg:1"))).accepted
        ended = await core.sink.ended()
        assert (await core.hub.submit(Command(TG, ANN, "status", ref="tg:2"))).accepted
        await core.hub.idle()
    assert ended[0].text == "Hello Ann." and len(model.requests) == 1
    assert isinstance(ended[0], TurnEnded)


async def test_a_strangers_press_is_refused_before_the_approval_is_looked_at(
        model: FakeModelServer, config_factory: Any) -> None:
    async with Core(config_factory(telegram__allowed_users=["*"],
                                   slack__allowed_users=["U1"])) as core:
        slack = ConvKey("slack", "C1")
        receipt = await core.hub.submit(Decision(slack, User("U9", "U1"), "nope", Verdict.APPROVE,
                                                 ref="slack:C1:1"))
        assert not receipt.accepted and receipt.note is not None and "`U9`" in receipt.note
        known = await core.hub.submit(Decision(slack, User("U1"), "nope", Verdict.APPROVE,
                                               ref="slack:C1:1"))
        assert not known.accepted and known.note is not None and "unknown" in known.note
        anyone = await core.hub.submit(Decision(TG, EVE, "nope", Verdict.APPROVE))
        assert anyone.note is not None and "unknown" in anyone.note  # "*": past the check
    assert model.requests == []
