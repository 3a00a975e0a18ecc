"""Telegram texts: Markdown as Telegram HTML, approval cards, and commands and mentions
in what users write.

`to_html` turns the Markdown a model writes into the HTML subset Telegram accepts:
**bold**, *italic*, ~~strike~~, ||spoilers||, `code`, fenced code (`<pre><code
class="language-x">`; ``` or ~~~ fences of any length, indented under a list item or
inside a quote), [links](https://…) (to `http(s)` and `mailto` only, parentheses in the
address allowed) and `<https://…>`, `#` headings (bold), `-`/`*` bullets (•, nested ◦,
task boxes ☐ ☑), `>` quotes (`<blockquote>`), rules (───) and tables (narrow ones
aligned in `<pre>`, others a line per row, header bold). Everything else is text
with only `& < >` escaped (the model's own HTML included, so it never makes a tag), and
tags always nest properly, so any input gives HTML Telegram parses. Markers only count at
word edges: `snake_case`, `__init__`, `2*3*4`, `*.py` and `a || b` stay as typed.
Unclosed markers stay literal; an unclosed code fence (a streaming answer) runs to the
end. The visible text is never longer than the Markdown (only aligning a table may pad
it, and then never past 4,096 characters), so a part `split_text` cut to Telegram's limit
fits once rendered.
"""

from __future__ import annotations

import html
import re

from adapters.markdown_blocks import FENCE, cells, fence_body, table_end, unquote, width

_LANGUAGE = re.compile(r"[\w+#.-]{1,32}")
_HEADING = re.compile(r"^ {0,3}#{1,6}[ \t]+(.*?)(?:[ \t]+#+)?[ \t]*$")
_RULE = re.compile(r"^ {0,3}(?:([-_])(?:[ \t]*\1){2,}|\*\*\*|\*(?:[ \t]+\*){2,})[ \t]*$")
"""A thematic break: `---`, `___`, `***`, `* * *` (a longer run of stars stays text)."""
_BULLET = re.compile(r"^([ \t]*)[-*+][ \t]+(?:\[([ xX])\][ \t]+)?(.*)$")
_TOKEN = re.compile(r"\\[!-/:-@\[-`{-~]|`+|\*{1,3}|__|_|~~|\|\||!?\[|<(?:https?://|mailto:)[^\s<>]+>",
                    re.IGNORECASE)
_LINK = re.compile(r"!?\[([^\]\n]+)\]\([ \t]*<?((?:[^()\s<>]|\([^()\s<>]*\))+)>?"
                   r"(?:[ \t]+\"[^\"\n]*\")?[ \t]*\)")
_SAFE_URL = re.compile(r"(?:https?://|mailto:)[^\s<>\"']+", re.IGNORECASE)
"""Only web and mail links: `tg://user?id=…` would mention (and ping) a user, and
other schemes (`javascript:`, `data:`, `tg://resolve`…) stay text."""
VISIBLE_LIMIT = 4096
"""Telegram's limit on a message's visible text: padding a table may take a text up to
it, never past it (nor past the Markdown's own length, when that is longer)."""
TABLE_COLUMNS = 40
"""The widest table shown aligned in a monospace block (about a phone's width)."""
_DUNDER = re.compile(r"[A-Za-z0-9]\w*?__(?!\w)")
_COMMAND = re.compile(r"/([A-Za-z0-9_]{1,32})(?:@([A-Za-z0-9_]+))?(?:\s+|$)(.*)", re.DOTALL)
_TAGS = {"**": "b", "__": "b", "*": "i", "_": "i", "~~": "s", "||": "tg-spoiler"}
_NO_OPEN_BEFORE = ")]}"
_NO_OPEN_AFTER = ".,;:/)]}|=>"
_NO_CLOSE_BEFORE = "/([{|=<_\\"
_NO_CLOSE_AFTER = "([{"
"""Star markers next to these are arithmetic, globs or code-ish text (`(a)*(b)`, `*.py`,
`src/**/x`, `test_*.py`), not emphasis."""


def escape(text: str) -> str:
    return html.escape(text, quote=False)


