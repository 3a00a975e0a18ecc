"""`tandem run | chat | doctor | init | migrate | slack-manifest`. Heavy imports happen inside
the commands, so `tandem --help` stays instant."""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")


def parser() -> argparse.ArgumentParser:
    # --config and -v are taken before or after the command ("tandem chat --config x"):
    # each subparser knows them too, and its unset ones leave the main parser's alone.
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--config", metavar="PATH", default=argparse.SUPPRESS,
                        help="YAML config (default: ./config.yaml)")
    common.add_argument("-v", "--verbose", action="store_true", default=argparse.SUPPRESS,
                        help="debug logging")
    p = argparse.ArgumentParser(
        prog="tandem", parents=[common],
        description="Tandem: an AI agent for Telegram and Slack that asks before risky tools.")
    from bot import __version__

    p.add_argument("--version", action="version", version=f"tandem {__version__}")
    sub = p.add_subparsers(dest="command", metavar="COMMAND")
    run = sub.add_parser("run", parents=[common],
                         help="start every enabled platform (the terminal if none is)")
    run.add_argument("--workers", type=int, default=1, metavar="N",
                     help="run N worker processes (needs a PostgreSQL store.url)")
    sub.add_parser("chat", parents=[common],
                   help="talk to Tandem in this terminal (scriptable from stdin)")
    doctor = sub.add_parser("doctor", parents=[common],
                            help="check config, persona, database, platforms and the model")
    doctor.add_argument("--quick", action="store_true",
                        help="config, persona and database only: no network (health checks)")
    sub.add_parser("migrate", parents=[common],
                   help="bring the database schema up to date, then exit")
    _init_parser(sub, common)
    audit = sub.add_parser("audit", parents=[common],
                           help="print the audit log: approvals, tool runs, refusals, rules")
    audit.add_argument("--since", metavar="WHEN",
                       help="an age (30m, 12h, 7d) or a date/time (2026-12-01, UTC)")
    audit.add_argument("--conversation", metavar="KEY",
                       help="one conversation, as the log names it (telegram:123)")
    audit.add_argument("--json", action="store_true", help="one JSON object per line")
    manifest = sub.add_parser(
        "slack-manifest", help="print a Slack app manifest (Create an app → From a manifest)",
        description="Print the Slack app manifest Tandem needs (scopes, events, the /tandem "
                    "command, interactivity), to paste into Slack's \"Create an app → From "
                    "an app manifest\".")
    manifest.add_argument("--mode", choices=("socket", "http"), default="socket",
                          help="Socket Mode (default; no public URL) or HTTP (Events API)")
    manifest.add_argument("--url", metavar="URL",
                          help="http mode: the public events URL, e.g. "
                               "https://tandem.example.com/slack/events")
    manifest.add_argument("--assistant", action="store_true",
                          help="with Slack's assistant surface (slack.assistant.enabled)")
    manifest.add_argument("--yaml", action="store_true", help="YAML instead of JSON")
    return p


