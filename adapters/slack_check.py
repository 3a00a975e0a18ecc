"""Slack's tokens, checked live for `tandem doctor` and `tandem init`, and the workspace
a bot token belongs to (`home_team`, which `start` uses too)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from functools import partial

import aiohttp
from slack_sdk.errors import SlackApiError, SlackClientError
from slack_sdk.web.async_client import AsyncWebClient
from slack_sdk.web.async_slack_response import AsyncSlackResponse

from adapters.slack_files import check as check_files
from adapters.slack_http import SlackUnavailable
from adapters.slack_inbound import as_str
from bot.core.config import Config
from bot.core.errors import ConfigError
from bot.llm.failures import cause


async def signed_in(client: AsyncWebClient, base_url: str) -> AsyncSlackResponse:
    """`auth.test` with the bot token, as `start` asks it."""
    try:
        return await client.auth_test()
    except SlackApiError as exc:
        raise ConfigError("slack.bot_token", "was rejected by Slack "
                          f"({exc.response.get('error')})") from None
    except (aiohttp.ClientError, TimeoutError) as exc:
        raise SlackUnavailable(f"slack: cannot reach {base_url} "
                               f"({type(exc).__name__})") from None


def home_team(configured: str | None, auth: AsyncSlackResponse) -> str:
    """The bot's workspace: `slack.team_id`, which must be the token's, else the token's
    as `auth.test` names it. Without one, Tandem could not tell members from outsiders."""
    told = as_str(auth.get("team_id"))
    if configured and told and configured != told:
        raise ConfigError("slack.team_id", f"is {configured}, but slack.bot_token belongs "
                          f"to the workspace {told}")
    if not (configured or told):
        raise ConfigError("slack.team_id", "is not set and Slack's auth.test did not name "
                          "the bot's workspace; set it to the workspace id (T…)")
    return configured or told


CHECK_TIMEOUT_S = 5
BOT_TOKEN_PREFIXES = ("xoxb-", "xoxe.xoxb-")  # the second: with token rotation on
APP_TOKEN_PREFIX = "xapp-"


@contextlib.asynccontextmanager
async def _checking(token: str, base_url: str) -> AsyncIterator[AsyncWebClient]:
    # The client's own `timeout` applies only to a session it makes itself: this one's
    # is the one that counts (aiohttp's default is 5 minutes).
    limit = aiohttp.ClientTimeout(total=CHECK_TIMEOUT_S)
    async with aiohttp.ClientSession(trust_env=True, timeout=limit) as session:
        yield AsyncWebClient(token=token, base_url=slash(base_url), session=session,
                             timeout=CHECK_TIMEOUT_S, retry_handlers=[])


def slash(base_url: str) -> str:
    return base_url if base_url.endswith("/") else base_url + "/"


async def _ask(call: Callable[[], Awaitable[AsyncSlackResponse]],
               base_url: str) -> tuple[str, str, AsyncSlackResponse | None]:
    """("ok", "", the answer), ("refused", Slack's error code, None) or ("unreachable",
    "cannot reach <base_url> (why)", None)."""
    try:
        return "ok", "", await call()
    except SlackApiError as exc:
        return "refused", str(exc.response.get("error") or "an error"), None
    except (SlackClientError, aiohttp.ClientError, TimeoutError, ValueError) as exc:
        return "unreachable", f"cannot reach {base_url} ({cause(exc, CHECK_TIMEOUT_S)})", None


def _whose(auth: AsyncSlackResponse) -> str:
    return f"workspace {as_str(auth.get('team'))} ({as_str(auth.get('team_id'))}), " \
           f"bot user @{as_str(auth.get('user'))}"


async def check_bot_token(token: str, base_url: str) -> tuple[str, str]:
    """Ask Slack whose bot `token` is (auth.test), as `start` does. One of ("ok",
    "workspace <name> (<id>), bot user @<name>"), ("malformed", why), ("refused", Slack's
    error code) or ("unreachable", "cannot reach <base_url> (why)"); never the token."""
    if not token.startswith(BOT_TOKEN_PREFIXES):
        return "malformed", ("not a bot token (it starts with xoxb-: OAuth & Permissions → "
                             "Bot User OAuth Token)")
    async with _checking(token, base_url) as client:
        outcome, text, auth = await _ask(client.auth_test, base_url)
    return (outcome, _whose(auth)) if auth is not None else (outcome, text)


async def check_app_token(token: str, base_url: str) -> tuple[str, str]:
    """Whether Slack lets the app-level `token` open Socket Mode connections
    (apps.connections.open: it hands out an address, nothing connects). Outcomes as
    `check_bot_token`'s; "ok" comes with an empty text."""
    if not token.startswith(APP_TOKEN_PREFIX):
        return "malformed", ("not an app-level token (it starts with xapp-: Basic Information "
                             "→ App-Level Tokens, with the connections:write scope)")
    async with _checking(token, base_url) as client:
        outcome, text, _ = await _ask(partial(client.apps_connections_open, app_token=token),
                                      base_url)
    return outcome, text


def _line(what: str, key: str, outcome: str, text: str) -> tuple[str, str, str]:
    if outcome == "refused":
        return what, "fail", f"Slack refused {key} ({text})"
    if outcome == "malformed":
        return what, "fail", f"{key} is {text}"
    return what, "fail", text


async def check(config: Config) -> list[tuple[str, str, str]]:
    """`tandem doctor`: whether Slack takes slack.bot_token (auth.test), and then whether
    it has the scopes files need; in Socket Mode, at the same time, slack.app_token."""
    slack = config.slack
    if not slack.bot_token:
        return []  # the doctor says so itself
    checks = [_check_bot(config)]
    if slack.mode == "socket" and slack.app_token:
        checks.append(_check_app(config))
    return [line for lines in await asyncio.gather(*checks) for line in lines]


async def _check_bot(config: Config) -> list[tuple[str, str, str]]:
    slack = config.slack
    async with _checking(slack.bot_token or "", slack.base_url) as client:
        outcome, text, auth = await _ask(client.auth_test, slack.base_url)
        if auth is None:
            return [_line("slack", "slack.bot_token", outcome, text)]
        try:
            home_team(slack.team_id, auth)
        except ConfigError as exc:
            return [("slack", "fail", f"{exc.key} {exc.problem}")]
        return [("slack", "ok", f"signed in to {_whose(auth)} (auth.test)"),
                *await check_files(client)]


async def _check_app(config: Config) -> list[tuple[str, str, str]]:
    outcome, text = await check_app_token(config.slack.app_token or "", config.slack.base_url)
    if outcome == "ok":
        return [("slack app token", "ok", "may open Socket Mode connections "
                 "(apps.connections.open)")]
    return [_line("slack app token", "slack.app_token", outcome, text)]