def to_html(markdown: str) -> str:
    """Telegram HTML for `markdown` (see the module docstring)."""
    rendered, padded = _blocks(markdown, compact=False)
    if padded and len(_visible(rendered).strip()) > max(len(markdown.strip()), VISIBLE_LIMIT):
        return _blocks(markdown, compact=True)[0]  # aligned tables made it too long
    return rendered


def _blocks(markdown: str, *, compact: bool) -> tuple[str, bool]:
    """The HTML, block by block, and whether a table in it was aligned (padded); a
    `compact` table takes a line per row (never longer than its Markdown)."""
    lines = markdown.split("\n")
    out: list[str] = []
    quote: list[str] = []
    padded = False
    i = 0
    while i < len(lines):
        inner, quoted = unquote(lines[i])
        fence = FENCE.match(inner)
        table = table_end(lines, i, quoted) if "|" in inner and not fence else 0
        if fence:
            rendered, i = _code(lines, i + 1, fence, quoted)
            quoted = False  # no <pre> inside a quote: Telegram does not nest them
        elif table:
            rendered = _table([unquote(line)[0] for line in lines[i:table]],
                              compact=compact or quoted)
            padded = padded or rendered.startswith("<pre>")
            i = table
        else:
            rendered = _line(inner)
            i += 1
        if quoted:
            quote.append(rendered)
            continue
        if quote:
            out.append(_blockquote(quote))
            quote = []
        out.append(rendered)
    if quote:
        out.append(_blockquote(quote))
    return "\n".join(out), padded


def _blockquote(lines: list[str]) -> str:
    while lines and not lines[-1].strip():
        lines.pop()
    return f"<blockquote>{chr(10).join(lines)}</blockquote>"


def _code(lines: list[str], i: int, fence: re.Match[str], quoted: bool) -> tuple[str, int]:
    """The fenced block whose body starts at line `i`, and the line after its end."""
    body, i = fence_body(lines, i, fence, quoted)
    words = fence.group("info").split()
    return _pre(body, words[0] if words else ""), i


def _pre(lines: list[str], language: str) -> str:
    body = escape("\n".join(lines)) or " "
    if _LANGUAGE.fullmatch(language):
        return f'<pre><code class="language-{html.escape(language)}">{body}</code></pre>'
    return f"<pre>{body}</pre>"


def _line(line: str) -> str:
    if _RULE.match(line):
        return "─" * min(len(line.strip()), 16)
    heading = _HEADING.match(line)
    if heading:
        text = heading.group(1)
        bold = re.fullmatch(r"\*\*(.+)\*\*", text)
        return f"<b>{_inline(bold.group(1) if bold else text)}</b>" if text else ""
    bullet = _BULLET.match(line)
    if bullet:
        indent, box, text = bullet.groups()
        mark = "•" if len(indent.expandtabs(4)) < 2 else "◦"
        check = {" ": "☐ ", "x": "☑ ", "X": "☑ "}.get(box or "", "")
        return f"{indent}{mark} {check}{_inline(text)}"
    return _inline(line)


# -- tables -----------------------------------------------------------------------------


def _table(lines: list[str], *, compact: bool) -> str:
    """A table: aligned in a monospace block when it is narrow, has no links and is not
    `compact` (inside a quote, where a block cannot go, or when padding would take the
    text past its budget); otherwise one line per row, cells between ` | `, the header
    bold (a wide block wraps on a phone and loses its alignment anyway)."""
    rows = [cells(line) for i, line in enumerate(lines) if i != 1]
    aligns = [("r" if c.endswith(":") and not c.startswith(":") else
               "c" if c.startswith(":") and c.endswith(":") else "l")
              for c in cells(lines[1])]
    rendered = [[_inline(cell) for cell in row] for row in rows]
    if not compact and not any("<a " in cell for row in rendered for cell in row):
        texts = [[_visible(cell) for cell in row] for row in rendered]
        block = _aligned(texts, aligns)
        if max(width(line) for line in block.split("\n")) <= TABLE_COLUMNS:
            return f"<pre>{escape(block)}</pre>"
    head, *body = rendered
    return "\n".join([f"<b>{' | '.join(head)}</b>" if any(head) else "",
                      *(" | ".join(row) for row in body)]).strip("\n")


