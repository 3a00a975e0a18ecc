"""The Slack app manifest `tandem slack-manifest` prints: pasted into "Create an app →
From an app manifest", it gives the app exactly the scopes, events, slash command and
settings the adapter uses, in Socket Mode or HTTP mode, with or without Slack's assistant
surface.

The lists here are the canonical ones; `tests/test_slack_manifest.py` checks them against
what the adapter really does (the events its bolt app listens to, the Web API methods it
calls, the file scopes `adapters.slack_files` checks), so the two cannot drift apart.

This module stays light (no aiohttp, slack_sdk or pydantic) so the command is instant:
`adapters.slack_files.SCOPES` is read from that module's source, and the config's default
suggested prompts are loaded only with `assistant=True`.
"""

from __future__ import annotations

import ast
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal
from urllib.parse import urlsplit

NAME = "Tandem"
DESCRIPTION = "An AI agent that uses tools and asks before the risky ones."
BOT_NAME = "tandem"
ASSISTANT_DESCRIPTION = ("Ask Tandem anything: it answers in the thread, uses tools, and "
                         "asks you before the risky ones.")
COMMAND = "/tandem"
COMMAND_DESCRIPTION = "Talk to Tandem: start afresh, stop, see status, jobs or approvals"
COMMAND_HINT = "new | stop | status | jobs | approvals | help"

MESSAGE_EVENTS = ("message.im", "message.channels", "message.groups", "message.mpim")
"""Bolt's one `message` listener: Slack subscribes to messages per kind of conversation."""
EVENTS = ("app_mention", *MESSAGE_EVENTS)
ASSISTANT_EVENTS = ("assistant_thread_started", "assistant_thread_context_changed")


def _slack_files_scopes() -> tuple[str, ...]:
    """`adapters.slack_files.SCOPES`, read from its source rather than imported: importing
    it pulls in aiohttp and slack_sdk (up to a second), which a manifest does not need."""
    tree = ast.parse(Path(__file__).with_name("slack_files.py").read_text(encoding="utf-8"))
    for node in tree.body:
        names: list[ast.expr]
        if isinstance(node, ast.Assign):
            names, value = node.targets, node.value
        elif isinstance(node, ast.AnnAssign) and node.value is not None:
            names, value = [node.target], node.value
        else:
            continue
        if any(isinstance(n, ast.Name) and n.id == "SCOPES" for n in names):
            return tuple(ast.literal_eval(value))
    raise RuntimeError("adapters/slack_files.py no longer defines SCOPES as a literal")


FILE_SCOPES = _slack_files_scopes()
"""`files:read` (fetch what people share) and `files:write` (`send_file`)."""
SCOPES = (
    "app_mentions:read",   # app_mention
    "chat:write",          # post, update, delete, ephemeral, chat streams
    "im:history",          # message.im, conversations.replies in DMs
    "im:read",             # DM conversation info (no call or event of its own)
    "channels:history",    # message.channels, reading a public channel's thread
    "groups:history",      # message.groups (private channels)
    "mpim:history",        # message.mpim (group DMs)
    "reactions:write",
    "users:read",          # users.info: names and workspaces of speakers
    *FILE_SCOPES,
    "commands",            # the /tandem slash command
)
ASSISTANT_SCOPES = ("assistant:write",)

Mode = Literal["socket", "http"]


class ManifestError(ValueError):
    """Options that make no manifest (the CLI prints it on one line and exits 2)."""


def bot_events(*, assistant: bool = False) -> list[str]:
    return [*EVENTS, *(ASSISTANT_EVENTS if assistant else ())]


def bot_scopes(*, assistant: bool = False) -> list[str]:
    return [*SCOPES, *(ASSISTANT_SCOPES if assistant else ())]


def default_prompts() -> list[str]:
    """`slack.assistant.prompts` as the config has it by default."""
    from bot.core.config import SlackAssistant

    return list(SlackAssistant().prompts)


def manifest(mode: Mode = "socket", url: str | None = None, *, assistant: bool = False,
             prompts: Sequence[str] | None = None) -> dict[str, Any]:
    """The app manifest. HTTP mode needs `url`, the public address of Tandem's events
    endpoint (`slack.http.path`, by default `/slack/events`): bolt takes events, button
    presses and the slash command there alike."""
    if mode not in ("socket", "http"):
        raise ManifestError(f"--mode must be socket or http, not {mode!r}")
    if mode == "socket" and url:
        raise ManifestError("--url is for --mode http (Socket Mode needs no public URL)")
    if mode == "http":
        if not url:
            raise ManifestError("--mode http needs --url, the public address of Tandem's "
                                "events endpoint, e.g. https://tandem.example.com/slack/events")
        parts = urlsplit(url)
        if parts.scheme not in ("https", "http") or not parts.netloc:
            raise ManifestError(f"--url must be an https:// (or http://) address, not {url!r}")
    at = {"url": url} if mode == "http" else {}
    request_url = {"request_url": url} if mode == "http" else {}
    features: dict[str, Any] = {
        "app_home": {"home_tab_enabled": False, "messages_tab_enabled": True,
                     "messages_tab_read_only_enabled": False},
        "bot_user": {"display_name": BOT_NAME, "always_online": True},
        "slash_commands": [{"command": COMMAND, **at, "description": COMMAND_DESCRIPTION,
                            "usage_hint": COMMAND_HINT, "should_escape": False}],
    }
    if assistant:
        # As the adapter offers them in a new assistant thread (`_on_assistant_thread`).
        features["assistant_view"] = {
            "assistant_description": ASSISTANT_DESCRIPTION,
            "suggested_prompts": [{"title": p[:75], "message": p} for p in
                                  (default_prompts() if prompts is None else prompts)],
        }
    return {
        "display_information": {"name": NAME, "description": DESCRIPTION},
        "features": features,
        "oauth_config": {"scopes": {"bot": bot_scopes(assistant=assistant)}},
        "settings": {
            "event_subscriptions": {**request_url,
                                    "bot_events": bot_events(assistant=assistant)},
            "interactivity": {"is_enabled": True, **request_url},
            "org_deploy_enabled": False,
            "socket_mode_enabled": mode == "socket",
            "token_rotation_enabled": False,
        },
    }


def render(data: dict[str, Any], *, as_yaml: bool = False) -> str:
    """JSON (what Slack's dialog shows first), or YAML; ends with a newline."""
    if as_yaml:
        import yaml

        return str(yaml.safe_dump(data, sort_keys=False, allow_unicode=True, width=88))
    return json.dumps(data, indent=2, ensure_ascii=False) + "\n"
