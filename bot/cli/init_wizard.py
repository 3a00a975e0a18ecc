"""`tandem init`: set Tandem up by answering a few questions, or from flags in a script.

It asks which platforms, the model and its key, each platform's tokens (checked live
with the platform, as `tandem run` would: a token the platform refuses is asked for
again) and who may talk and approve; writes `config.yaml` and `.env` (`bot.cli.init_files`);
then runs `tandem doctor` on them. An existing file is replaced only after a yes (or
`--force`). Secrets are read without echo on a terminal and never printed.

Every question has a flag; a question whose flag is given is not asked. With
`--non-interactive` nothing is asked (`Script`): a missing answer takes its default, or
stops with one line naming the flag, and secrets may come from the environment instead
(`LLM_API_KEY`, `TELEGRAM_BOT_TOKEN`, `SLACK_BOT_TOKEN`, `SLACK_APP_TOKEN`,
`SLACK_SIGNING_SECRET`), out of the shell's history.

Exit status: 0 written and the doctor passed; 1 the doctor found a problem, or nothing
was written (a file kept, a service that could not be reached); 2 a flag missing or
wrong, or a token the platform refused, in a script; 130 stopped, nothing written.
"""

from __future__ import annotations

import argparse
import asyncio
import getpass
import importlib
import os
import shlex
import subprocess
import sys
import textwrap
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, TypeVar, cast

from bot.cli.init_files import (
    Answers,
    SlackAnswers,
    TelegramAnswers,
    parse_ids,
    render_config,
    render_env,
    secrets,
    write_private,
    written,
)
from bot.core.config import SlackConfig, TelegramConfig

T = TypeVar("T")
Token = tuple[str, str]
"""A token and what its platform said of it ("@tandem_bot"; empty when unchecked)."""
PLATFORMS = {"1": "telegram", "2": "slack", "3": "both"}
WIDTH = 88
ACCESS = ("Approvers may also approve other people's risky tool calls (whoever asked "
          "always may). Don't know an id? Leave it empty, start Tandem and message the bot: "
          "it answers someone it does not know with their id, for {key} in config.yaml.")


class Stopped(Exception):
    """Ctrl-D at a question."""


class InitFailed(Exception):
    """A script's answer that cannot be used: one line, and the exit status."""

    def __init__(self, status: int, text: str) -> None:
        super().__init__(text)
        self.status = status


class Unchecked(ValueError):
    """A token the platform could not be asked about (it did not answer); `kept` is the
    answer if the user keeps it anyway."""

    def __init__(self, text: str, kept: object) -> None:
        super().__init__(text)
        self.kept = kept


class Terminal:
    """Questions on stdout, answers from stdin; a secret is read without echo when stdin
    is a terminal. An answer that `parse` refuses (ValueError) is asked for again."""

    def say(self, text: str = "") -> None:
        """Prose is wrapped; an indented line (a command to copy) is not."""
        lines = (line if line.startswith(" ") else textwrap.fill(
            line, WIDTH, break_long_words=False, break_on_hyphens=False)
            for line in text.split("\n"))
        sys.stdout.write("\n".join(lines) + "\n")
        sys.stdout.flush()

    def explain(self, text: str) -> None:
        """What the next questions are about (a script has no use for it)."""
        self.say(text)

    def answer(self, question: str, parse: Callable[[str], T], *, given: str | None,
               flag: str, default: str = "", secret: bool = False) -> T:
        """`parse` of the flag's value `given`, else of what the user types."""
        text = given
        while True:
            if text is None:
                text = self._read(question, default, secret)
            try:
                return parse(text)
            except Unchecked as exc:
                self.say(f"{exc}.")
                if self.yes("Keep it anyway?"):
                    return cast(T, exc.kept)
            except ValueError as exc:
                self.say(f"{exc}.")
            text = None

    def yes(self, question: str) -> bool:
        return self._read(f"{question} [y/N]", "", False).lower() in ("y", "yes")

    def _read(self, question: str, default: str, secret: bool) -> str:
        prompt = f"{question} [{default}]: " if default else f"{question}: "
        try:
            text = getpass.getpass(prompt) if secret and sys.stdin.isatty() else input(prompt)
        except EOFError:
            raise Stopped from None
        return text.strip() or default


class Script(Terminal):
    """`--non-interactive`: every answer from its flag, else its default; nothing read."""

    def explain(self, text: str) -> None:
        pass

    def answer(self, question: str, parse: Callable[[str], T], *, given: str | None,
               flag: str, default: str = "", secret: bool = False) -> T:
        try:
            return parse(default if given is None else given)
        except Unchecked as exc:
            raise InitFailed(1, f"{flag}: {exc}; nothing written") from None
        except ValueError as exc:
            raise InitFailed(2, f"{flag}: {exc}") from None


@dataclass(frozen=True, slots=True)
class Where:
    dir: Path
    config: Path
    env: Path
    run: str
    """The command that starts Tandem on these files."""