def _visible(rendered: str) -> str:
    return html.unescape(re.sub(r"<[^>]+>", "", rendered))


def _aligned(rows: list[list[str]], aligns: list[str]) -> str:
    count = max(len(row) for row in rows)
    rows = [row + [""] * (count - len(row)) for row in rows]
    aligns = (aligns + ["l"] * count)[:count]
    widths = [max(width(row[c]) for row in rows) for c in range(count)]

    def cell(text: str, c: int) -> str:
        pad = widths[c] - width(text)
        if aligns[c] == "r":
            return " " * pad + text
        if aligns[c] == "c":
            return " " * (pad // 2) + text + " " * (pad - pad // 2)
        return text + " " * pad

    lines = [" | ".join(cell(text, c) for c, text in enumerate(row)).rstrip() for row in rows]
    lines.insert(1, "-+-".join("-" * w for w in widths))
    return "\n".join(lines)


# -- inline -----------------------------------------------------------------------------


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
        elif mark.endswith("["):
            pos = _link(text, start, out) if links else pos
            if pos == token.end():
                out.append(escape(mark))
        elif mark.startswith("<"):
            url = mark[1:-1]
            out.append(f'<a href="{html.escape(url, quote=True)}">{escape(url)}</a>'
                       if links and _SAFE_URL.fullmatch(url) else escape(mark))
        elif mark == "__" and (dunder := _DUNDER.match(text, pos)) \
                and (start == 0 or not text[start - 1].isalnum()):
            out.append(escape(mark + dunder.group(0)))  # __init__, __pycache__
            pos = dunder.end()
        else:
            before = text[start - 1] if start else " "
            after = text[pos] if pos < len(text) else " "
            _emphasis(mark, before, after, out, stack)
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
        return start + len("![" if text.startswith("!", start) else "[")
    label = _inline(match.group(1), links=False)
    out.append(f'<a href="{html.escape(match.group(2), quote=True)}">{label}</a>')
    return match.end()


def _flanks(mark: str, before: str, after: str) -> tuple[bool, bool]:
    """Whether a marker between `before` and `after` may open, and may close."""
    can_open = not after.isspace()
    can_close = not before.isspace()
    if mark[0] == "_":  # never inside a word: snake_case
        return can_open and not before.isalnum(), can_close and not after.isalnum()
    if mark == "*":  # italics never inside a word (2*3*4) nor next to glob-ish text
        can_open = can_open and not before.isalnum() and before not in _NO_OPEN_BEFORE \
            and after not in _NO_OPEN_AFTER
        can_close = can_close and not after.isalnum() and before not in _NO_CLOSE_BEFORE \
            and after not in _NO_CLOSE_AFTER
    elif mark[0] == "*":  # bold may touch a word, but not sit inside one (x**2)
        inside = before.isalnum() and after.isalnum()
        can_open = can_open and not inside and after not in _NO_OPEN_AFTER
        can_close = can_close and not inside and before not in "/\\"
    return can_open, can_close


def _emphasis(mark: str, before: str, after: str, out: list[str],
              stack: list[tuple[str, int]]) -> None:
    can_open, can_close = _flanks(mark, before, after)
    if mark == "***":  # bold and italic at once: close in the order they were opened
        open_marks = [m for m, _ in stack if m in ("*", "**")]
        if can_close and open_marks:
            order = sorted(("*", "**"), key=lambda m: -_depth(stack, m))
        else:
            order = ["**", "*"]
        for part in order:
            _toggle(part, can_open, can_close, out, stack)
        return
    _toggle(mark, can_open, can_close, out, stack)


def _depth(stack: list[tuple[str, int]], mark: str) -> int:
    return next((i for i in range(len(stack) - 1, -1, -1) if stack[i][0] == mark), -1)


def _toggle(mark: str, can_open: bool, can_close: bool, out: list[str],
            stack: list[tuple[str, int]]) -> None:
    depth = _depth(stack, mark)
    index = stack[depth][1] if depth >= 0 else -1
    if depth >= 0 and can_close and any(out[index + 1 :]):
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
    "session": "✅ Allowed for this conversation by {by}",
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
