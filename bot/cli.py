"""`tandem run | chat | doctor`. Heavy imports happen inside the commands, so
`tandem --help` stays instant."""

from __future__ import annotations

import argparse
import os
import sys

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="tandem",
        description="Tandem: an AI agent for Telegram and Slack that asks before risky tools.")
    p.add_argument("--config", metavar="PATH", help="YAML config (default: ./config.yaml)")
    p.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    sub = p.add_subparsers(dest="command", metavar="COMMAND")
    sub.add_parser("run", help="start every enabled platform (the terminal if none is)")
    sub.add_parser("chat", help="talk to Tandem in this terminal (scriptable from stdin)")
    sub.add_parser("doctor", help="check config, persona, database and the model endpoint")
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    if args.command is None:
        parser().print_help()
        return 0
    from bot.errors import ConfigError

    try:
        from bot.config import load_config

        config = load_config(args.config)
        if args.command == "doctor":
            from bot.doctor import doctor

            return doctor(config)
        from bot.main import serve

        return serve(config, chat=args.command == "chat", verbose=args.verbose)
    except ConfigError as exc:
        print(f"tandem: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