def _where(args: argparse.Namespace) -> Where:
    folder = Path(args.dir)
    config = Path(args.config) if args.config else folder / "config.yaml"
    command = "tandem run" if config == folder / "config.yaml" \
        else f"tandem --config {shlex.quote(str(config))} run"
    if folder.resolve() != Path.cwd().resolve():
        command = f"cd {shlex.quote(str(folder))} && {command}"
    return Where(folder, config, config.parent / ".env", command)


def init(args: argparse.Namespace) -> int:
    term = Script() if args.non_interactive else Terminal()
    where = _where(args)
    try:
        if not _may_write(term, where, args.force):
            return 1
        answers = _answers(term, args)
    except InitFailed as exc:
        sys.stderr.write(f"tandem init: {exc}\n")
        return exc.status
    except (Stopped, KeyboardInterrupt):
        term.say("\nStopped: nothing written.")
        return 130
    _write(term, where, answers)
    return _doctor(term, where)


def _may_write(term: Terminal, where: Where, force: bool) -> bool:
    for path in (where.config, where.env):
        if not path.exists() or force:
            continue
        if isinstance(term, Script):
            raise InitFailed(1, f"{path} exists: nothing written (--force overwrites it)")
        if not term.yes(f"{path} exists. Overwrite?"):
            term.say(f"Left {path} as it is; nothing written. (`tandem init --dir PATH` "
                     "sets Tandem up in another folder.)")
            return False
    return True


def _answers(term: Terminal, args: argparse.Namespace) -> Answers:
    term.explain("Setting Tandem up: a few questions, then config.yaml and .env are "
                 "written (Ctrl-C stops; nothing is written before the end).")
    chosen = term.answer("Where should Tandem talk? 1) Telegram 2) Slack 3) both",
                         _platform, given=args.platform, flag="--platform",
                         default="" if isinstance(term, Script) else "1")
    answers = _model(term, args)
    if chosen in ("telegram", "both"):
        answers.telegram = _telegram(term, args)
    if chosen in ("slack", "both"):
        answers.slack = _slack(term, args)
    return answers


def _model(term: Terminal, args: argparse.Namespace) -> Answers:
    answers = Answers()
    term.explain("\nThe model: any litellm model name (openai/…, anthropic/…, ollama/…).")
    answers.model = term.answer("Model", _needed("a model name"), given=args.model,
                                flag="--model", default=answers.model)
    answers.api_key = term.answer(
        "API key (hidden; Enter: none, or the provider's own variable like OPENAI_API_KEY)",
        str, given=_secret(term, args.api_key, "LLM_API_KEY"), flag="--api-key",
        secret=True)
    answers.api_base = term.answer(
        "API base URL, for an OpenAI-compatible server or a proxy (Enter: the provider's)",
        _url, given=args.api_base, flag="--api-base")
    return answers


def _telegram(term: Terminal, args: argparse.Namespace) -> TelegramAnswers:
    base = args.telegram_base_url or TelegramConfig().base_url
    term.explain("\nTelegram: ask @BotFather for a bot (/newbot); it gives you its token.")
    token, name = term.answer(
        "Bot token (hidden)",
        _token("Telegram", ("telegram", "check_token", base),
               "Copy it again from @BotFather (/mybots → your bot → API Token)"),
        given=_secret(term, args.telegram_token, "TELEGRAM_BOT_TOKEN"),
        flag="--telegram-token", secret=True)
    if name:
        term.say(f"Telegram knows this token: it is {name}.")
    term.explain("\nWho may talk to Tandem on Telegram: numeric user ids, commas between "
                 "them (\"*\": everyone). " + ACCESS.format(key="telegram.allowed_users"))
    return TelegramAnswers(
        token=token, base_url=base,
        allowed_users=_ids(term, "telegram", "allowed_users", args.telegram_allowed_users,
                           args.allowed_users),
        approvers=_ids(term, "telegram", "approvers", args.telegram_approvers,
                       args.approvers))


def _slack(term: Terminal, args: argparse.Namespace) -> SlackAnswers:
    base = args.slack_base_url or SlackConfig().base_url
    term.explain("\nSlack: create the app from Tandem's manifest (`tandem slack-manifest` "
                 "prints it; Create an app → From a manifest), install it, then copy its "
                 "tokens.")
    mode = term.answer("Socket Mode (no public URL) or HTTP (Slack posts to your URL)? "
                       "socket/http", _mode, given=args.slack_mode, flag="--slack-mode",
                       default="socket")
    token, whose = term.answer(
        "Bot User OAuth Token, xoxb-… (OAuth & Permissions; hidden)",
        _token("Slack", ("slack", "check_bot_token", base),
               "Copy the Bot User OAuth Token again (OAuth & Permissions)"),
        given=_secret(term, args.slack_bot_token, "SLACK_BOT_TOKEN"),
        flag="--slack-bot-token", secret=True)
    if whose:
        term.say(f"Slack knows this token: {whose}.")
    answers = SlackAnswers(mode=mode, bot_token=token, base_url=base)
    if mode == "socket":
        answers.app_token, _ = term.answer(
            "App-Level Token, xapp-… (Basic Information → App-Level Tokens, scope "
            "connections:write; hidden)",
            _token("Slack", ("slack", "check_app_token", base),
                   "Create or copy it under Basic Information → App-Level Tokens"),
            given=_secret(term, args.slack_app_token, "SLACK_APP_TOKEN"),
            flag="--slack-app-token", secret=True)
    else:
        answers.signing_secret = term.answer(
            "Signing Secret (Basic Information → App Credentials; hidden)",
            _needed("the signing secret"),
            given=_secret(term, args.slack_signing_secret, "SLACK_SIGNING_SECRET"),
            flag="--slack-signing-secret", secret=True)
    term.explain("\nWho may talk to Tandem on Slack: member ids (U…: a profile's ⋮ menu → "
                 "Copy member ID), commas between them (\"*\": everyone in the workspace). "
                 + ACCESS.format(key="slack.allowed_users"))
    answers.allowed_users = _ids(term, "slack", "allowed_users", args.slack_allowed_users,
                                 args.allowed_users)
    answers.approvers = _ids(term, "slack", "approvers", args.slack_approvers, args.approvers)
    return answers


