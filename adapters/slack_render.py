"""Slack's formats, both ways, as pure functions (no I/O; `adapters.slack` does that).

Out: Markdown to mrkdwn, and the Block Kit messages and approval cards the adapter posts.
Limits that matter: a section's text holds at most 3,000 characters, a message at most 50
blocks, a button value 2,000 characters; every message also carries a plain `text`
fallback (notifications, screen readers). In: a Slack event as an `Incoming` message (or
None when it is not for Tandem), Slack's markup as plain text, `/commands`.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from adapters.live import THINKING, split_text
from adapters.markdown_blocks import FENCE, cells, fence_body, table_end, unquote, width
from adapters.slack_files import attachments as shared_files
from bot.core.buttons import ApprovalButton, CancelButton, pack
from bot.core.events import Attachment, Button, ConvKey, Phase, Progress, User, Verdict

Block = dict[str, Any]
PLATFORM = "slack"

SECTION_CHARS = 2_900
"""Text per section block (Slack allows 3,000; the rest is headroom)."""
CODE_CHARS = 2_800
"""Call summary per card section, before the code fence around it."""
MAX_BUTTONS = 25
FALLBACK_CHARS = 3_000
SECTIONS_PER_MESSAGE = 4
"""Slack documents 50 blocks, but rejects messages whose blocks hold much over ~13,000
characters (`msg_blocks_too_long`), so a message carries at most 4 full sections."""
CANCEL_ACTION = "tandem_cancel"
BUTTON_ACTION = "tandem_button"
VERDICT_ACTIONS = {Verdict.APPROVE: "tandem_approve", Verdict.DENY: "tandem_deny",
                   Verdict.ALWAYS: "tandem_always"}
OUTCOMES = {"approved": "✅ Approved by {by}", "denied": "❌ Denied by {by}",
            "always": "✅ Always allowed in this chat by {by}",
            "expired": "⌛ Expired — not run", "cancelled": "⏹ Cancelled — not run",
            "superseded": "↪️ Skipped — a new message came first"}
_USER_ID = re.compile(r"[UW][A-Z0-9]+")

# ---- Markdown -> mrkdwn ----------------------------------------------------------------

_CODE_SPAN = re.compile(r"(?<!`)(`+)(?!`)([^\n]+?)(?<!`)\1(?!`)")
_LINK = re.compile(r"!?\[([^\]\n]+)\]\([ \t]*<?((?:[^()\s<>]|\([^()\s<>]*\))+)>?"
                   r"(?:[ \t]+\"[^\"\n]*\")?[ \t]*\)")
_ESCAPED = re.compile(r"\\(?:([!-)+-/:-@\[\\\]^{|}])|([*_~`])(?=\s|$))", re.M)
"""A backslash-escaped punctuation character (`\\#`, `\\[`): shown as itself, never
markup. Slack has no escapes: `*`, `_`, `~` and a backtick are only unescaped where they
cannot start formatting (before a space), elsewhere they keep their backslash."""
_AUTOLINK = re.compile(r"<((?:https?://|mailto:)[^\s<>|\x01\x02]+)>", re.I)
_LINK_TARGET = re.compile(r"(?:https?://|mailto:)\S", re.I)
"""What a Markdown link may point at. Anything else (`!here`, `@U…`, `#C…`, `slack://`)
would be a mention or a command to Slack, so it stays text."""
_HEADING = re.compile(r"^[ \t]{0,3}#{1,6}[ \t]+(.+?)(?:[ \t]+#+)?[ \t]*$", re.M)
_RULE = re.compile(r"^ {0,3}(?:([-_])(?:[ \t]*\1){2,}|\*\*\*|\*(?:[ \t]+\*){2,})[ \t]*$", re.M)
_BULLET = re.compile(r"^([ \t]*)[-*+][ \t]+(?=\S)(?:\[([ xX])\][ \t]+)?", re.M)
_BOLD_ITALIC = re.compile(r"(?<![\w*])\*\*\*(?=[^\s*])(.+?)(?<=[^\s*])\*\*\*(?![\w*])")
_BOLD = re.compile(r"\*\*(?=[^\s./,;:)\]}|=>])(.+?)(?<=[^\s/\\])\*\*"
                   r"|(?<!\w)__(?=\S)(?!\w+__(?!\w))(.+?)(?<=\S)__(?!\w)")
"""`**bold**` (not inside a word: `x**2`) and `__bold__` (not a lone identifier:
`__init__`)."""
_ITALIC = re.compile(r"(?<![\w*)\]}/\\])\*(?=[^\s*.,;:/)\]}|=>])(.+?)"
                     r"(?<=[^\s*/(\[{|=<_\\])\*(?![\w*(\[{])")
"""`*italic*`, but not arithmetic or globs: `2*3*4`, `(a)*(b)`, `*.py`, `test_*.py`."""
_STRIKE = re.compile(r"~~(?=\S)(.+?)(?<=\S)~~")
_QUOTE = re.compile(r"^(\s*)&gt;", re.M)
_STAR = "\x01"  # a bold marker while single-star italics are converted
_SLOT = "\x02"  # protected spans (code, links) while the rest is converted
_NO_FENCE = "`\u200b`\u200b`"
"""Three backticks that do not open or close a Slack code block."""
TABLE_COLUMNS = 72
"""The widest table shown aligned in a code block; a wider one becomes a line per row."""


def escape(text: str) -> str:
    """Slack's three control characters. Escaped, `<!here>` or `<@U…>` is shown as typed
    and pings nobody."""
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def _link(match: re.Match[str]) -> str | None:
    """A Markdown link as a Slack link `<url|text>`, or None when its target is not a web
    or mail address. Neither part can end the link early: a `|` in the address is
    percent-encoded, one in the text becomes `¦`, and `<`, `>` are escaped."""
    text, url = match.group(1), match.group(2)
    if not _LINK_TARGET.match(url):
        return None
    return f"<{escape(url).replace('|', '%7C')}|{escape(text).replace('|', '¦')}>"


@lru_cache(maxsize=512)
def to_mrkdwn(markdown: str) -> str:
    """Common Markdown (as models write it) to Slack mrkdwn; code is kept verbatim.

    Fenced code (``` or ~~~ of any length, indented under a list item or inside a quote)
    becomes a Slack code block, tables an aligned code block (a line per row when wide or
    linked), `#` headings bold lines, bullets •, task boxes ☐ ☑, nested quotes one quote,
    rules ───. Markers only count at word edges: `snake_case`, `__init__`, `2*3*4` and
    `*.py` stay as typed."""
    lines = markdown.split("\n")
    out: list[str] = []
    prose: list[str] = []
    i = 0
    while i < len(lines):
        inner, quoted = unquote(lines[i])
        fence = FENCE.match(inner)
        table = table_end(lines, i, quoted) if "|" in inner and not fence else 0
        if not fence and not table:
            prose.append(f"> {inner}" if quoted else inner)
            i += 1
            continue
        if prose:
            out.append(_inline("\n".join(prose)))
            prose = []
        if fence:
            code, i = _code_block(lines, i + 1, fence, quoted)
            out.append(code)
        else:
            rows = [unquote(line)[0] for line in lines[i:table]]
            aligned = _aligned_table(rows)
            if aligned is None:
                out.append(_inline("\n".join(("> " if quoted else "") + row
                                             for row in _table_lines(rows))))
            else:
                out.append(aligned)
            i = table
    if prose:
        out.append(_inline("\n".join(prose)))
    return "\n".join(out)


def _code_block(lines: list[str], i: int, fence: re.Match[str],
                quoted: bool) -> tuple[str, int]:
    """The fenced block whose body starts at line `i` as a Slack code block (out of any
    quote), and the line after its end."""
    body, i = fence_body(lines, i, fence, quoted)
    return _code("\n".join(body).strip("\n")), i


def _code(code: str) -> str:
    return f"```\n{escape(code).replace('```', _NO_FENCE)}\n```" if code.strip() \
        else "```\n \n```"


def _table_lines(rows: list[str]) -> list[str]:
    """A table as Markdown lines, one per row: cells between ` | `, the header bold."""
    head, _, *body = [cells(row) for row in rows]
    title = " | ".join(cell.replace("**", "") for cell in head)
    return [f"**{title}**" if title.strip() else "", *(" | ".join(row) for row in body)]


def _plain(cell: str) -> str:
    """A cell's text without its inline markup."""
    text = _CODE_SPAN.sub(lambda m: m.group(2).strip(), cell)
    text = re.sub(r"\*\*(?=\S)(.+?)(?<=\S)\*\*|~~(?=\S)(.+?)(?<=\S)~~",
                  lambda m: m.group(1) or m.group(2), text)
    return _ITALIC.sub(r"\1", text)


def _aligned_table(rows: list[str]) -> str | None:
    """A table aligned in a code block, or None when it holds links or is too wide."""
    if any(_LINK.search(row) for row in rows):
        return None
    split = [cells(row) for i, row in enumerate(rows) if i != 1]
    texts = [[_plain(cell) for cell in row] for row in split]
    count = max(len(row) for row in texts)
    texts = [row + [""] * (count - len(row)) for row in texts]
    rule = cells(rows[1])
    right = [c.endswith(":") and not c.startswith(":") for c in rule] + [False] * count
    widths = [max(width(row[c]) for row in texts) for c in range(count)]
    if sum(widths) + 3 * (count - 1) > TABLE_COLUMNS:
        return None

    def cell(text: str, c: int) -> str:
        pad = " " * (widths[c] - width(text))
        return pad + text if right[c] else text + pad

    lines = [" | ".join(cell(text, c) for c, text in enumerate(row)).rstrip()
             for row in texts]
    lines.insert(1, "-+-".join("-" * w for w in widths))
    return _code("\n".join(lines))


def _code_span(match: re.Match[str]) -> str:
    """A code span; one holding a backtick (which would end Slack's) is shown as text."""
    body = match.group(2)
    if len(match.group(1)) > 1:
        body = body.strip() or body
    if "`" in body:
        return escape(body)
    return f"`{escape(body)}`"


def _inline(text: str) -> str:
    text = text.replace(_SLOT, "").replace(_STAR, "")  # the markers are Tandem's alone
    slots: list[str] = []

    def keep(rendered: str) -> str:
        slots.append(rendered)
        return f"{_SLOT}{len(slots) - 1}{_SLOT}"

    def autolink(match: re.Match[str]) -> str:
        url = escape(match.group(1)).replace("|", "%7C")
        return keep(f"<{url}>")

    text = _CODE_SPAN.sub(lambda m: keep(_code_span(m)), text)
    text = _ESCAPED.sub(lambda m: keep(escape(m.group(1) or m.group(2))), text)
    text = _LINK.sub(lambda m: keep(link) if (link := _link(m)) else m.group(0), text)
    text = _AUTOLINK.sub(autolink, text)
    text = _QUOTE.sub(r"\1>", escape(text))
    text = _HEADING.sub(lambda m: f"{_STAR}{m.group(1).replace('**', '')}{_STAR}", text)
    text = _RULE.sub("───", text)
    text = _BULLET.sub(lambda m: f"{m.group(1)}• " + {" ": "☐ ", "x": "☑ ", "X": "☑ "}.get(
        m.group(2) or "", ""), text)
    text = _BOLD_ITALIC.sub(lambda m: f"{_STAR}_{m.group(1)}_{_STAR}", text)
    text = _BOLD.sub(lambda m: f"{_STAR}{m.group(1) or m.group(2)}{_STAR}", text)
    text = _ITALIC.sub(r"_\1_", text)
    text = _STRIKE.sub(r"~\1~", text).replace(_STAR, "*").replace("```", _NO_FENCE)
    return _filled(text, slots)


def _filled(text: str, slots: list[str]) -> str:
    """The protected spans back in place, also those inside another (code in a link)."""
    return re.sub(f"{_SLOT}(\\d+){_SLOT}", lambda m: _filled(slots[int(m.group(1))], slots),
                  text)


# ---- blocks ----------------------------------------------------------------------------


def section(mrkdwn: str) -> Block:
    return {"type": "section", "text": {"type": "mrkdwn", "text": mrkdwn}}


def context(mrkdwn: str) -> Block:
    return {"type": "context", "elements": [{"type": "mrkdwn", "text": mrkdwn}]}


def button(label: str, action_id: str, value: str, style: str | None = None) -> Block:
    out: Block = {"type": "button", "action_id": action_id, "value": value,
                  "text": {"type": "plain_text", "text": label[:75], "emoji": True}}
    if style:
        out["style"] = style
    return out


def actions(elements: Sequence[Block]) -> list[Block]:
    """Buttons in action blocks of at most 25 elements each."""
    return [{"type": "actions", "elements": list(elements[i:i + MAX_BUTTONS])}
            for i in range(0, len(elements), MAX_BUTTONS)]


def sections(markdown: str) -> list[Block]:
    """A Markdown text as section blocks, each within Slack's 3,000 characters."""
    return [section(part) for part in _parts(markdown if markdown.strip() else "…",
                                             SECTION_CHARS)]


def _parts(markdown: str, limit: int) -> list[str]:
    """mrkdwn parts of at most `SECTION_CHARS`: the Markdown is split (between paragraphs,
    never inside code) and each part rendered; a part that grows past the limit (escaping
    makes `&` five characters) is split smaller, and only a short one that still does has
    its mrkdwn cut (never inside an entity like `&amp;`)."""
    out: list[str] = []
    for part in split_text(markdown, limit) if len(markdown) > limit else [markdown]:
        rendered = to_mrkdwn(part)
        if len(rendered) <= SECTION_CHARS:
            out.append(rendered)
        elif limit > 400:
            out += _parts(part, max(16, limit * SECTION_CHARS // len(rendered) * 9 // 10))
        else:
            out += _cut(rendered)
    return out


def _cut(mrkdwn: str) -> list[str]:
    parts = split_text(mrkdwn, SECTION_CHARS)
    for i in range(len(parts) - 1):
        broken = re.search(r"&[a-z]{0,3}$", parts[i])
        if broken:  # an entity cut in two: all of it goes to the next part
            parts[i], parts[i + 1] = parts[i][:broken.start()], broken.group(0) + parts[i + 1]
    return [part for part in parts if part]


@dataclass(frozen=True, slots=True)
class Outgoing:
    """One message: its blocks and the plain `text` that travels with them (shown in
    notifications; Slack warns when it is missing)."""

    text: str
    blocks: list[Block]


def _outgoing(body: list[Block], tail: list[Block]) -> Outgoing:
    text = "\n".join(b["text"]["text"] for b in body)
    return Outgoing(text[:FALLBACK_CHARS] or "…", body + tail)


def live(markdown: str, *, cancel: bool, turn: int | None = None) -> Outgoing:
    """One part of a streamed answer (at most `SECTION_CHARS` of Markdown) as one message,
    with the Cancel button (for its own turn) while the turn runs."""
    tail = actions([button("⏹ Cancel", CANCEL_ACTION, pack(CancelButton(turn)))]) \
        if cancel else []
    return _outgoing(sections(markdown), tail)


def messages(markdown: str, buttons: Sequence[Button] = ()) -> list[Outgoing]:
    """A text of any length as messages of a few sections each; buttons on the last."""
    body = sections(markdown)
    per = SECTIONS_PER_MESSAGE
    chunks = [body[i:i + per] for i in range(0, len(body), per)]
    tail = actions([button(b.label, f"{BUTTON_ACTION}_{i}", b.data)
                    for i, b in enumerate(buttons)])
    return [_outgoing(chunk, tail if i == len(chunks) - 1 else [])
            for i, chunk in enumerate(chunks)]


def progress_text(event: Progress) -> str:
    if event.text:
        return event.text
    if event.phase is Phase.TOOL and event.tool:
        return f"⚙️ Running `{event.tool}`… ({event.elapsed_s:.0f} s)"
    return THINKING


def assistant_status(text: str) -> str:
    """A placeholder's status line as an assistant thread's status ("is thinking…")."""
    if text.startswith("⚙️ Running "):
        return "is running " + text.removeprefix("⚙️ Running ")
    return "is thinking…"


def mention(user: User | None) -> str:
    if user is None:
        return "someone"
    if _USER_ID.fullmatch(user.id):
        return f"<@{user.id}>"
    return escape(user.name or user.id)


def outcome_line(outcome: str, by: User | None) -> str:
    return OUTCOMES.get(outcome, "Decided: {by}").format(by=mention(by))


# ---- approval cards --------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Card:
    text: str
    blocks: list[Block]
    """Without the buttons: what stays on the card once it is decided."""
    buttons: list[Block]
    preamble: list[list[Block]]
    """Messages posted before the card when the call does not fit on it."""


def code_sections(summary: str) -> list[Block]:
    """The call verbatim in code-block sections of at most ~2,800 characters each."""
    text = escape(summary).replace("```", "`\u200b`\u200b`")
    pieces: list[str] = []
    while len(text) > CODE_CHARS:
        cut = text.rfind("\n", 0, CODE_CHARS)
        if cut > 0:
            pieces.append(text[:cut])
            text = text[cut + 1:]
            continue
        cut = CODE_CHARS
        amp = text.rfind("&", cut - 5, cut)
        if amp > 0 and ";" not in text[amp:cut]:
            cut = amp  # never split an entity like &amp;
        pieces.append(text[:cut])
        text = text[cut:]
    pieces.append(text)
    return [section(f"```\n{piece or ' '}\n```") for piece in pieces]


def expires(seconds: int) -> str:
    if seconds < 120:
        return f"{seconds} s"
    if seconds < 7200:
        return f"{round(seconds / 60)} min"
    return f"{round(seconds / 3600)} h"


_EXPIRY = re.compile(r" · expires in [^\n]*$")


def decided(blocks: list[Block], line: str) -> list[Block]:
    """A card's blocks once it is decided: its outcome below, its expiry gone."""
    out = []
    for block in blocks:
        if block.get("type") == "context":
            block = {**block, "elements": [
                {**e, "text": _EXPIRY.sub("", str(e.get("text", "")))}
                for e in block.get("elements", [])]}
        out.append(block)
    return [*out, context(line)]


def approval_card(approval_id: str, tool: str, summary: str, requester: User,
                  expires_in_s: int, *, reason: str | None = None) -> Card:
    """The card for one call; `reason` (why a human is asked although the policy allows
    the tool) goes on its own line under the title, and at the end of the fallback text."""
    head = f"🔐 Tandem wants to run `{escape(tool)}`"
    if reason:
        head += f"\n⚠️ {escape(reason)}"
    code = code_sections(summary)
    foot = context(f"Requested by {mention(requester)} · expires in {expires(expires_in_s)}")
    buttons = actions([
        button("Approve", VERDICT_ACTIONS[Verdict.APPROVE],
               pack(ApprovalButton(approval_id, Verdict.APPROVE)), "primary"),
        button("Deny", VERDICT_ACTIONS[Verdict.DENY],
               pack(ApprovalButton(approval_id, Verdict.DENY)), "danger"),
        button("Always in this channel", VERDICT_ACTIONS[Verdict.ALWAYS],
               pack(ApprovalButton(approval_id, Verdict.ALWAYS))),
    ])
    text = f"🔐 Tandem wants to run `{escape(tool)}`: approve or deny"
    if reason:
        text += f". {escape(reason)}"
    if len(code) <= SECTIONS_PER_MESSAGE:
        return Card(text, [section(head), *code, foot], buttons, [])
    per = SECTIONS_PER_MESSAGE
    preamble = [code[i:i + per] for i in range(0, len(code), per)]
    note = (f"{head}\nThe call is too long for this card; it is shown in full in the "
            f"{len(preamble)} messages just above.")
    return Card(text, [section(note), foot], buttons, preamble)


# ---- inbound: Slack payloads in Tandem's terms ---------------------------------------

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


def slack_text(text: str, bot_user: str) -> str:
    """Slack's message markup to plain text: the bot's mention removed, links and
    entities undone."""
    text = text.replace(f"<@{bot_user}>", " ").strip()
    text = _SLACK_LINK.sub(lambda m: f"{m.group(2)} ({m.group(1)})" if m.group(2) else m.group(1),
                     text)
    text = re.sub(r"[ \t]{2,}", " ", text)
    return text.replace("&lt;", "<").replace("&gt;", ">").replace("&amp;", "&")


def extract_message(event: dict[str, Any], bot_user: str) -> Incoming | None:
    """The message Tandem may answer, or None (edits, other bots, unmentioned channel talk)."""
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
    if dm:
        key = thread
    elif mentioned or thread:
        key = thread or ts
    else:
        return None
    attachments = shared_files(event.get("files"))
    team = event.get("user_team") or event.get("team")
    return Incoming(ConvKey(PLATFORM, channel, key), channel, ts, user,
                    team if isinstance(team, str) else None, slack_text(raw, bot_user),
                    thread, dm or mentioned, dm, attachments)


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
