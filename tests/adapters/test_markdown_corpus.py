"""Realistic model answers (`markdown_corpus/*.md`) through the renderers Tandem uses, split
as the adapters split them before rendering.

Telegram: `split_text(answer, 4096)`, each part through `to_html`; every part must parse
with the fake's strict HTML parser (what Telegram rejects, it rejects) and show at most
4,096 characters. Slack: `split_text(answer, SECTION_CHARS)` as `LiveMessage` does, each
part through `slack_render.live`, and the whole answer through `slack_render.messages`;
every section's text within Slack's 3,000 characters. Both: every word of the answer is
on screen (a multiset of words and symbols, markup and link targets aside), and every
fenced code block shows whole, as code, in order, even when a split cut it in two.

The helpers here are also what `benchmarks/markdown_eval.py` scores the candidate
renderers with.
"""

from __future__ import annotations

import re
import textwrap
import unicodedata
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from adapters import slack_render
from adapters.live import split_text
from adapters.telegram_render import plain, to_html
from tests.fakes.telegram_server import ApiError, parse_text

CORPUS = Path(__file__).with_name("markdown_corpus")
FILES = sorted(CORPUS.glob("*.md"))
TELEGRAM_TEXT = 4096
"""What Telegram shows at most per message (`adapters.telegram.MAX_TEXT`), counted in
characters after entity parsing, as the fake counts."""
SLACK_SECTION_TEXT = 3000

# ---- what the source says -----------------------------------------------------------

_FENCE_LINE = re.compile(r"^(?P<prefix>[ \t]*(?:>[ \t]?)*[ \t]*)(?P<fence>`{3,})(?P<info>[^`]*)$")
_LINK_TARGET = re.compile(r"\]\((?:[^()\s]|\([^()\s]*\))*(?:\s+\"[^\"]*\")?\)")
_REF_USE = re.compile(r"\]\[[^\]\n]*\]")
_REF_DEFINITION = re.compile(
    r"^ {0,3}\[[^\]^\n]+\]:[ \t]*<?(?:https?://|mailto:|/|#)\S*>?(?:[ \t]+\"[^\"\n]*\")?[ \t]*$",
    re.M)
_HTML_COMMENT = re.compile(r"<!--.*?-->", re.S)
_TASK = re.compile(r"^(\s*(?:[-*+]|\d+[.)])\s+)\[[ xX]\]", re.M)
_MATH = re.compile(r"\$\$.+?\$\$|\$[^$\n]+\$|\\\(.+?\\\)|\\\[.+?\\\]", re.S)
_TOKEN = re.compile(r"[^\W_]+|\S")


def tokens(text: str) -> list[str]:
    """Words (letters and digits; `_` and markup split them, code spans do not) and
    non-ASCII symbols (emoji, €, →): what a reader sees, whatever the styling."""
    return [t for t in _TOKEN.findall(text.replace("`", ""))
            if t[0].isalnum() or (ord(t[0]) > 127 and unicodedata.category(t[0])[0] == "S")]


def source_words(markdown: str) -> Counter[str]:
    """The words an answer shows: link targets, reference definitions, HTML comments,
    task-list boxes, fence info strings and LaTeX command names are markup, not words."""
    text = _HTML_COMMENT.sub(" ", markdown)
    text = _REF_DEFINITION.sub(" ", text)
    text = _LINK_TARGET.sub("] ", _REF_USE.sub("] ", text))
    text = _TASK.sub(r"\1", text)
    text = _MATH.sub(lambda m: re.sub(r"\\[A-Za-z]+", " ", m.group(0)), text)
    lines = []
    for line in text.split("\n"):
        fence = _FENCE_LINE.match(line)
        lines.append(fence.group("prefix") if fence else line)
    return Counter(tokens("\n".join(lines)))


def _normal(lines: Iterable[str]) -> list[str]:
    """Code lines without their common indentation, trailing blanks and blank edges."""
    text = textwrap.dedent("\n".join(line.rstrip() for line in lines))
    return text.strip("\n").split("\n") if text.strip() else []


def fenced_blocks(markdown: str) -> list[list[str]]:
    """The lines of each fenced code block, in order (an unclosed one runs to the end);
    a block inside a quote loses its `>` markers. Blocks with no content are left out."""
    blocks: list[list[str]] = []
    current: list[str] | None = None
    fence, quoted = "", False
    for line in markdown.split("\n"):
        match = _FENCE_LINE.match(line)
        if current is None:
            if match:
                current, fence, quoted = [], match.group("fence"), ">" in match.group("prefix")
        elif match and len(match.group("fence")) >= len(fence) and not match.group("info").strip():
            blocks.append(_normal(current))
            current = None
        else:
            current.append(re.sub(r"^\s*(?:>\s?)+", "", line) if quoted else line)
    if current is not None:
        blocks.append(_normal(current))
    return [block for block in blocks if block]


