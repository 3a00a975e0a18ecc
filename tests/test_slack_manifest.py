"""`tandem slack-manifest`: the manifest asks Slack for exactly what the adapter uses.

The drift checks read the adapter itself: the events its bolt app listens to (built
offline, as `SlackAdapter.start` builds it), the slash command and button listeners, the
Web API methods `adapters/slack*.py` call, and the file scopes `adapters.slack_files`
checks. A new listener or API call without its manifest entry fails here.
"""

from __future__ import annotations

import inspect
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import yaml
from slack_sdk.web.async_client import AsyncWebClient

from adapters import slack_files
from adapters import slack_manifest as sm
from adapters.slack import SlackAdapter
from bot.core.config import SlackAssistant
from tests.conftest import make_config

REPO = Path(__file__).resolve().parent.parent
URL = "https://tandem.example.com/slack/events"

# What the adapter's bolt listeners take, as Slack names the subscriptions.
BOLT_TO_SUBSCRIPTIONS = {"message": set(sm.MESSAGE_EVENTS)}

# Each Web API method the adapter calls and the bot scopes it needs (Slack's method
# reference); `conversations.replies` reads threads in every kind of conversation.
METHOD_SCOPES: dict[str, set[str]] = {
    "auth_test": set(),
    "apps_connections_open": set(),  # `tandem doctor`, with the app-level token (its own
                                     # scope, connections:write, is not a bot scope)
    "chat_postMessage": {"chat:write"},
    "chat_update": {"chat:write"},
    "chat_delete": {"chat:write"},
    "chat_postEphemeral": {"chat:write"},
    "chat_startStream": {"chat:write"},
    "chat_appendStream": {"chat:write"},
    "chat_stopStream": {"chat:write"},
    "conversations_replies": {"channels:history", "groups:history", "im:history",
                              "mpim:history"},
    "reactions_add": {"reactions:write"},
    "users_info": {"users:read"},
    "files_upload_v2": {"files:write"},
    "assistant_threads_setStatus": {"assistant:write"},
    "assistant_threads_setSuggestedPrompts": {"assistant:write"},
}
ASSISTANT_METHODS = {"assistant_threads_setStatus", "assistant_threads_setSuggestedPrompts"}

# Each event subscription and the bot scope Slack requires for it.
EVENT_SCOPES = {
    "app_mention": "app_mentions:read",
    "message.im": "im:history",
    "message.channels": "channels:history",
    "message.groups": "groups:history",
    "message.mpim": "mpim:history",
    "assistant_thread_started": "assistant:write",
    "assistant_thread_context_changed": "assistant:write",
}

# The keys Slack's manifest schema (v1, slackapi/manifest-schema) allows where Tandem
# writes: a misspelt key fails here rather than in Slack's dialog.
ALLOWED = {
    (): {"_metadata", "display_information", "features", "oauth_config", "settings"},
    ("display_information",): {"name", "description", "background_color",
                               "long_description"},
    ("features",): {"app_home", "bot_user", "shortcuts", "slash_commands", "unfurl_domains",
                    "workflow_steps", "functions", "assistant_view"},
    ("features", "app_home"): {"home_tab_enabled", "messages_tab_enabled",
                               "messages_tab_read_only_enabled"},
    ("features", "bot_user"): {"display_name", "always_online"},
    ("features", "assistant_view"): {"assistant_description", "suggested_prompts"},
    ("oauth_config",): {"redirect_urls", "scopes", "token_management_enabled",
                        "pkce_enabled"},
    ("oauth_config", "scopes"): {"bot", "user", "bot_optional", "user_optional"},
    ("settings",): {"allowed_ip_address_ranges", "event_subscriptions", "incoming_webhooks",
                    "interactivity", "org_deploy_enabled", "socket_mode_enabled",
                    "is_hosted", "token_rotation_enabled", "function_runtime"},
    ("settings", "event_subscriptions"): {"request_url", "bot_events", "user_events",
                                          "metadata_subscriptions"},
    ("settings", "interactivity"): {"is_enabled", "request_url", "message_menu_options_url"},
}
SLASH_COMMAND_KEYS = {"command", "url", "description", "usage_hint", "should_escape"}


def registered(adapter_app: Any) -> dict[str, set[Any]]:
    """The bolt app's listeners by kind: event types, action constraints, commands."""
    found: dict[str, set[Any]] = {"event": set(), "action": set(), "command": set()}
    for listener in adapter_app._async_listeners:
        for matcher in listener.matchers:
            # bolt's builtin matcher wraps `event(...)`/`action(...)`/`command(...)`'s func
            func = inspect.getclosurevars(matcher.func).nonlocals["func"]
            kind = func.__qualname__.split(".")[0]
            assert kind in found, f"a {kind} listener: does the manifest need it?"
            (value,) = inspect.getclosurevars(func).nonlocals.values()
            if isinstance(value, dict):  # app.event({"type": ..., "subtype": ...})
                value = value["type"]
            found[kind].add(value.pattern if isinstance(value, re.Pattern) else value)
    return found


