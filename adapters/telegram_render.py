"""Telegram texts: Markdown as Telegram HTML, approval cards, and commands and mentions
in what users write.

`to_html` turns the Markdown a model writes into the HTML subset Telegram accepts:
**bold**, *italic*, ~~strike~~, `code`, fenced code (`<pre><code class="language-x">`),
[links](https://…) (to `http(s)` and `mailto` only), `#` headings (bold) and `-`/`*`
bullets (•). Everything else is text with only `& < >` escaped (the model's own HTML
included, so it never makes a tag), and tags always nest properly, so any input gives
HTML Telegram parses. Unclosed markers stay literal; an unclosed code fence (a streaming
answer) runs to the end. The visible text is never longer than the Markdown.
"""

from __future__ import annotations

import html
import re

_FENCE_OPEN = re.compile(r"^ {0,3}```\s*([^`\s]*)\s*$")
_FENCE_CLOSE = re.compile(r"^ {0,3}```\s*$")
_LANGUAGE = re.compile(r"[\w+#.-]{1,32}")
_HEADING = re.compile(r"^ {0,3}#{1,6}\s+(.*?)\s*#*\s*$")
_BULLET = re.compile(r"^(\s*)[-*+]\s+(.*)$")
_TOKEN = re.compile(r"\\[!-/:-@\[-`{-~]|`+|\*\*|__|~~|\*|_|\[")
_LINK = re.compile(r"\[([^\]\n]+)\]\(([^()\s]+)\)")
_SAFE_URL = re.compile(r"(?:https?://|mailto:)[^\s<>\"']+", re.IGNORECASE)
"""Only web and mail links: `tg://user?id=…` would mention (and ping) a user, and
other schemes (`javascript:`, `data:`, `tg://resolve`…) stay text."""
_COMMAND = re.compile(r"/([A-Za-z0-9_]{1,32})(?:@([A-Za-z0-9_]+))?(?:\s+|$)(.*)", re.DOTALL)
_TAGS = {"**": "b", "__": "b", "*": "i", "_": "i", "~~": "s"}
_WORDY = ("_", "__")
"""Underscore markers do not open or close inside a word (snake_case stays text)."""


def escape(text: str) -> str:
    return html.escape(text, quote=False)


def to_html(markdown: str) -> str:
    """Telegram HTML for `markdown` (see the module docstring)."""
    out: list[str] = []
    code: list[str] | None = None
    language = ""
    for line in markdown.split("\n"):
        if code is None:
            opening = _FENCE_OPEN.match(line)
            if opening:
                code, language = [], opening.group(1)
            else:
                out.append(_line(line))
        elif _FENCE_CLOSE.match(line):
            out.append(_pre(code, language))
            code = None
        else:
            code.append(line)
    if code is not None:
        out.append(_pre(code, language))
    return "\n".join(out)


def _pre(lines: list[str], language: str) -> str:
    body = escape("\n".join(lines)) or " "
    if _LANGUAGE.fullmatch(language):
        return f'<pre><code class="language-{html.escape(language)}">{body}</code></pre>'
    return f"<pre>{body}</pre>"


def _line(line: str) -> str:
    heading = _HEADING.match(line)
    if heading:
        return f"<b>{_inline(heading.group(1))}</b>"
    bullet = _BULLET.match(line)
    if bullet:
        return f"{bullet.group(1)}• {_inline(bullet.group(2))}"
    return _inline(line)


def _inline(text: str, *, links: bool = True) -> str:
    """One line: code spans and links first, then emphasis matched on a stack."""
    out: list[str] = []
    stack: list[tuple[str, int]] = []  # marker, index of its placeholder in `out`
    pos = 0
    for token in _TOKEN.finditer(text):
        start = token.start()
        if start < pos:
            continue  # inside a code span or link already consumed
        out.append(escape(text[pos:start]))
        mark = token.group(0)
        pos = token.end()
        if mark.startswith("\\"):
            out.append(escape(mark[1]))
        elif mark.startswith("`"):
            pos = _code_span(text, mark, pos, out)
        elif mark == "[":
            pos = _link(text, start, out) if links else pos
            if pos == token.end():
                out.append("[")
        else:
            _emphasis(text, mark, start, pos, out, stack)
    out.append(escape(text[pos:]))
    return "".join(out)


