"""Configuration of the chat platforms: who may talk to Tandem, who approves, and how
each platform is reached. `bot.core.config` assembles these into `Config`."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BeforeValidator, Field
from pydantic_core import PydanticCustomError

from bot.core.sections import Section


def _user_id(platform: str, *, wildcard: bool) -> Any:
    """A validator for one entry of `<platform>.allowed_users` (`wildcard`: "*" may be one)
    or `<platform>.approvers`. Telegram ids become ints (digits in quotes are fine)."""
    what = "a numeric Telegram user id" if platform == "telegram" else "a Slack user id"

    def check(value: Any) -> Any:
        text = value.strip() if isinstance(value, str) else None
        if text == "*":
            if wildcard:
                return text
            raise PydanticCustomError("user_id", '"*" cannot be an approver: list user ids')
        if platform == "telegram":
            if text is not None and text.isascii() and text.isdigit():
                value = int(text)
            if isinstance(value, int) and not isinstance(value, bool) and value > 0:
                return value
        elif text:
            return text
        raise PydanticCustomError("user_id", "must be {what}{star}, not {value}",
                                  {"what": what, "star": ' or "*"' if wildcard else "",
                                   "value": repr(value)[:40]})

    return BeforeValidator(check)


def _listed(value: Any) -> Any:
    """One id (or "*", or ids separated by commas, as an environment variable gives
    them) where a list belongs is that list."""
    if isinstance(value, str):
        return [part.strip() for part in value.split(",") if part.strip()]
    if isinstance(value, int) and not isinstance(value, bool):
        return [value]
    return value


Listed = BeforeValidator(_listed)
TelegramUser = Annotated[int | Literal["*"], _user_id("telegram", wildcard=True)]
TelegramApprover = Annotated[int, _user_id("telegram", wildcard=False)]
SlackUser = Annotated[str, _user_id("slack", wildcard=True)]
SlackApprover = Annotated[str, _user_id("slack", wildcard=False)]


class Groups(Section):
    """How Tandem takes part in groups and channels."""

    context: int = Field(default=0, ge=0, le=500)
    """Keep the last N messages that were not addressed to Tandem (with their authors),
    and give those since its last answer there to the model when it is next addressed;
    0 keeps none. Telegram shows a bot these only with privacy mode off (BotFather)."""
    sessions: Literal["shared", "per_user"] = "shared"
    """`per_user`: each member has their own conversation in a group, topic or thread
    (their own history, turns and `/new`); `shared`: one conversation for everyone there."""


class TelegramGroups(Groups):
    require_mention: bool = True


class TelegramWebhook(Section):
    url: str | None = None
    """The public HTTPS address Telegram posts updates to (behind your reverse proxy)."""
    host: str = "127.0.0.1"
    port: int = Field(default=8443, ge=0, le=65535)
    path: str = "/telegram"
    secret_token: str | None = None
    """Checked on every request (`X-Telegram-Bot-Api-Secret-Token`); required."""


class TelegramConfig(Section):
    enabled: bool = False
    token: str | None = None
    base_url: str = "https://api.telegram.org/bot"
    mode: Literal["polling", "webhook"] = "polling"
    """Polling (one process polls; with several workers one is elected) or a webhook
    (every worker may receive)."""
    webhook: TelegramWebhook = Field(default_factory=TelegramWebhook)
    allowed_users: Annotated[list[TelegramUser], Listed] = Field(default_factory=list)
    """Numeric user ids, or "*" for everyone; empty means nobody (see `bot.serve.access`)."""
    approvers: Annotated[list[TelegramApprover], Listed] = Field(default_factory=list)
    groups: TelegramGroups = Field(default_factory=TelegramGroups)
    drafts: bool = True
    """Stream answers in private chats as a message draft (one message at the end);
    false: a placeholder edited about once a second, as in groups."""


class SlackHTTP(Section):
    host: str = "127.0.0.1"
    port: int = 3000
    path: str = "/slack/events"


class SlackAssistant(Section):
    enabled: bool = False
    """The app has Slack's assistant surface (manifest `features.assistant_view`, scope
    `assistant:write`): show "is thinking…" as the thread's status, offer prompts."""
    prompts: list[str] = Field(default_factory=lambda: [
        "What can you do?", "Show my scheduled tasks"], max_length=4)
    """Suggested prompts for a new assistant thread (at most four)."""


class SlackConfig(Section):
    enabled: bool = False
    mode: Literal["socket", "http"] = "socket"
    bot_token: str | None = None
    app_token: str | None = None
    signing_secret: str | None = None
    base_url: str = "https://slack.com/api/"
    allowed_users: Annotated[list[SlackUser], Listed] = Field(default_factory=list)
    """User ids, or "*" for every member of the bot's workspace; empty means nobody."""
    approvers: Annotated[list[SlackApprover], Listed] = Field(default_factory=list)
    team_id: str | None = None
    """The bot's workspace; when unset, `auth.test` tells it at start."""
    http: SlackHTTP = Field(default_factory=SlackHTTP)
    streaming: bool = True
    """Stream answers with Slack's chat streams (`chat.startStream`); where Slack refuses,
    or false, a message updated about once a second."""
    assistant: SlackAssistant = Field(default_factory=SlackAssistant)
    groups: Groups = Field(default_factory=Groups)
