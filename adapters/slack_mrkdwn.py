"""Markdown as Slack's mrkdwn, as a pure function (`to_mrkdwn`).

Bold, italics, strikes, links (only to web and mail addresses: anything else would be a
mention or a command to Slack, so it stays text), headings, rules, bullets, quotes, code
spans and fenced code, and tables (aligned in a code block while narrow enough). Slack has
no escapes: `&`, `<` and `>` are entities, and markup characters that cannot be formatting
are left as they are.
"""

from __future__ import annotations

import re
from functools import lru_cache

from adapters.markdown_blocks import FENCE, cells, fence_body, table_end, unquote, width

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


_MENTION = re.compile(r"<(?=[!@])")


def quiet_mentions(markdown: str) -> str:
    """Markdown for Slack's own renderer (a stream's `markdown_text`) that pings nobody,
    as `escape` makes mrkdwn: a zero-width space after the `<` of `<!here>`,
    `<!channel>`, `<!everyone>`, `<!subteam^…>` and `<@U…>`. The quiet form of a prefix
    is a prefix of the quiet form of the whole, so a stream still only grows."""
    return _MENTION.sub("<\u200b", markdown)


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