def broken_blocks(blocks: list[list[str]], shown: list[str]) -> tuple[list[str], int]:
    """The source blocks (by first line) not found, in order, in the code shown (`shown`:
    each code block on screen, a split block in consecutive pieces); and how many were
    found only when leading whitespace is ignored (indentation shifted by a split). Blank
    lines do not count: a split may leave one at either side of its cut."""
    pieces = [[line.rstrip() for line in piece.split("\n") if line.strip()] for piece in shown]
    missing: list[str] = []
    shifted = 0
    at = 0
    for block in blocks:
        found = None
        for strict in (True, False):
            found = _find_block([line for line in block if line], pieces, at, strict)
            if found is not None:
                shifted += not strict
                break
        if found is None:
            missing.append(block[0][:60])
        else:
            at = found
    return missing, shifted


def _find_block(block: list[str], pieces: list[list[str]], at: int, strict: bool) -> int | None:
    for start in range(at, len(pieces)):
        got: list[str] = []
        end = start
        for end in range(start, len(pieces)):
            got += pieces[end]
            if len(got) >= len(block):
                break
        if strict and textwrap.dedent("\n".join(got)).split("\n") == block:
            return end + 1
        if not strict and [x.strip() for x in got] == [x.strip() for x in block]:
            return end + 1
    return None


# ---- what Telegram shows ------------------------------------------------------------


@dataclass
class Shown:
    """One answer as the platform shows it: per part, the visible text; all code blocks
    on screen in order; and what the platform would refuse."""

    texts: list[str] = field(default_factory=list)
    code: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    entities: list[list[dict[str, object]]] = field(default_factory=list)

    def lost(self, markdown: str) -> Counter[str]:
        return source_words(markdown) - Counter(tokens("\n".join(self.texts)))

    def broken(self, markdown: str) -> list[str]:
        return broken_blocks(fenced_blocks(markdown), self.code)[0]


def utf16_slice(text: str, offset: int, length: int) -> str:
    data = text.encode("utf-16-le")
    return data[2 * offset: 2 * (offset + length)].decode("utf-16-le", "replace")


def telegram_shown(parts: list[str], parse_mode: str = "HTML") -> Shown:
    """Telegram HTML parts as the fake (so Telegram) parses and shows them."""
    shown = Shown()
    for i, html_part in enumerate(parts):
        try:
            visible, entities = parse_text(html_part, parse_mode, None)
        except ApiError as exc:
            shown.errors.append(f"part {i}: {exc.description}")
            continue
        if not visible:
            shown.errors.append(f"part {i}: message text is empty")
        if len(visible) > TELEGRAM_TEXT:
            shown.errors.append(f"part {i}: {len(visible)} characters shown")
        shown.texts.append(visible)
        shown.entities.append(entities)
        shown.code += [utf16_slice(visible, int(str(e["offset"])), int(str(e["length"])))
                       for e in entities if e["type"] == "pre"]
    return shown


def telegram_parts(markdown: str, render: Callable[[str], str] = to_html) -> list[str]:
    """What the Telegram adapter sends for an answer (`_notice`, `LiveMessage.finish`)."""
    return [render(part) for part in split_text(markdown or " ", TELEGRAM_TEXT)]


# ---- what Slack shows ---------------------------------------------------------------

_SLACK_LINK = re.compile(r"<((?:https?://|mailto:)[^<>|]*)(?:\|([^<>]*))?>", re.I)
_SLACK_CODE = re.compile(r"```\n?(.*?)```", re.S)
_SLACK_QUOTE = re.compile(r"^[ \t]*>", re.M)


def slack_unescape(text: str) -> str:
    """What Slack shows for mrkdwn text: its three entities decoded, zero-width spaces
    (which keep ``` in code from closing a block) invisible."""
    text = text.replace("\u200b", "")
    return text.replace("&lt;", "<").replace("&gt;", ">").replace("&amp;", "&")


