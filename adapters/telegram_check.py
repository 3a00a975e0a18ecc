"""Telegram's token, checked live for `tandem doctor` and `tandem init`."""

from __future__ import annotations

import re

import aiohttp

from bot.core.config import Config
from bot.llm.failures import cause

TOKEN_SHAPE = re.compile(r"[0-9]+:[A-Za-z0-9_-]+")
CHECK_TIMEOUT_S = 5.0


PRIVACY_ON = ("telegram.groups.context is on, but Telegram shows this bot only the group "
              "messages addressed to it (privacy mode). In @BotFather: /setprivacy, choose the "
              "bot, Disable; then remove the bot from each group and add it again.")


async def check_token(token: str, base_url: str) -> tuple[str, str]:
    """Ask Telegram whose `token` is (getMe), the way `start` does. One of ("ok",
    "@username"), ("malformed", why), ("refused", Telegram's words, e.g. "401
    Unauthorized") or ("unreachable", "cannot reach <base_url> (why)"); never the token."""
    outcome, text, _ = await _get_me(token, base_url)
    return outcome, text


async def _get_me(token: str, base_url: str) -> tuple[str, str, dict[str, object]]:
    """`check_token`'s answer, and the bot as getMe describes it (empty unless "ok")."""
    if not TOKEN_SHAPE.fullmatch(token):
        return "malformed", ("not a bot token (@BotFather's look like 123456789:AAF…: "
                             "digits, a colon, then letters)"), {}
    try:
        async with aiohttp.ClientSession(trust_env=True) as session, session.get(
                f"{base_url}{token}/getMe",
                timeout=aiohttp.ClientTimeout(total=CHECK_TIMEOUT_S)) as reply:
            status, body = reply.status, await reply.json(content_type=None)
    except (aiohttp.ClientError, TimeoutError) as exc:
        return "unreachable", f"cannot reach {base_url} ({cause(exc, CHECK_TIMEOUT_S)})", {}
    except ValueError:
        return "unreachable", f"{base_url} did not answer as Telegram's Bot API does", {}
    result = body.get("result") if isinstance(body, dict) else None
    if status == 200 and isinstance(result, dict):
        return "ok", f"@{result.get('username')}", result
    said = body.get("description") if isinstance(body, dict) else None
    words = f"{status} {said}" if said else f"HTTP {status}"
    if status in (401, 403, 404):
        return "refused", words, {}
    return "unreachable", f"{base_url} answered {words}", {}


async def check(config: Config) -> list[tuple[str, str, str]]:
    """`tandem doctor`: whether Telegram takes telegram.token, and whose it is."""
    tg = config.telegram
    if not tg.token:
        return []  # the doctor says so itself
    outcome, text, me = await _get_me(tg.token, tg.base_url)
    if outcome == "ok":
        privacy = [("telegram groups", "warn", PRIVACY_ON)] \
            if tg.groups.context and not me.get("can_read_all_group_messages") else []
        return [("telegram", "ok", f"signed in as {text} (getMe)"), *privacy]
    if outcome == "refused":
        return [("telegram", "fail", f"Telegram refused telegram.token ({text})")]
    if outcome == "malformed":
        return [("telegram", "fail", f"telegram.token is {text}")]
    return [("telegram", "fail", text)]