def _code_span(text: str, run: str, pos: int, out: list[str]) -> int:
    closing = re.compile(f"(?<!`){run}(?!`)").search(text, pos)
    body = text[pos : closing.start()] if closing else ""
    if closing is None or not body.strip():
        out.append(escape(run))
        return pos
    if len(body) > 2 and body[0] == body[-1] == " ":
        body = body[1:-1]
    out.append(f"<code>{escape(body)}</code>")
    return closing.end()


def _link(text: str, start: int, out: list[str]) -> int:
    match = _LINK.match(text, start)
    if match is None or not _SAFE_URL.fullmatch(match.group(2)):
        return start + 1
    label = _inline(match.group(1), links=False)
    out.append(f'<a href="{html.escape(match.group(2), quote=True)}">{label}</a>')
    return match.end()


def _emphasis(text: str, mark: str, start: int, end: int, out: list[str],
              stack: list[tuple[str, int]]) -> None:
    before = text[start - 1] if start else " "
    after = text[end] if end < len(text) else " "
    can_open = not after.isspace()
    can_close = not before.isspace()
    if mark in _WORDY:
        can_open = can_open and not before.isalnum()
        can_close = can_close and not after.isalnum()
    depth = next((i for i in range(len(stack) - 1, -1, -1) if stack[i][0] == mark), None)
    index = stack[depth][1] if depth is not None else -1
    if depth is not None and can_close and any(out[index + 1 :]):
        del stack[depth:]  # markers opened inside and never closed stay literal text
        out[index] = f"<{_TAGS[mark]}>"
        out.append(f"</{_TAGS[mark]}>")
    elif can_open:
        stack.append((mark, len(out)))
        out.append(escape(mark))
    else:
        out.append(escape(mark))


# -- approval cards -------------------------------------------------------------------

CARD_SUMMARY_LIMIT = 3500
"""A longer call goes into an attached file; the card never shows a cut command."""

OUTCOMES = {
    "approved": "✅ Approved by {by}",
    "denied": "❌ Denied by {by}",
    "always": "✅ Always allowed in this chat by {by}",
    "expired": "⌛ Expired — not run",
    "cancelled": "⏹ Cancelled — not run",
    "superseded": "↪️ Skipped — a new message came first",
}


def duration(seconds: float) -> str:
    """`45 s`, `30 min`, `2 h`."""
    if seconds < 90:
        return f"{max(0, round(seconds))} s"
    if seconds < 90 * 60:
        return f"{round(seconds / 60)} min"
    return f"{round(seconds / 3600)} h"


def approval_card(tool: str, summary: str, requester: str, expires_in_s: float,
                  file_name: str | None = None, reason: str | None = None) -> str:
    """The card's HTML; with `file_name`, the summary is in that attached file; `reason`
    says why Tandem asks although its policy would allow the call."""
    head = f"🔐 Tandem wants to run <code>{escape(tool)}</code>"
    if file_name is None:
        body = f"{head}:\n<pre>{escape(summary) or ' '}</pre>"
    else:
        body = (f"{head}. The full call ({len(summary):,} characters) is in the attached "
                f"file <code>{escape(file_name)}</code>: read it before you approve.")
    why = f"\n⚠️ {escape(reason)}" if reason else ""
    return (f"{body}{why}\nRequested by {escape(requester)} · "
            f"expires in {duration(expires_in_s)}")


_EXPIRY = re.compile(r" · expires in [^\n]*$")


def decided(card_html: str, line: str) -> str:
    """A card once it is decided: its outcome below, its expiry gone."""
    return f"{_EXPIRY.sub('', card_html)}\n\n{line}"


def outcome_line(outcome: str, by: str | None) -> str:
    template = OUTCOMES.get(outcome, "Approval " + outcome + " by {by}")
    return escape(template.format(by=by or "someone"))


def plain(html_text: str) -> str:
    """The visible text of HTML this module made (for the plain-text fallback)."""
    return html.unescape(re.sub(r"<[^>]+>", "", html_text))


# -- what users write -----------------------------------------------------------------


def parse_command(text: str) -> tuple[str, str, str | None] | None:
    """`/name@bot args` → (name, args, bot or None); None when it is not a command."""
    match = _COMMAND.fullmatch(text)
    if match is None:
        return None
    return match.group(1).lower(), match.group(3).strip(), match.group(2)


def strip_mention(text: str, username: str) -> str:
    """The text without `@username` (and a comma or colon after it)."""
    name = re.escape(username)
    return re.sub(rf"(?<![\w@])@{name}(?!\w)[,:]?\s*", "", text, flags=re.IGNORECASE).strip()