def _init_parser(sub: Any, common: argparse.ArgumentParser) -> None:
    init = sub.add_parser(
        "init", parents=[common], help="set Tandem up: ask a few questions, write config.yaml "
        "and .env, run doctor", description="Ask which platforms, the model and its key, "
        "the tokens (checked with Telegram and Slack) and who may talk and approve; write "
        "config.yaml and .env (the secrets, private to you); run `tandem doctor` on them. "
        "Every question has a flag below; with --non-interactive nothing is asked, and "
        "secrets may come from LLM_API_KEY, TELEGRAM_BOT_TOKEN, SLACK_BOT_TOKEN, "
        "SLACK_APP_TOKEN and SLACK_SIGNING_SECRET instead of flags.")
    init.add_argument("--dir", default=".", metavar="PATH",
                      help="the folder to set up (default: this one)")
    init.add_argument("--force", action="store_true",
                      help="replace an existing config.yaml and .env without asking")
    init.add_argument("--non-interactive", action="store_true",
                      help="ask nothing: answers from the flags, else their defaults")
    answers = init.add_argument_group("answers")
    for flag, metavar, text in (
            ("--platform", "NAME", "telegram, slack or both"),
            ("--model", "NAME", "any litellm model name (default: openai/gpt-4o-mini)"),
            ("--api-key", "KEY", "the model's API key (llm.api_key)"),
            ("--api-base", "URL", "an OpenAI-compatible server or a proxy (llm.api_base)"),
            ("--telegram-token", "TOKEN", "the bot token from @BotFather"),
            ("--telegram-base-url", "URL", "a self-hosted Bot API server (telegram.base_url)"),
            ("--slack-mode", "MODE", "socket (default) or http"),
            ("--slack-bot-token", "TOKEN", "the Bot User OAuth Token (xoxb-…)"),
            ("--slack-app-token", "TOKEN", "the App-Level Token (xapp-…), Socket Mode"),
            ("--slack-signing-secret", "SECRET", "the Signing Secret, HTTP mode"),
            ("--slack-base-url", "URL", "Slack's Web API (slack.base_url)"),
            ("--allowed-users", "IDS", "who may talk, commas between ids (\"*\": everyone)"),
            ("--approvers", "IDS", "who may approve anyone's risky tool calls"),
            ("--telegram-allowed-users", "IDS", "as --allowed-users, for Telegram only"),
            ("--telegram-approvers", "IDS", "as --approvers, for Telegram only"),
            ("--slack-allowed-users", "IDS", "as --allowed-users, for Slack only"),
            ("--slack-approvers", "IDS", "as --approvers, for Slack only")):
        answers.add_argument(flag, metavar=metavar, help=text)


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    args.config = getattr(args, "config", None)
    args.verbose = getattr(args, "verbose", False)
    if args.command is None:
        parser().print_help()
        return 0
    if args.command == "slack-manifest":
        return _slack_manifest(args)
    if args.command == "init":
        from bot.cli.init_wizard import init

        try:
            return init(args)
        except KeyboardInterrupt:
            return 130
    from bot.core.errors import ConfigError

    try:
        from bot.core.config import load_config

        config = load_config(args.config)
        if args.command == "doctor":
            from bot.cli.doctor import doctor

            return doctor(config, quick=args.quick)
        if args.command == "audit":
            from bot.cli import audit_cli

            return audit_cli.run(config, args.since, args.conversation, args.json)
        if args.command == "migrate":
            from bot.run.main import migrate

            return migrate(config)
        if args.command == "run" and args.workers != 1:
            return _workers(config, args)
        from bot.run.main import serve

        return serve(config, chat=args.command == "chat", verbose=args.verbose)
    except ConfigError as exc:
        print(f"tandem: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


def _slack_manifest(args: argparse.Namespace) -> int:
    # Loaded by name, as bot.run.main loads a platform: bot/ has no import of adapters/.
    import importlib

    slack = importlib.import_module("adapters.slack_manifest")
    try:
        data = slack.manifest(args.mode, args.url, assistant=args.assistant)
    except slack.ManifestError as exc:
        print(f"tandem: {exc}", file=sys.stderr)
        return 2
    sys.stdout.write(slack.render(data, as_yaml=args.yaml))
    return 0


def _workers(config: object, args: argparse.Namespace) -> int:
    from bot.core.config import Config
    from bot.core.errors import ConfigError
    from bot.run.main import cluster_url

    assert isinstance(config, Config)
    if args.workers < 1:
        raise ConfigError("--workers", "must be at least 1")
    if cluster_url(config) is None:
        raise ConfigError("store.url", "must be a postgresql:// URL to run several workers "
                          "(SQLite serves one process)")
    from bot.run import logs
    from bot.run.workers import supervise

    logs.setup(20, config.secrets(), format=config.logging.format)
    return supervise(args.workers, args.config, args.verbose)