def slack_shown(sections: list[str]) -> Shown:
    """Section texts (mrkdwn) as Slack shows them; a ping (`<!here>`, `<@U…>`, `<#C…>`),
    a `<` or `>` that is neither a link nor a quote, or an over-long section is an error."""
    shown = Shown()
    for i, text in enumerate(sections):
        if len(text) > SLACK_SECTION_TEXT:
            shown.errors.append(f"section {i}: {len(text)} characters")
        if re.search(r"<[!@#]", text):
            shown.errors.append(f"section {i}: mention or command markup")
        bare = _SLACK_QUOTE.sub("", _SLACK_LINK.sub("", text))
        if "<" in bare or ">" in bare:
            shown.errors.append(f"section {i}: unescaped < or >")
        shown.code += [slack_unescape(m.group(1)) for m in _SLACK_CODE.finditer(text)]
        visible = _SLACK_LINK.sub(lambda m: m.group(2) or m.group(1), text)
        shown.texts.append(slack_unescape(visible))
    return shown


def slack_live_sections(markdown: str,
                        render: Callable[[str], str] | None = None) -> list[str]:
    """The section texts of an answer as `LiveMessage` posts it: parts of at most
    `SECTION_CHARS` of Markdown, each through `slack_render.live` (or, given `render`, the
    same `sections` logic around that renderer)."""
    texts: list[str] = []
    for part in split_text(markdown or " ", slack_render.SECTION_CHARS):
        if render is None:
            blocks = slack_render.live(part, cancel=False).blocks
            texts += [b["text"]["text"] for b in blocks if b["type"] == "section"]
        else:
            rendered = render(part if part.strip() else "…")
            texts += [rendered] if len(rendered) <= slack_render.SECTION_CHARS else \
                split_text(rendered, slack_render.SECTION_CHARS)
    return texts


# ---- the corpus through the renderers Tandem uses -----------------------------------


@pytest.fixture(params=FILES, ids=[f.stem for f in FILES])
def answer(request: pytest.FixtureRequest) -> str:
    path: Path = request.param
    return path.read_text(encoding="utf-8")


def test_the_corpus_is_varied_and_has_long_answers() -> None:
    texts = [f.read_text(encoding="utf-8") for f in FILES]
    assert len(texts) >= 40
    assert sum(6000 <= len(t) <= 12000 for t in texts) >= 4
    assert sum("|---" in t or "| ---" in t or "--- |" in t for t in texts) >= 5


def test_telegram_parts_parse_fit_and_lose_nothing(answer: str) -> None:
    shown = telegram_shown(telegram_parts(answer))
    assert shown.errors == []
    assert +shown.lost(answer) == Counter()
    assert shown.broken(answer) == []


def test_slack_sections_fit_and_lose_nothing(answer: str) -> None:
    live = slack_shown(slack_live_sections(answer))
    assert live.errors == []
    assert +live.lost(answer) == Counter()
    assert live.broken(answer) == []
    blocks = [b for out in slack_render.messages(answer) for b in out.blocks]
    posted = slack_shown([b["text"]["text"] for b in blocks if b["type"] == "section"])
    assert posted.errors == []
    assert +posted.lost(answer) == Counter()
    assert posted.broken(answer) == []


BLOCKY = st.lists(st.sampled_from([
    *"ab *_~`[]()#-<>&|\\\n:/.é😀", "```", "**", "***", "__", "||", "~~", "~~~", "> ", "> > ",
    "https://x.y", "```py\n", "\n```\n", "    ```\n", "| a | b |\n", "|---|--:|\n", "\n- ",
    "\n  - [x] ", "\n1. ", "---\n", "<https://a.b/(c)>", "[l](https://a.b/(c))", "<!here>",
    "<@U1>", "2*3", "__init__", "\\*"]), max_size=60).map("".join)


@settings(max_examples=150, deadline=None)
@given(BLOCKY)
def test_any_blocks_parse_on_telegram_and_ping_no_one_on_slack(markdown: str) -> None:
    """Tables, quotes, spoilers and fences in any mix: Telegram accepts the HTML and shows
    no more than the Markdown (or 4,096 characters, for an aligned table); Slack gets no
    mention markup and no stray `<`."""
    html_text = to_html(markdown)
    try:
        shown, _ = parse_text(html_text, "HTML", None)
    except ApiError as exc:  # pragma: no cover - the failure message is the point
        raise AssertionError(f"{markdown!r} -> {html_text!r}: {exc.description}") from None
    assert len(shown) <= max(len(markdown.strip()), TELEGRAM_TEXT)
    assert plain(html_text).strip() == shown
    assert slack_shown([slack_render.to_mrkdwn(markdown)]).errors == []
