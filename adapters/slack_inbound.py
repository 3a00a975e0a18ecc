"""Slack's payloads in Tandem's terms, as pure functions: a message event as an `Incoming`
message (or None when it is not for Tandem) and as the core's `Inbound`, a button press
as a `Press`, a slash command, Slack's markup as plain text, `/commands`, the workspaces a
payload names, and what is odd about a payload's shape."""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from typing import Any

from adapters.slack_files import attachments as shared_files
from bot.core.chat_config import Groups
from bot.core.events import (
    Aside,
    Attachment,
    Cancel,
    Command,
    ConvKey,
    Edit,
    Inbound,
    Quote,
    User,
    UserMessage,
)

PLATFORM = "slack"

_SUBTYPES = frozenset({None, "file_share", "thread_broadcast"})
_COMMAND = re.compile(r"/([a-z]+)(?:\s+(.*))?", re.S)
_SLACK_LINK = re.compile(r"<((?:https?|mailto):[^|>]+)(?:\|([^>]+))?>")


@dataclass(frozen=True, slots=True)
class Incoming:
    """A user's message, normalized."""

    conv: ConvKey
    channel: str
    ts: str
    user: str
    team: str | None
    text: str
    thread: str | None
    """The thread the message was posted in (None at the top of a channel or DM)."""
    addressed: bool
    """To Tandem for sure (a DM or a mention); otherwise only if Tandem is in the thread."""
    dm: bool
    attachments: tuple[Attachment, ...] = ()
    quote: Quote | None = None
    """A message the user linked (Slack unfurls it), as a quote."""
    forwarded: Quote | None = None
    """The message the user forwarded (shared), with its author."""


def slack_text(text: str, bot_user: str) -> str:
    """Slack's message markup to plain text: the bot's mention removed, links and
    entities undone."""
    text = text.replace(f"<@{bot_user}>", " ").strip()
    text = _SLACK_LINK.sub(lambda m: f"{m.group(2)} ({m.group(1)})" if m.group(2) else m.group(1),
                     text)
    text = re.sub(r"[ \t]{2,}", " ", text)
    return text.replace("&lt;", "<").replace("&gt;", ">").replace("&amp;", "&")


def extract_message(event: dict[str, Any], bot_user: str) -> Incoming | None:
    """A user's message (not addressed when it is channel talk without a mention), or None
    (edits, other bots, malformed events)."""
    if not isinstance(event, dict):
        return None
    user, channel, ts = event.get("user"), event.get("channel"), event.get("ts")
    subtype = event.get("subtype")
    if not (subtype is None or isinstance(subtype, str)) or subtype not in _SUBTYPES \
            or event.get("bot_id") or user == bot_user \
            or not all(isinstance(v, str) and v for v in (user, channel, ts)):
        return None  # not a user's message, or a malformed one
    assert isinstance(user, str) and isinstance(channel, str) and isinstance(ts, str)
    raw = str(event.get("text")) if isinstance(event.get("text"), str) else ""
    thread_ts = event.get("thread_ts")
    thread = thread_ts if isinstance(thread_ts, str) and thread_ts and thread_ts != ts else None
    dm = event.get("channel_type") == "im"
    mentioned = event.get("type") == "app_mention" or f"<@{bot_user}>" in raw
    key = thread if dm else (thread or ts) if mentioned or thread else None
    attachments = shared_files(event.get("files"))
    team = event.get("user_team") or event.get("team")
    quote, forwarded = _shared(event.get("attachments"), bot_user)
    return Incoming(ConvKey(PLATFORM, channel, key), channel, ts, user,
                    team if isinstance(team, str) else None, slack_text(raw, bot_user),
                    thread, dm or mentioned, dm, attachments, quote, forwarded)


def _shared(attachments: Any, bot_user: str) -> tuple[Quote | None, Quote | None]:
    """(a linked message, a forwarded one) from a message's legacy attachments: Slack
    puts a forward there with `is_share`, and the unfurl of a linked message with
    `is_msg_unfurl` alone."""
    quote = forwarded = None
    for item in attachments if isinstance(attachments, list) else ():
        if not isinstance(item, dict) or not (item.get("is_share") or item.get("is_msg_unfurl")):
            continue
        author = as_str(item.get("author_id"))
        name = as_str(item.get("author_name")) or as_str(item.get("author_subname")) or author
        text = slack_text(as_str(item.get("text")) or as_str(item.get("fallback")), bot_user)
        found = Quote(text, None, by_tandem=True) if author == bot_user else \
            Quote(text, User(author, name)) if author else \
            Quote(text, None, origin=as_str(item.get("channel_name")) or "another conversation")
        if item.get("is_share"):
            forwarded = forwarded or found
        else:
            quote = quote or found
    return quote, forwarded


