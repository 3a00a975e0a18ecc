"""What `tandem init` writes: `config.yaml`, which names each secret as a `${VAR}`
reference, and `.env` beside it, which holds them (`bot.core.config` reads it at start). Both
are private to the user (0600) from the moment they exist."""

from __future__ import annotations

import contextlib
import json
import os
import re
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from secrets import token_urlsafe
from typing import Literal

from pydantic import ValidationError

from bot.core.config import LLMConfig, SlackConfig, TelegramConfig

SLACK_MEMBER = re.compile(r"[UW][A-Z0-9]+")
"""A Slack member id as Slack shows it (profile → ⋮ → Copy member ID)."""


@dataclass(kw_only=True, slots=True)
class TelegramAnswers:
    token: str
    base_url: str = TelegramConfig().base_url
    allowed_users: list[int | str] = field(default_factory=list)
    approvers: list[int | str] = field(default_factory=list)
    webhook_secret: str = field(default_factory=lambda: token_urlsafe(32))
    """For webhook mode (`telegram.webhook.secret_token`): 43 random characters, made
    here, never asked for."""


@dataclass(kw_only=True, slots=True)
class SlackAnswers:
    mode: Literal["socket", "http"] = "socket"
    bot_token: str
    app_token: str = ""
    """Socket Mode only."""
    signing_secret: str = ""
    """HTTP mode only."""
    base_url: str = SlackConfig().base_url
    allowed_users: list[int | str] = field(default_factory=list)
    approvers: list[int | str] = field(default_factory=list)


@dataclass(kw_only=True, slots=True)
class Answers:
    """Everything `tandem init` asks; an empty string is a question left unanswered."""

    model: str = LLMConfig().model
    api_key: str = ""
    """Empty: litellm reads the provider's own variable (OPENAI_API_KEY, say)."""
    api_base: str = ""
    telegram: TelegramAnswers | None = None
    slack: SlackAnswers | None = None


def secrets(answers: Answers) -> dict[str, str]:
    """The variables `.env` holds, by name: every secret given."""
    tg, slack = answers.telegram, answers.slack
    found = {"LLM_API_KEY": answers.api_key,
             "TELEGRAM_BOT_TOKEN": tg.token if tg else "",
             "TELEGRAM_WEBHOOK_SECRET": tg.webhook_secret if tg else "",
             "SLACK_BOT_TOKEN": slack.bot_token if slack else "",
             "SLACK_APP_TOKEN": slack.app_token if slack and slack.mode == "socket" else "",
             "SLACK_SIGNING_SECRET": slack.signing_secret if slack and slack.mode == "http"
             else ""}
    return {name: value for name, value in found.items() if value}


def _yaml(value: object) -> str:
    return json.dumps(value, ensure_ascii=False)  # JSON scalars and lists are YAML


def render_config(answers: Answers) -> str:
    """config.yaml: what differs from the defaults, and each secret as `${VAR}`."""
    held = secrets(answers)
    lines = ["# Tandem's configuration, written by `tandem init`. config.example.yaml has",
             "# every key with its default; the secrets are in .env beside this file.", "",
             "llm:", f"  model: {_yaml(answers.model)}   # any litellm model name"]
    if "LLM_API_KEY" in held:
        lines.append('  api_key: "${LLM_API_KEY}"')
    if answers.api_base:
        lines.append(f"  api_base: {_yaml(answers.api_base)}")
    access = ['  # who may talk ("*": everyone) and who may approve anyone\'s risky tool calls',
              "  # (the person who asked always may); message the bot to learn an id"]
    if tg := answers.telegram:
        lines += ["", "telegram:", "  enabled: true", '  token: "${TELEGRAM_BOT_TOKEN}"']
        if tg.base_url != TelegramConfig().base_url:
            lines.append(f"  base_url: {_yaml(tg.base_url)}")
        lines += [*access, f"  allowed_users: {_yaml(tg.allowed_users)}",
                  f"  approvers: {_yaml(tg.approvers)}",
                  "  # webhook mode (several workers): add `mode: webhook` and `webhook.url`",
                  "  webhook:", '    secret_token: "${TELEGRAM_WEBHOOK_SECRET}"']
    if slack := answers.slack:
        lines += ["", "slack:", "  enabled: true", f"  mode: {slack.mode}",
                  '  bot_token: "${SLACK_BOT_TOKEN}"']
        lines.append('  app_token: "${SLACK_APP_TOKEN}"' if slack.mode == "socket"
                     else '  signing_secret: "${SLACK_SIGNING_SECRET}"')
        if slack.base_url != SlackConfig().base_url:
            lines.append(f"  base_url: {_yaml(slack.base_url)}")
        lines += [*access, f"  allowed_users: {_yaml(slack.allowed_users)}",
                  f"  approvers: {_yaml(slack.approvers)}"]
    return "\n".join(lines) + "\n"


def render_env(answers: Answers) -> str:
    lines = ["# Secrets for config.yaml, written by `tandem init`. Keep this file private:",
             "# a variable set in the environment wins over its line here."]
    return "\n".join([*lines, *(f"{k}={v}" for k, v in secrets(answers).items())]) + "\n"


def written(path: Path, name: str) -> str | None:
    """The value `.env` at `path` gives `name`, if it exists and does."""
    if not path.is_file():
        return None
    for line in path.read_text(encoding="utf-8").splitlines():
        key, equals, value = line.partition("=")
        if equals and key.strip() == name and value.strip():
            return value.strip()
    return None


def write_private(path: Path, text: str) -> None:
    """Write `path`, readable by this user only (0600) from its first byte: a new file
    beside it, renamed over it, so an existing one is replaced whole and never widened."""
    fd, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as out:
            out.write(text)
        os.replace(temporary, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(temporary)
        raise


def parse_ids(text: str, platform: str, key: str) -> list[int | str]:
    """The user ids in `text` (commas or spaces between them) as `<platform>.<key>`
    takes them; ValueError saying which one is not an id."""
    parts = [part for part in re.split(r"[\s,]+", text.strip()) if part]
    section = TelegramConfig if platform == "telegram" else SlackConfig
    try:
        ids: list[int | str] = list(getattr(section.model_validate({key: parts}), key))
    except ValidationError as exc:
        raise ValueError(f"{platform}.{key} {exc.errors()[0]['msg']}") from None
    odd = [i for i in ids if platform == "slack" and i != "*" and
           not SLACK_MEMBER.fullmatch(str(i))]
    if odd:
        raise ValueError(f"{odd[0]} is not a Slack member id (those look like U012AB3CD: "
                         "a profile's ⋮ menu → Copy member ID)")
    return ids
