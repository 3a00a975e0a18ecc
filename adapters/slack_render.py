"""Slack rendering: Markdown to mrkdwn, and the Block Kit the adapter posts.

Pure functions only (no I/O). Limits that matter here: a section's text holds at most
3,000 characters, a message at most 50 blocks, a button value 2,000 characters. Every
message also carries a plain `text` fallback (notifications, screen readers).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from adapters.live import split_text
from bot.buttons import ApprovalButton, CancelButton, pack
from bot.events import Button, Phase, Progress, User, Verdict

Block = dict[str, Any]

SECTION_CHARS = 2_900
"""Text per section block (Slack allows 3,000; the rest is headroom)."""
CODE_CHARS = 2_800
"""Call summary per card section, before the code fence around it."""
MAX_BUTTONS = 25
SECTIONS_PER_MESSAGE = 4
"""Slack documents 50 blocks, but rejects messages whose blocks hold much over ~13,000
characters (`msg_blocks_too_long`), so a message carries at most 4 full sections."""
CANCEL_ACTION = "tandem_cancel"
BUTTON_ACTION = "tandem_button"
VERDICT_ACTIONS = {Verdict.APPROVE: "tandem_approve", Verdict.DENY: "tandem_deny",
                   Verdict.ALWAYS: "tandem_always"}
THINKING = "⏳ Thinking…"
WAITING = "⏸ Waiting for approval"
OUTCOMES = {"approved": "✅ Approved by {by}", "denied": "❌ Denied by {by}",
            "always": "✅ Always allowed in this chat by {by}",
            "expired": "⌛ Expired — not run", "cancelled": "⏹ Cancelled — not run",
            "superseded": "↪️ Skipped — a new message came first"}
_USER_ID = re.compile(r"[UW][A-Z0-9]{2,}")

# ---- Markdown -> mrkdwn ----------------------------------------------------------------

_FENCED = re.compile(r"```[^\n`]*\n?(.*?)(?:```|\Z)", re.S)
_INLINE_CODE = re.compile(r"`([^`\n]+)`")
_LINK = re.compile(r"!?\[([^\]\n]+)\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
_HEADING = re.compile(r"^\s{0,3}#{1,6}\s+(.+?)\s*#*\s*$", re.M)
_BULLET = re.compile(r"^(\s*)[-*+]\s+(?=\S)", re.M)
_BOLD = re.compile(r"\*\*(?=\S)(.+?)(?<=\S)\*\*|__(?=\S)(.+?)(?<=\S)__")
_ITALIC = re.compile(r"(?<![\w*])\*(?=[^\s*])(.+?)(?<=[^\s*])\*(?![\w*])")
_STRIKE = re.compile(r"~~(?=\S)(.+?)(?<=\S)~~")
_QUOTE = re.compile(r"^(\s*)&gt;", re.M)
_STAR = "\x01"  # a bold marker while single-star italics are converted
_SLOT = "\x02"  # protected spans (code, links) while the rest is converted


def escape(text: str) -> str:
    """Slack's three control characters."""
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def to_mrkdwn(markdown: str) -> str:
    """Common Markdown (as models write it) to Slack mrkdwn; code is kept verbatim."""
    out: list[str] = []
    pos = 0
    for match in _FENCED.finditer(markdown):
        out.append(_inline(markdown[pos:match.start()]))
        code = match.group(1).rstrip("\n")
        out.append(f"```\n{escape(code)}\n```" if code else "```\n \n```")
        pos = match.end()
    out.append(_inline(markdown[pos:]))
    return "".join(out)


def _inline(text: str) -> str:
    slots: list[str] = []

    def keep(rendered: str) -> str:
        slots.append(rendered)
        return f"{_SLOT}{len(slots) - 1}{_SLOT}"

    text = _INLINE_CODE.sub(lambda m: keep(f"`{escape(m.group(1))}`"), text)
    text = _LINK.sub(lambda m: keep(f"<{escape(m.group(2))}|"
                                    f"{escape(m.group(1)).replace('|', '¦')}>"), text)
    text = _QUOTE.sub(r"\1>", escape(text))
    text = _HEADING.sub(lambda m: f"{_STAR}{m.group(1).replace('**', '')}{_STAR}", text)
    text = _BULLET.sub(r"\1• ", text)
    text = _BOLD.sub(lambda m: f"{_STAR}{m.group(1) or m.group(2)}{_STAR}", text)
    text = _ITALIC.sub(r"_\1_", text)
    text = _STRIKE.sub(r"~\1~", text).replace(_STAR, "*")
    return re.sub(f"{_SLOT}(\\d+){_SLOT}", lambda m: slots[int(m.group(1))], text)


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
    rendered = to_mrkdwn(markdown if markdown.strip() else "…")
    if len(rendered) <= SECTION_CHARS:
        return [section(rendered)]
    return [section(part) for part in split_text(rendered, SECTION_CHARS)]


def fallback(markdown: str) -> str:
    """The plain `text` that travels with the blocks (shown in notifications)."""
    return to_mrkdwn(markdown)[:3_000] or "…"


def message(markdown: str, *, cancel: bool = False,
            buttons: Sequence[Button] = ()) -> list[list[Block]]:
    """One or more messages' blocks for a text (a long text continues in more messages);
    the buttons go on the last one."""
    body = sections(markdown)
    tail: list[Block] = []
    if cancel:
        tail = actions([button("⏹ Cancel", CANCEL_ACTION, pack(CancelButton()))])
    elif buttons:
        tail = actions([button(b.label, f"{BUTTON_ACTION}_{i}", b.data)
                        for i, b in enumerate(buttons)])
    room = SECTIONS_PER_MESSAGE
    chunks = [body[i:i + room] for i in range(0, len(body), room)] or [[]]
    chunks[-1] = chunks[-1] + tail
    return chunks


def progress_text(event: Progress) -> str:
    if event.text:
        return event.text
    if event.phase is Phase.TOOL and event.tool:
        return f"⚙️ Running `{event.tool}`… ({event.elapsed_s:.0f} s)"
    if event.phase is Phase.APPROVAL:
        return f"{WAITING}…"
    return THINKING


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


def approval_card(approval_id: str, tool: str, summary: str, requester: User,
                  expires_in_s: int) -> Card:
    head = f"🔐 Tandem wants to run `{escape(tool)}`"
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
    text = f"🔐 Tandem wants to run `{tool}`: approve or deny"
    if len(code) <= SECTIONS_PER_MESSAGE:
        return Card(text, [section(head), *code, foot], buttons, [])
    per = SECTIONS_PER_MESSAGE
    preamble = [code[i:i + per] for i in range(0, len(code), per)]
    note = (f"{head}\nThe call is too long for this card; it is shown in full in the "
            f"{len(preamble)} messages just above.")
    return Card(text, [section(note), foot], buttons, preamble)
