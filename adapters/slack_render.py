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
from typing import Any

from adapters.live import THINKING, split_text
from adapters.slack_mrkdwn import escape, to_mrkdwn
from bot.core.buttons import ApprovalButton, CancelButton, pack
from bot.core.events import Button, Phase, Progress, User, Verdict

Block = dict[str, Any]

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
                   Verdict.SESSION: "tandem_session", Verdict.ALWAYS: "tandem_always"}
OUTCOMES = {"approved": "✅ Approved by {by}", "denied": "❌ Denied by {by}",
            "always": "✅ Always allowed in this chat by {by}",
            "session": "✅ Allowed for this conversation by {by}",
            "expired": "⌛ Expired — not run", "cancelled": "⏹ Cancelled — not run",
            "superseded": "↪️ Skipped — a new message came first"}
_USER_ID = re.compile(r"[UW][A-Z0-9]+")

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


def live(markdown: str, *, cancel: bool, turn: int | None = None,
         session: int | None = None) -> Outgoing:
    """One part of a streamed answer (at most `SECTION_CHARS` of Markdown) as one message,
    with the Cancel button (for its own turn) while the turn runs."""
    tail = actions([button("⏹ Cancel", CANCEL_ACTION, pack(CancelButton(turn, session)))]) \
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
        button("Approve once", VERDICT_ACTIONS[Verdict.APPROVE],
               pack(ApprovalButton(approval_id, Verdict.APPROVE)), "primary"),
        button("Deny", VERDICT_ACTIONS[Verdict.DENY],
               pack(ApprovalButton(approval_id, Verdict.DENY)), "danger"),
        button("This conversation", VERDICT_ACTIONS[Verdict.SESSION],
               pack(ApprovalButton(approval_id, Verdict.SESSION))),
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