# -- parsing answers --------------------------------------------------------------------

def _platform(text: str) -> str:
    choice = PLATFORMS.get(text, text.lower())
    if choice not in PLATFORMS.values():
        raise ValueError("Answer telegram, slack or both (or 1, 2, 3)")
    return choice


def _mode(text: str) -> Literal["socket", "http"]:
    if text.lower() == "socket":
        return "socket"
    if text.lower() == "http":
        return "http"
    raise ValueError("Answer socket or http")


def _needed(what: str) -> Callable[[str], str]:
    def parse(text: str) -> str:
        if not text:
            raise ValueError(f"This needs {what}")
        return text

    return parse


def _url(text: str) -> str:
    if text and not text.startswith(("http://", "https://")):
        raise ValueError("That is not a URL (http://… or https://…)")
    return text


def _secret(term: Terminal, given: str | None, variable: str) -> str | None:
    """A secret's flag, else (in a script) its environment variable."""
    if given is None and isinstance(term, Script):
        return os.environ.get(variable)
    return given


def _ids(term: Terminal, platform: str, key: str, own: str | None,
         shared: str | None) -> list[int | str]:
    """`<platform>.<key>` from `--<platform>-<key>`, else the flag both platforms share."""
    flag = f"--{platform}-{key}" if own is not None or shared is None else f"--{key}"
    question = "Allowed users (Enter: nobody yet)" if key == "allowed_users" \
        else "Approvers (Enter: none)"
    return term.answer(question, lambda text: parse_ids(text, platform, key),
                       given=own if own is not None else shared,
                       flag=flag.replace("_", "-"))


def _token(service: str, check: tuple[str, str, str],
           refused: str) -> Callable[[str], Token]:
    """A token's parser that asks `service` about it with `check`, an adapter's live
    check (`adapters.<platform>.<function>(token, base_url)`)."""
    platform, function, base_url = check

    def parse(token: str) -> Token:
        if not token:
            raise ValueError("This needs a token")
        outcome, text = _live(platform, function, token, base_url)
        if outcome == "ok":
            return token, text
        if outcome == "refused":
            raise ValueError(f"{service} refused this token ({text}). {refused}")
        if outcome == "malformed":
            raise ValueError(f"That is {text}")
        raise Unchecked(f"Could not check it with {service}: {text}", (token, ""))

    return parse


def _live(platform: str, function: str, token: str, base_url: str) -> tuple[str, str]:
    """Loaded by name: bot/ never imports an adapter. (outcome, text), outcome one of ok,
    malformed, refused, unreachable."""
    check = getattr(importlib.import_module(f"adapters.{platform}"), function)
    result: tuple[str, str] = asyncio.run(check(token, base_url))
    return result


# -- writing and checking ---------------------------------------------------------------

def _write(term: Terminal, where: Where, answers: Answers) -> None:
    kept = written(where.env, "TELEGRAM_WEBHOOK_SECRET")
    if answers.telegram and kept:  # Telegram knows it already: keep it
        answers.telegram.webhook_secret = kept
    where.config.parent.mkdir(parents=True, exist_ok=True)
    write_private(where.env, render_env(answers))
    write_private(where.config, render_config(answers))
    term.say(f"\nWrote {where.config} and {where.env} (the secrets), readable by you only.")
    for name, value in secrets(answers).items():
        if os.environ.get(name, value) != value:
            term.say(f"Note: {name} is also set in this shell, and that value wins over "
                     ".env: unset it, or make the two match.")


def _doctor(term: Terminal, where: Where) -> int:
    term.say("Checking it with `tandem doctor`:")
    done = subprocess.run([sys.executable, "-m", "bot", "--config",
                           str(where.config.resolve()), "doctor"], cwd=where.dir, check=False)
    if done.returncode == 0:
        term.say(f"\nReady. Start Tandem with:\n    {where.run}")
        return 0
    term.say(f"\n`tandem doctor` found a problem (above): fix it in {where.config} or "
             f"{where.env}, check again with `tandem doctor`, then:\n    {where.run}")
    return 1