@pytest.fixture
async def listeners(tmp_path: Path) -> dict[str, set[Any]]:
    model = SimpleNamespace(api_base="http://127.0.0.1:9/v1")  # never called
    config = make_config(tmp_path, model, slack__enabled=True,  # type: ignore[arg-type]
                         slack__bot_token="xoxb-test", slack__app_token="xapp-test")
    adapter = SlackAdapter(config, hub=None)  # type: ignore[arg-type]
    adapter._client = AsyncWebClient(token="xoxb-test")
    app = adapter._build_app()
    found = registered(app)
    for event in found["event"]:  # the matchers really take those events, and only those
        body = {"type": "event_callback", "event": {"type": event}}
        taken = [listener for listener in app._async_listeners
                 if all([await m.func(body) for m in listener.matchers])]
        assert len(taken) == 1, (event, taken)
    return found


def subscriptions(bolt_events: set[str]) -> set[str]:
    return set().union(*(BOLT_TO_SUBSCRIPTIONS.get(e, {e}) for e in bolt_events))


# ---- drift: the manifest against the adapter -----------------------------------------


async def test_bot_events_are_exactly_what_the_bolt_app_listens_to(
        listeners: dict[str, set[Any]]) -> None:
    listened = subscriptions(listeners["event"])
    # The adapter always listens for the assistant events (they are acked either way).
    assert set(sm.bot_events(assistant=True)) == listened
    assert set(sm.bot_events()) == listened - set(sm.ASSISTANT_EVENTS)
    for mode, url in (("socket", None), ("http", URL)):
        for assistant in (False, True):
            data = sm.manifest(mode, url, assistant=assistant)  # type: ignore[arg-type]
            events = data["settings"]["event_subscriptions"]["bot_events"]
            assert len(events) == len(set(events))
            assert set(events) == (listened if assistant
                                   else listened - set(sm.ASSISTANT_EVENTS))


async def test_slash_commands_and_interactivity_match_the_listeners(
        listeners: dict[str, set[Any]]) -> None:
    data = sm.manifest()
    assert {c["command"] for c in data["features"]["slash_commands"]} \
        == listeners["command"] == {sm.COMMAND}
    assert listeners["action"]  # the approval and cancel buttons
    assert data["settings"]["interactivity"]["is_enabled"] is True
    assert "commands" in data["oauth_config"]["scopes"]["bot"]


def test_file_scopes_are_slack_files_own() -> None:
    assert sm.FILE_SCOPES == slack_files.SCOPES
    assert set(slack_files.SCOPES) <= set(sm.bot_scopes())
    # missing_scopes asks for nothing the manifest grants
    granted = ", ".join(sm.bot_scopes())
    assert slack_files.missing_scopes({"X-OAuth-Scopes": granted}) == []


def test_scopes_cover_every_web_api_call_and_event_and_nothing_more() -> None:
    called: set[str] = set()
    for path in sorted((REPO / "adapters").glob("slack*.py")):
        called |= set(re.findall(r"client\.([a-z]+_[A-Za-z0-9_]+)\b", path.read_text()))
    unknown = called - set(METHOD_SCOPES)
    assert not unknown, f"new Slack API calls {unknown}: add their scopes to the manifest " \
                        "(adapters/slack_manifest.py) and to METHOD_SCOPES"
    needed = set().union(*(METHOD_SCOPES[m] for m in called - ASSISTANT_METHODS),
                         (EVENT_SCOPES[e] for e in sm.EVENTS), slack_files.SCOPES,
                         {"commands"})
    assistant_needed = needed | set().union(*(METHOD_SCOPES[m] for m in ASSISTANT_METHODS),
                                            (EVENT_SCOPES[e] for e in sm.ASSISTANT_EVENTS))
    base, full = set(sm.bot_scopes()), set(sm.bot_scopes(assistant=True))
    assert needed <= base and assistant_needed <= full
    # im:read is the one scope not tied to a call or event above (DM conversation info)
    assert base - needed == {"im:read"}
    assert full - base == set(sm.ASSISTANT_SCOPES) == {"assistant:write"}
    assert len(sm.bot_scopes(assistant=True)) == len(full)


# ---- the manifest's shape ------------------------------------------------------------


def check_keys(data: dict[str, Any], path: tuple[str, ...] = ()) -> None:
    assert set(data) <= ALLOWED[path], (path, set(data) - ALLOWED[path])
    for key, value in data.items():
        if isinstance(value, dict) and (*path, key) in ALLOWED:
            check_keys(value, (*path, key))


