"""Markdown's block structure, as both renderers read it (Telegram HTML, Slack mrkdwn):
quote markers, fenced code blocks, pipe tables and monospace widths. Each renderer turns
what these find into its own markup."""

from __future__ import annotations

import re
import unicodedata

FENCE = re.compile(r"^(?P<indent>[ \t]*)(?P<fence>`{3,}|~{3,})[ \t]*(?P<info>[^`]*?)[ \t]*$")
FENCE_CLOSE = re.compile(r"^[ \t]*(?P<fence>`{3,}|~{3,})[ \t]*$")
QUOTE = re.compile(r"^ {0,3}>[ \t]?")
TABLE_RULE = re.compile(r"^[ \t]*\|?(?:[ \t]*:?-+:?[ \t]*\|)+(?:[ \t]*:?-+:?[ \t]*)?$"
                        r"|^[ \t]*\|?[ \t]*:?-+:?[ \t]*(?:\|[ \t]*:?-+:?[ \t]*)+\|?[ \t]*$")


def unquote(line: str) -> tuple[str, bool]:
    """A line without its `>` markers (nested quotes are flattened), and whether it had
    any."""
    inner, quoted = line, False
    while (match := QUOTE.match(inner)) is not None:
        inner, quoted = inner[match.end():], True
    return inner, quoted


def fence_body(lines: list[str], i: int, fence: re.Match[str],
               quoted: bool) -> tuple[list[str], int]:
    """The lines of the fenced block whose body starts at line `i` (without the fence's
    own indentation, and out of the quote it is in), and the line after its end. An
    unclosed block runs to the end."""
    marker = fence.group("fence")
    indent = len(fence.group("indent").expandtabs(4))
    body: list[str] = []
    while i < len(lines):
        line = unquote(lines[i])[0] if quoted else lines[i]
        i += 1
        close = FENCE_CLOSE.match(line)
        if close and close.group("fence")[0] == marker[0] \
                and len(close.group("fence")) >= len(marker):
            break
        strip = len(line) - len(line.lstrip(" "))
        body.append(line[min(strip, indent):])
    return body, i


def table_end(lines: list[str], i: int, quoted: bool) -> int:
    """The end (exclusive) of the table whose header is line `i`, or 0 when none starts
    there: a header row with `|`, a rule like `|---|:--:|`, then rows with `|`."""
    if i + 1 >= len(lines):
        return 0
    header, rule = unquote(lines[i]), unquote(lines[i + 1])
    if header[1] != quoted or rule[1] != quoted or "|" not in header[0] \
            or "|" not in rule[0] or not TABLE_RULE.match(rule[0]):
        return 0
    end = i + 2
    while end < len(lines):
        row, row_quoted = unquote(lines[end])
        if row_quoted != quoted or "|" not in row or not row.strip() or FENCE.match(row):
            break
        end += 1
    return end


def cells(row: str) -> list[str]:
    """A table row's cells: split at `|` outside code spans; `\\|` is a pipe."""
    text = row.strip()
    out: list[str] = []
    cell: list[str] = []
    code = False
    i = 0
    while i < len(text):
        ch = text[i]
        if ch == "\\" and text[i + 1: i + 2] == "|":
            cell.append("|")
            i += 2
            continue
        if ch == "`":
            code = not code
        if ch == "|" and not code:
            out.append("".join(cell))
            cell = []
        else:
            cell.append(ch)
        i += 1
    out.append("".join(cell))
    if out and not out[0].strip() and text.startswith("|"):
        out = out[1:]
    if out and not out[-1].strip() and text.endswith("|") and not text.endswith("\\|"):
        out = out[:-1]
    return [c.strip() for c in out]


def width(text: str) -> int:
    """Columns `text` takes in a monospace font (wide East Asian characters and most
    emoji take two; joiners and combining marks none)."""
    if text.isascii():
        return len(text)
    return sum(0 if unicodedata.combining(ch) or ch in "\u200d\ufe0f" else
               2 if unicodedata.east_asian_width(ch) in "WF" else 1 for ch in text)