def edit_of(event: dict[str, Any], bot_user: str, groups: Groups | None = None) -> Edit | None:
    """A `message_changed` or `message_deleted` event of a user's message as the core's
    `Edit`; None for Tandem's own messages, bots, and a change that leaves the text as it
    was (Slack adds a link's preview that way)."""
    subtype = event.get("subtype")
    before = as_dict(event.get("previous_message"))
    after = as_dict(event.get("message")) if subtype == "message_changed" else before
    user, channel = as_str(after.get("user")), as_str(event.get("channel"))
    ts = as_str(after.get("ts")) or as_str(event.get("deleted_ts"))
    if subtype not in ("message_changed", "message_deleted") or not (user and channel and ts) \
            or user == bot_user or after.get("bot_id"):
        return None
    raw, was = as_str(after.get("text")), as_str(before.get("text"))
    if subtype == "message_changed" and raw == was:
        return None
    root = as_str(after.get("thread_ts"))
    thread = root if root and root != ts else None
    mentioned = f"<@{bot_user}>" in raw or f"<@{bot_user}>" in was
    dm = event.get("channel_type") == "im"
    key = thread if dm else (thread or ts) if mentioned or thread else None
    member = user if groups is not None and groups.sessions == "per_user" and not dm \
        and key is not None else None
    return Edit(ConvKey(PLATFORM, channel, key, member),
                User(user, "", as_str(after.get("team")) or None),
                ts, slack_text(raw, bot_user), deleted=subtype == "message_deleted",
                ref=f"slack:{channel}:{as_str(event.get('ts'))}:edit")


