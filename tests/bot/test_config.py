"""Configuration: YAML, ${ENV} interpolation, TANDEM_* overrides, .env, clear errors."""

from __future__ import annotations

from pathlib import Path

import pytest

from bot.core.config import load_config, require
from bot.core.errors import ConfigError


def write(tmp: Path, text: str) -> str:
    path = tmp / "config.yaml"
    path.write_text(text)
    return str(path)


def test_defaults_without_a_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    config = load_config(None, environ={})
    assert config.store.path == "data/tandem.db"
    assert (config.limits.breakers.same_call, config.limits.breakers.tool_failures_fatal) == (5, 8)
    assert config.approvals.expire_after_s == 1800 and config.telegram.allowed_users == []


def test_interpolation_and_environment_overrides(tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MY_KEY", "sk-from-env")
    path = write(tmp_path, "llm:\n  api_key: ${MY_KEY}\n  model: ${MODEL:-openai/x}\n")
    env = {"TANDEM_LLM__API_BASE": "http://127.0.0.1:9/v1", "TANDEM_LIMITS__MAX_STEPS": "7",
           "TANDEM_TELEGRAM__ALLOWED_USERS": "[1, 2]",
           "TANDEM_LIMITS__BREAKERS__SAME_CALL": "9"}
    config = load_config(path, environ=env)
    assert config.llm.api_key == "sk-from-env" and config.llm.model == "openai/x"
    assert config.llm.api_base == "http://127.0.0.1:9/v1" and config.limits.max_steps == 7
    assert config.telegram.allowed_users == [1, 2]
    assert config.limits.breakers.same_call == 9


def test_a_dotenv_file_fills_missing_variables(tmp_path: Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("DOTENV_SECRET", raising=False)
    (tmp_path / ".env").write_text("# secrets\nDOTENV_SECRET='xoxb-123456'\n")
    path = write(tmp_path, "slack:\n  bot_token: ${DOTENV_SECRET}\n")
    assert load_config(path).slack.bot_token == "xoxb-123456"


@pytest.mark.parametrize(("text", "telegram", "slack"), [
    ('telegram: {allowed_users: "*"}\nslack: {allowed_users: "*"}\n', ["*"], ["*"]),
    ("telegram: {allowed_users: 42}\nslack: {allowed_users: U1}\n", [42], ["U1"]),
    ('telegram: {allowed_users: "42, 43"}\nslack: {allowed_users: "U1,U2"}\n', [42, 43],
     ["U1", "U2"]),
])
def test_one_user_or_a_star_needs_no_list(tmp_path: Path, text: str, telegram: list[object],
                                          slack: list[str]) -> None:
    config = load_config(write(tmp_path, text), environ={})
    assert (config.telegram.allowed_users, config.slack.allowed_users) == (telegram, slack)
    env = {"TANDEM_SLACK__APPROVERS": "U7, U8", "TANDEM_TELEGRAM__APPROVERS": "7"}
    config = load_config(write(tmp_path, text), environ=env)
    assert (config.telegram.approvers, config.slack.approvers) == ([7], ["U7", "U8"])


@pytest.mark.parametrize(("text", "key"), [
    ("llm:\n  timeout_s: soon\n", "llm.timeout_s"),
    ("llm:\n  modle: x\n", "llm.modle"),
    ("approvals:\n  tools:\n    shell: maybe\n", "approvals.tools.shell"),
    ("limits:\n  max_steps: 0\n", "limits.max_steps"),
    ("telegram:\n  token: ${NOT_SET_ANYWHERE}\n", "telegram.token"),
])
def test_bad_values_name_their_key(tmp_path: Path, text: str, key: str) -> None:
    with pytest.raises(ConfigError) as err:
        load_config(write(tmp_path, text), environ={})
    assert err.value.key == key


def test_a_missing_file_given_explicitly_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="does not exist"):
        load_config(str(tmp_path / "nope.yaml"))


def test_require_names_a_missing_secret(tmp_path: Path) -> None:
    config = load_config(write(tmp_path, "telegram:\n  enabled: true\n"), environ={})
    with pytest.raises(ConfigError, match="telegram.token"):
        require(config, "telegram.token")


@pytest.mark.parametrize("file", ["../secrets.md", "/etc/passwd", "' '"])
def test_a_persona_overlay_must_be_a_file_inside_the_persona_folder(tmp_path: Path,
                                                                    file: str) -> None:
    path = write(tmp_path, f"persona:\n  places:\n    'telegram:-1': {file}\n")
    with pytest.raises(ConfigError, match="persona.places.telegram:-1: .*must be a file "
                                          "inside persona.dir"):
        load_config(path, environ={})
    path = write(tmp_path, "persona:\n  places:\n    'telegram:-1': chats/a.md\n")
    assert load_config(path, environ={}).persona.places == {"telegram:-1": "chats/a.md"}