@pytest.mark.parametrize("assistant", [False, True])
@pytest.mark.parametrize("mode", ["socket", "http"])
def test_keys_and_values_are_those_of_slacks_schema(mode: str, assistant: bool) -> None:
    data = sm.manifest(mode, URL if mode == "http" else None,  # type: ignore[arg-type]
                       assistant=assistant)
    check_keys(data)
    info = data["display_information"]
    assert info["name"] == "Tandem" and 1 <= len(info["name"]) <= 35
    assert 1 <= len(info["description"]) <= 140
    features = data["features"]
    assert features["bot_user"] == {"display_name": "tandem", "always_online": True}
    assert features["app_home"]["messages_tab_enabled"] is True
    assert features["app_home"]["messages_tab_read_only_enabled"] is False
    for command in features["slash_commands"]:
        assert set(command) <= SLASH_COMMAND_KEYS
        assert re.fullmatch(r"/\S{1,31}", command["command"]) and command["description"]
    settings = data["settings"]
    assert settings["org_deploy_enabled"] is False
    assert settings["token_rotation_enabled"] is False
    assert ("assistant_view" in features) is assistant


def test_socket_mode_has_no_urls() -> None:
    data = sm.manifest("socket")
    settings = data["settings"]
    assert settings["socket_mode_enabled"] is True
    assert "request_url" not in settings["event_subscriptions"]
    assert settings["interactivity"] == {"is_enabled": True}
    assert all("url" not in c for c in data["features"]["slash_commands"])


def test_http_mode_sends_events_presses_and_the_command_to_the_url() -> None:
    data = sm.manifest("http", URL)
    settings = data["settings"]
    assert settings["socket_mode_enabled"] is False
    assert settings["event_subscriptions"]["request_url"] == URL
    assert settings["interactivity"] == {"is_enabled": True, "request_url": URL}
    assert [c["url"] for c in data["features"]["slash_commands"]] == [URL]


def test_the_assistant_adds_its_view_scope_and_events() -> None:
    plain, with_it = sm.manifest(), sm.manifest(assistant=True)
    assert "assistant_view" not in plain["features"]
    view = with_it["features"]["assistant_view"]
    assert view["assistant_description"]
    prompts = SlackAssistant().prompts
    assert view["suggested_prompts"] == [{"title": p, "message": p} for p in prompts]
    assert "assistant:write" not in plain["oauth_config"]["scopes"]["bot"]
    assert "assistant:write" in with_it["oauth_config"]["scopes"]["bot"]
    events = with_it["settings"]["event_subscriptions"]["bot_events"]
    assert {"assistant_thread_started", "assistant_thread_context_changed"} <= set(events)
    assert not set(sm.ASSISTANT_EVENTS) & set(plain["settings"]["event_subscriptions"]
                                                  ["bot_events"])
    long = "x" * 100  # titles are cut as the adapter cuts them
    assert sm.manifest(assistant=True, prompts=[long])["features"]["assistant_view"][
        "suggested_prompts"] == [{"title": long[:75], "message": long}]


@pytest.mark.parametrize("mode, url, says", [
    ("http", None, "--mode http needs --url"),
    ("http", "", "--mode http needs --url"),
    ("http", "tandem.example.com/slack/events", "--url must be an https://"),
    ("socket", URL, "--url is for --mode http"),
])
def test_options_that_make_no_manifest_are_refused(mode: str, url: str | None,
                                                   says: str) -> None:
    with pytest.raises(sm.ManifestError, match=re.escape(says)):
        sm.manifest(mode, url)  # type: ignore[arg-type]


# ---- the command -----------------------------------------------------------------------


def env() -> dict[str, str]:
    out = {k: v for k, v in os.environ.items() if not k.startswith("TANDEM_")}
    out["LITELLM_LOCAL_MODEL_COST_MAP"] = "True"
    return out


def tandem(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "bot", *argv], capture_output=True,
                          text=True, env=env(), cwd=REPO, timeout=30)


def test_the_command_prints_valid_json_quickly_and_needs_no_config(tmp_path: Path) -> None:
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "bot", "slack-manifest"], capture_output=True,
                          text=True, env={**env(), "PYTHONPATH": str(REPO)}, cwd=tmp_path,
                          timeout=30)  # no config.yaml here, and none is needed
    assert time.monotonic() - started < 2
    assert done.returncode == 0 and done.stderr == ""
    assert json.loads(done.stdout) == sm.manifest()


def test_the_command_takes_mode_url_assistant_and_yaml() -> None:
    done = tandem("slack-manifest", "--mode", "http", "--url", URL, "--assistant")
    assert done.returncode == 0
    assert json.loads(done.stdout) == sm.manifest("http", URL, assistant=True)
    done = tandem("slack-manifest", "--yaml", "--assistant")
    assert done.returncode == 0
    assert yaml.safe_load(done.stdout) == sm.manifest(assistant=True)


def test_http_without_a_url_is_one_line_and_exit_2() -> None:
    done = tandem("slack-manifest", "--mode", "http")
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.count("\n") == 1 and done.stderr.startswith("tandem: ")
    assert "--url" in done.stderr


def test_help_lists_the_command() -> None:
    done = tandem("--help")
    assert done.returncode == 0 and "slack-manifest" in done.stdout