def as_dict(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def as_str(value: Any) -> str:
    return value if isinstance(value, str) else ""


def aside_of(msg: Incoming, who: User) -> Aside:
    """Channel talk not addressed to Tandem, kept as context."""
    text = msg.text
    if msg.forwarded is not None:
        text = f"{text} (forwarding: «{msg.forwarded.text}»)".strip()
    return Aside(msg.conv, who, text or "(a file)", msg.ts, msg.quote,
                 f"slack:{msg.channel}:{msg.ts}")


def inbound_of(msg: Incoming, who: User, context: str | None,
               groups: Groups | None = None) -> Inbound:
    """A message as the core's item: a message, a command, or a cancel (`/stop`); with
    `groups.sessions: per_user`, in the sender's own conversation in a channel."""
    ref = f"slack:{msg.channel}:{msg.ts}"
    command = parse_command(msg.text)
    conv = msg.conv
    if groups is not None and groups.sessions == "per_user" and not msg.dm:
        conv = replace(conv, member=who.id)
    if command is None:
        empty = "" if msg.attachments or msg.forwarded else "(a mention without a message)"
        around = ConvKey(PLATFORM, msg.channel, msg.thread) if msg.conv.thread_id == msg.ts \
            else conv.place if conv.member else None
        return UserMessage(conv, who, msg.text or empty, ref=ref, attachments=msg.attachments,
                           context=context, message_id=msg.ts, quote=msg.quote,
                           forwarded=msg.forwarded, around=around)
    name, args = command
    if name in ("stop", "cancel"):
        return Cancel(conv, who, ref=ref)
    return Command(conv, who, name, args, ref=ref)


@dataclass(frozen=True, slots=True)
class Press:
    """A button press: who pressed what, on which message, in which conversation."""

    conv: ConvKey
    user: str
    team: str | None
    message_ts: str
    value: str
    action_id: str
    ref: str


def press_of(body: dict[str, Any]) -> Press | None:
    """A `block_actions` payload as a `Press`; None without a user or a channel."""
    user = as_dict(body.get("user"))
    uid = as_str(user.get("id"))
    container = as_dict(body.get("container"))
    channel = as_str(container.get("channel_id")) \
        or as_str(as_dict(body.get("channel")).get("id"))
    if not uid or not channel:
        return None
    message_ts = as_str(container.get("message_ts"))
    thread = as_str(container.get("thread_ts"))
    # A card Tandem posted at the top of a DM may later become a thread's root.
    conv = ConvKey(PLATFORM, channel, thread if thread and thread != message_ts else None)
    actions = body.get("actions")
    action = as_dict(actions[0] if isinstance(actions, list) and actions else None)
    return Press(conv, uid, as_str(user.get("team_id")) or None, message_ts,
                 as_str(action.get("value")), as_str(action.get("action_id")),
                 f"slack:{channel}:{action.get('action_ts')}:{uid}")


def command_of(body: dict[str, Any], who: User) -> Inbound:
    """`/tandem <command>` as the core's item (`/tandem` alone asks for help)."""
    conv = ConvKey(PLATFORM, as_str(body.get("channel_id")), None)
    name, args = parse_command("/" + str(body.get("text") or "help").strip()) or ("help", "")
    if name in ("stop", "cancel"):
        return Cancel(conv, who)
    return Command(conv, who, name, args, ref=f"slack:cmd:{body.get('trigger_id')}")


def teams(body: dict[str, Any]) -> set[str]:
    """Every workspace a Slack payload names: an Events API envelope's `team_id` and its
    event's `team` and `user_team`; a button press's `team.id` and `user.team_id`; a slash
    command's `team_id`. Empty when none does."""
    def part(key: str) -> dict[str, Any]:
        value = body.get(key)
        return value if isinstance(value, dict) else {}

    event, team, user = part("event"), part("team"), part("user")
    named = (body.get("team_id"), event.get("team"), event.get("user_team"),
             team.get("id"), user.get("team_id"))
    return {t for t in named if isinstance(t, str) and t}


_IDS = ("enterprise_id", "team_id", "user_id", "channel_id")
_HOLDERS = {"enterprise": ("id",), "team": ("id", "enterprise_id"), "user": ("id", "team_id"),
            "channel": ("id",), "view": ("team_id", "app_installed_team_id")}
"""Fields bolt reads as an object (all but `view` may be a bare id instead), and the ids
it reads from that object."""
_INNER = ("event", "message", "previous_message", "item", "assistant_thread")
"""The parts of a payload bolt looks into for ids when the payload itself has none."""
_CALLBACKS = ("interactive_message", "dialog_submission", "dialog_cancellation",
              "workflow_step_edit")


def odd_shape(body: dict[str, Any]) -> str | None:
    """What in a payload would make slack-bolt raise while it reads the request, or None.

    Bolt's `extract_*` functions (`slack_bolt/request/internals.py`) look for ids in the
    payload, its first authorization, its event and that event's message, previous
    message, item or assistant thread. They take `*_id` fields as ids, `enterprise`,
    `team`, `user` and `channel` as an id or an object holding one, `authorizations` as a
    list of objects and `view` as an object. Its middleware reads `event` as an object
    whenever the key is there, and its matchers (`listener_matcher/builtins.py`) read an
    event's `type`, the first action of a button press and its `action_id`, and a
    `callback_id`. Anything else in a payload bolt leaves alone, and so does this."""
    if "event" in body and not isinstance(body["event"], dict):
        return "`event` is not an object"
    return _odd_kind(body) or _odd_ids(body) or _odd_response_urls(body)


def _odd_kind(body: dict[str, Any]) -> str | None:
    """What the matchers and bolt's `to_*` payload helpers read, by payload type."""
    kind, event, view = body.get("type"), body.get("event"), body.get("view")
    if kind == "event_callback" and event is not None and not isinstance(event.get("type"), str):
        return "`event.type` is not a string"
    if kind == "block_actions" and "actions" in body:
        actions = body["actions"]
        first = actions[0] if isinstance(actions, list) and actions else None
        if not (isinstance(first, dict) and isinstance(first.get("action_id"), str)):
            return "`actions` does not start with an action that has an `action_id`"
    if kind in _CALLBACKS and "callback_id" in body:
        if not isinstance(body["callback_id"], str | None):
            return "`callback_id` is not a string"
        actions = body.get("actions")
        if kind == "interactive_message" and not (isinstance(actions, list) and actions):
            return "`actions` is not a list of actions"
        if kind == "workflow_step_edit" and "workflow_step" not in body:
            return "`workflow_step` is missing"
    if kind == "view_submission" and isinstance(view, dict) and "callback_id" in view \
            and "type" not in view:
        return "`view.type` is missing"
    return None


def _odd_ids(body: dict[str, Any]) -> str | None:
    """The first id field, in the payload or a part bolt looks into, of the wrong type."""
    todo: list[tuple[str, dict[str, Any]]] = [("", body)]
    while todo:
        path, part = todo.pop()
        auths = part.get("authorizations")
        if auths is not None and not (isinstance(auths, list)
                                      and (not auths or isinstance(auths[0], dict))):
            return f"`{path}authorizations` is not a list of objects"
        odd = _odd_field(part)
        if odd is not None:
            return f"`{path}{odd[0]}` {odd[1]}"
        if auths:
            todo.append((f"{path}authorizations[0].", auths[0]))
        todo.extend((f"{path}{key}.", part[key]) for key in _INNER
                    if isinstance(part.get(key), dict))
    return None


def _odd_field(part: dict[str, Any]) -> tuple[str, str] | None:
    """One part's first misshapen id field and what is wrong with it."""
    for key in _IDS:
        if not isinstance(part.get(key), str | None):
            return key, "is not a string"
    for key, ids in _HOLDERS.items():
        value = part.get(key)
        if isinstance(value, dict):
            wrong = next((i for i in ids if not isinstance(value.get(i), str | None)), None)
            if wrong is not None:
                return f"{key}.{wrong}", "is not a string"
        elif key == "view" and value is not None:
            return key, "is not an object"
        elif not isinstance(value, str | None):
            return key, "is neither an id nor an object"
    return None


def _odd_response_urls(body: dict[str, Any]) -> str | None:
    """Bolt reads `response_urls[0].response_url` when there is no `response_url`."""
    if "response_url" in body or "response_urls" not in body:
        return None
    urls = body["response_urls"]
    if isinstance(urls, list) and (not urls or isinstance(urls[0], dict)):
        return None
    return "`response_urls` is not a list of objects"


def parse_command(text: str) -> tuple[str, str] | None:
    """`/name args` (a word of letters after the slash), or None for ordinary text."""
    match = _COMMAND.fullmatch(text.strip())
    if match is None:
        return None
    return match.group(1), (match.group(2) or "").strip()
