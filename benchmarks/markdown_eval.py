"""Markdown renderers for Telegram and Slack, scored on realistic model answers.

The corpus is `tests/adapters/markdown_corpus/*.md`. Each answer is split as the adapters
split it before rendering (`adapters.live.split_text`: 4,096 characters for Telegram,
`slack_render.SECTION_CHARS` for Slack's live messages, 12,000 for Slack's `markdown`
block), each part rendered, and the result scored:

* parse: Telegram parts that the fake's strict parser (as strict as Telegram) rejects, that
  show nothing or more than 4,096 characters; Slack sections over 3,000 characters, with
  mention markup (`<!here>`, `<@U…>`) or a `<`/`>` that starts no link;
* lost: answers where a word or symbol of the source is not on screen (multiset of words;
  markup, link targets and fence info strings aside), and how many words;
* code: fenced blocks shown whole, as code, in order (a block split in two counts when its
  pieces follow each other); `(n shifted)`: found only if indentation is ignored;
* fidelity: table rows kept on one line, nested list items still indented, headings
  bold, identifiers and arithmetic (`snake_case`, `__init__`, `2*3*4`) shown verbatim,
  `**` left over outside code, spoilers and quotes formatted (Telegram);
* ms/answer: splitting and rendering one answer, mean over the corpus.

Candidates: Tandem's renderers as committed (`--baseline`, default HEAD) and in the work
tree; for Telegram `chatgpt-md-converter` and `telegramify-markdown` (its text + entities
written as HTML, and its own MarkdownV2 checked with the fake's MarkdownV2 parser); for
Slack `markdown-to-mrkdwn` and Slack's `markdown` block, whose rendering happens at Slack:
here CommonMark (pyromark) stands in for it, so its row is an estimate. Libraries missing from
the environment are skipped. Run: `python benchmarks/markdown_eval.py [--reps 20]
[--details] [--baseline REF]`.
"""

from __future__ import annotations

import os

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

import argparse
import html
import re
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from html.parser import HTMLParser
from importlib import metadata
from pathlib import Path
from types import ModuleType
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from adapters import slack_render, telegram_render  # noqa: E402
from adapters.live import split_text  # noqa: E402
from tests.adapters.test_markdown_corpus import (  # noqa: E402
    FILES,
    Shown,
    broken_blocks,
    fenced_blocks,
    slack_live_sections,
    slack_shown,
    telegram_parts,
    telegram_shown,
    tokens,
)

SLACK_MARKDOWN_BLOCK = 12_000

# ---- candidates ------------------------------------------------------------------------


def committed(name: str, ref: str) -> ModuleType | None:
    """`adapters/<name>.py` as committed at git `ref` (today's code), or None."""
    try:
        source = subprocess.run(["git", "show", f"{ref}:adapters/{name}.py"], cwd=ROOT,
                                capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return None
    module = ModuleType(f"{name}_at_{re.sub(r'[^A-Za-z0-9]', '_', ref)}")
    module.__file__ = f"{ref}:adapters/{name}.py"
    sys.modules[module.__name__] = module
    exec(compile(source, module.__file__, "exec"), module.__dict__)
    return module


def version(package: str) -> str:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return ""


_TAGS = {"bold": ("<b>", "</b>"), "italic": ("<i>", "</i>"), "underline": ("<u>", "</u>"),
         "strikethrough": ("<s>", "</s>"), "spoiler": ("<tg-spoiler>", "</tg-spoiler>"),
         "code": ("<code>", "</code>"), "blockquote": ("<blockquote>", "</blockquote>"),
         "expandable_blockquote": ("<blockquote expandable>", "</blockquote>")}


def entities_to_html(text: str, entities: list[Any]) -> str:
    """Plain text + Telegram entities (UTF-16 offsets) as Telegram HTML, properly nested
    (an entity that outlives its parent is closed and reopened around the parent's end)."""
    index: dict[int, int] = {}
    unit = 0
    for i, ch in enumerate(text):
        index[unit] = i
        unit += 2 if ord(ch) > 0xFFFF else 1
    index[unit] = len(text)
    spans: list[tuple[int, int, str, str]] = []
    for e in entities:
        if e.type == "pre":
            lang = f' class="language-{html.escape(e.language)}"' if e.language else ""
            tags = (f"<pre><code{lang}>", "</code></pre>") if lang else ("<pre>", "</pre>")
        elif e.type == "text_link":
            tags = (f'<a href="{html.escape(e.url or "", quote=True)}">', "</a>")
        elif e.type in _TAGS:
            tags = _TAGS[e.type]
        else:
            continue
        start, end = index.get(e.offset), index.get(e.offset + e.length)
        if start is not None and end is not None and end > start:
            spans.append((start, end, *tags))
    spans.sort(key=lambda s: (s[0], -s[1]))
    out: list[str] = []
    stack: list[tuple[int, int, str, str]] = []
    cuts = sorted({0, len(text), *(s[0] for s in spans), *(s[1] for s in spans)})
    pending = list(reversed(spans))
    for a, b in zip(cuts, cuts[1:] + [len(text)], strict=True):
        reopen: list[tuple[int, int, str, str]] = []
        while any(s[1] <= a for s in stack):
            top = stack.pop()
            out.append(top[3])
            if top[1] > a:
                reopen.append(top)
        for span in reversed(reopen):
            out.append(span[2])
            stack.append(span)
        while pending and pending[-1][0] == a:
            span = pending.pop()
            out.append(span[2])
            stack.append(span)
        out.append(html.escape(text[a:b], quote=False))
    out += [s[3] for s in reversed(stack)]
    return "".join(out)


@dataclass
class Candidate:
    name: str
    platform: str
    shown: Callable[[str], Shown]
    """An answer, split and rendered, as the platform shows it."""
    render_all: Callable[[str], object]
    """An answer, split and rendered (what is timed)."""
    raw: Callable[[str], list[str]] = field(default=lambda _: [])
    """The rendered parts/sections (mrkdwn or HTML), for fidelity checks on markup."""


def telegram_candidate(name: str, render: Callable[[str], str],
                       parse_mode: str = "HTML") -> Candidate:
    return Candidate(name, "telegram",
                     lambda md: telegram_shown(telegram_parts(md, render), parse_mode),
                     lambda md: telegram_parts(md, render),
                     lambda md: telegram_parts(md, render))


def slack_candidate(name: str, render: Callable[[str], str]) -> Candidate:
    return Candidate(name, "slack",
                     lambda md: slack_shown(slack_live_sections(md, render)),
                     lambda md: slack_live_sections(md, render),
                     lambda md: slack_live_sections(md, render))


class _CommonMarkView(HTMLParser):
    """Visible text and code blocks of CommonMark's HTML (standing in for Slack's
    rendering of a `markdown` block)."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.text: list[str] = []
        self.code: list[str] = []
        self._pre: list[str] | None = None
        self._lists: list[int] = []  # per open list: the next number, or -1 (bullets)

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag == "pre":
            self._pre = []
        if tag in ("ul", "ol"):
            start = dict(attrs).get("start") or "1"
            self._lists.append(int(start) if tag == "ol" else -1)
        elif tag == "li" and self._lists:
            indent = "   " * (len(self._lists) - 1)
            number = self._lists[-1]
            self.text.append(f"\n{indent}{number}. " if number >= 0 else f"\n{indent}• ")
            if number >= 0:
                self._lists[-1] += 1
        elif tag in ("p", "tr", "br", "h1", "h2", "h3", "h4", "h5", "h6", "pre", "blockquote"):
            self.text.append("\n")
        elif tag in ("td", "th"):
            self.text.append(" | ")

    def handle_endtag(self, tag: str) -> None:
        if tag == "pre" and self._pre is not None:
            self.code.append("".join(self._pre))
            self._pre = None
        elif tag in ("ul", "ol") and self._lists:
            self._lists.pop()

    def handle_data(self, data: str) -> None:
        self.text.append(data)
        if self._pre is not None:
            self._pre.append(data)


def markdown_block_candidate() -> Candidate | None:
    try:
        import pyromark
    except ImportError:
        return None
    options = (pyromark.Options.ENABLE_TABLES | pyromark.Options.ENABLE_STRIKETHROUGH
               | pyromark.Options.ENABLE_TASKLISTS)

    def parts(md: str) -> list[str]:
        return split_text(md or " ", SLACK_MARKDOWN_BLOCK)

    def shown(md: str) -> Shown:
        out = Shown()
        for i, part in enumerate(parts(md)):
            if len(part) > SLACK_MARKDOWN_BLOCK:
                out.errors.append(f"block {i}: {len(part)} characters")
            if re.search(r"<[!@#]", part):
                out.errors.append(f"block {i}: mention markup passed to Slack as is")
            view = _CommonMarkView()
            view.feed(pyromark.html(part, options=options))
            out.texts.append("".join(view.text))
            out.code += view.code
        return out

    return Candidate("Slack markdown block (CommonMark estimate)", "slack", shown, parts,
                     lambda md: [pyromark.html(p, options=options) for p in parts(md)])


def candidates(baseline: str) -> list[Candidate]:
    out: list[Candidate] = []
    head_tg = committed("telegram_render", baseline)
    head_slack = committed("slack_render", baseline)
    if head_tg is not None and head_tg.to_html.__code__.co_code != \
            telegram_render.to_html.__code__.co_code:
        out.append(telegram_candidate(f"tandem to_html @{baseline}", head_tg.to_html))
    out.append(telegram_candidate("tandem to_html (work tree)", telegram_render.to_html))
    if version("chatgpt-md-converter"):
        from chatgpt_md_converter import telegram_format
        out.append(telegram_candidate(
            f"chatgpt-md-converter {version('chatgpt-md-converter')}", telegram_format))
    if version("telegramify-markdown"):
        import telegramify_markdown as tm

        def telegramify_html(md: str) -> str:
            text, entities = tm.convert(md)
            return entities_to_html(text, entities)

        v = version("telegramify-markdown")
        out.append(telegram_candidate(f"telegramify-markdown {v} (as HTML)", telegramify_html))
        out.append(telegram_candidate(f"telegramify-markdown {v} (MarkdownV2)",
                                      tm.markdownify, "MarkdownV2"))
    mrkdwn_now = getattr(slack_render.to_mrkdwn, "__wrapped__", slack_render.to_mrkdwn)
    if head_slack is not None:
        mrkdwn_head = getattr(head_slack.to_mrkdwn, "__wrapped__", head_slack.to_mrkdwn)
        if mrkdwn_head.__code__.co_code != mrkdwn_now.__code__.co_code:
            out.append(slack_candidate(f"tandem to_mrkdwn @{baseline}", mrkdwn_head))
    out.append(slack_candidate("tandem to_mrkdwn (work tree)", mrkdwn_now))
    if version("markdown-to-mrkdwn"):
        from markdown_to_mrkdwn import SlackMarkdownConverter
        converter = SlackMarkdownConverter()
        out.append(slack_candidate(f"markdown-to-mrkdwn {version('markdown-to-mrkdwn')}",
                                   converter.convert))
    block = markdown_block_candidate()
    if block is not None:
        out.append(block)
    return out


# ---- fidelity -------------------------------------------------------------------------

_TABLE_RULE = re.compile(r"^\s*\|?\s*:?-{3,}:?\s*(?:\|\s*:?-{3,}:?\s*)*\|?\s*$")
_NESTED = re.compile(r"^(\s{2,})(?:[-*+]|\d+[.)])\s+(.*)$")
_HEADING = re.compile(r"^ {0,3}#{1,6}\s+(.*?)\s*#*\s*$")
_LITERAL = re.compile(r"(?<![\w\\`*])(?:_{0,2}[A-Za-z0-9]+(?:_+[A-Za-z0-9]+)+_{0,2}|__\w+__"
                      r"|\d+(?:\*\d+)+|[a-z](?:\*[a-z])+)(?![\w`*])")
_CODE_SPAN = re.compile(r"(`+).+?\1")
_LINK = re.compile(r"\]\((?:[^()\s]|\([^()\s]*\))*\)")


def prose_lines(markdown: str) -> list[str]:
    """The answer's lines outside fenced code."""
    out: list[str] = []
    fence = ""
    for line in markdown.split("\n"):
        match = re.match(r"^[\s>]*(`{3,})(.*)$", line)
        if fence:
            if match and len(match.group(1)) >= len(fence) and not match.group(2).strip():
                fence = ""
        elif match:
            fence = match.group(1)
        else:
            out.append(line)
    return out


def _in_order(want: list[str], line: str) -> bool:
    got = iter(tokens(line))
    return all(any(w == g for g in got) for w in want)


def fidelity(markdown: str, shown: Shown, candidate: Candidate) -> Counter[str]:
    """Counts of `<check>` (source items) and `<check>_ok` (kept) for one answer."""
    score: Counter[str] = Counter()
    lines = prose_lines(markdown)
    visible = "\n".join(shown.texts).split("\n")
    for i, line in enumerate(lines):
        if "|" in line and _in_table(lines, i):
            want = tokens(_LINK.sub("]", line))
            if want:
                score["table rows"] += 1
                score["table rows_ok"] += any(_in_order(want, v) for v in visible)
        nested = _NESTED.match(line)
        if nested and not line.lstrip().startswith("|"):
            want = tokens(_LINK.sub("]", re.sub(r"^\[[ xX]\]", "", nested.group(2))))[:4]
            if want:
                score["nested"] += 1
                score["nested_ok"] += any(_in_order(want, v) and v[:1].isspace()
                                          for v in visible)
        heading = _HEADING.match(line)
        if heading and tokens(heading.group(1)):
            score["headings"] += 1
            score["headings_ok"] += _heading_bold(heading.group(1), shown, candidate, markdown)
        prose = _CODE_SPAN.sub(" ", _LINK.sub("] ", line))
        for literal in _LITERAL.findall(prose):
            score["literals"] += 1
            kept = any(literal in v for v in visible)
            score["literals_ok"] += kept
            if not kept:
                score[f"literal changed: {literal}"] += 1
    score["stray **"] += sum(_outside_code(t, e).count("**")
                             for t, e in zip(shown.texts, shown.entities, strict=False)) \
        if shown.entities else sum(_SLACK_CODE_ANY.sub("", t).count("**") for t in shown.texts)
    if candidate.platform == "telegram":
        score["spoilers"] += len(re.findall(r"\|\|[^|\n]+\|\|", "\n".join(lines)))
        score["spoilers_ok"] += sum(e["type"] == "spoiler" for es in shown.entities for e in es)
        quotes = sum(1 for a, b in zip([""] + lines, lines, strict=False)
                     if b.lstrip().startswith(">") and not a.lstrip().startswith(">"))
        score["quotes"] += quotes
        score["quotes_ok"] += min(quotes, sum(e["type"] in ("blockquote", "expandable_blockquote")
                                              for es in shown.entities for e in es))
    return score


_SLACK_CODE_ANY = re.compile(r"```.*?```|`[^`\n]+`", re.S)


def _in_table(lines: list[str], i: int) -> bool:
    """Line i is a row of a table: a run of `|` lines with a rule line in it."""
    start = i
    while start > 0 and "|" in lines[start - 1]:
        start -= 1
    end = i
    while end + 1 < len(lines) and "|" in lines[end + 1]:
        end += 1
    return any(_TABLE_RULE.match(x) and "-" in x for x in lines[start:end + 1]) \
        and not _TABLE_RULE.match(lines[i])


def _outside_code(text: str, entities: list[dict[str, Any]]) -> str:
    data = text.encode("utf-16-le")
    blank = bytearray(data)
    for e in entities:
        if e["type"] in ("pre", "code"):
            start, end = 2 * int(e["offset"]), 2 * (int(e["offset"]) + int(e["length"]))
            blank[start:end] = " ".encode("utf-16-le") * ((end - start) // 2)
    return bytes(blank).decode("utf-16-le", "replace")


def _words(text: str) -> list[str]:
    return [t for t in tokens(text) if t[0].isalnum()]


def _heading_bold(heading: str, shown: Shown, candidate: Candidate, markdown: str) -> bool:
    want = _words(heading)
    if candidate.platform == "telegram":
        for text, entities in zip(shown.texts, shown.entities, strict=False):
            at = 0
            for line in text.split("\n"):
                if _words(line)[:len(want)] == want and not line.lstrip().startswith("#"):
                    start16 = len(text[:at].encode("utf-16-le")) // 2
                    if any(e["type"] == "bold" and e["offset"] <= start16 + 3
                           and e["offset"] + e["length"] > start16 for e in entities):
                        return True
                at += len(line) + 1
        return False
    raw = html.unescape("\n".join(candidate.raw(markdown)))
    if "<h" in raw:  # CommonMark HTML (the markdown block estimate)
        return True
    return any(_words(line)[:len(want)] == want and line.strip().startswith("*")
               and line.strip().endswith("*") for line in raw.split("\n"))


# ---- running ---------------------------------------------------------------------------


@dataclass
class Result:
    name: str
    platform: str
    answers: int = 0
    parts: int = 0
    errors: int = 0
    answers_with_errors: int = 0
    answers_losing: int = 0
    words_lost: int = 0
    blocks: int = 0
    blocks_ok: int = 0
    blocks_shifted: int = 0
    fidelity: Counter[str] = field(default_factory=Counter)
    ms: float = 0.0
    details: list[str] = field(default_factory=list)


def evaluate(candidate: Candidate, answers: dict[str, str], reps: int) -> Result:
    result = Result(candidate.name, candidate.platform)
    for name, md in answers.items():
        try:
            shown = candidate.shown(md)
        except Exception as exc:  # a library that crashes on an answer scores as lost
            result.answers += 1
            result.errors += 1
            result.answers_with_errors += 1
            result.answers_losing += 1
            result.details.append(f"{name}: raised {type(exc).__name__}: {exc}")
            continue
        result.answers += 1
        result.parts += len(shown.texts) + sum("part" in e and "characters" not in e
                                               and "empty" not in e for e in shown.errors)
        result.errors += len(shown.errors)
        result.answers_with_errors += bool(shown.errors)
        lost = +shown.lost(md)
        result.answers_losing += bool(lost)
        result.words_lost += sum(lost.values())
        blocks = fenced_blocks(md)
        missing, shifted = broken_blocks(blocks, shown.code)
        result.blocks += len(blocks)
        result.blocks_ok += len(blocks) - len(missing)
        result.blocks_shifted += shifted
        result.fidelity += fidelity(md, shown, candidate)
        for error in shown.errors[:2]:
            result.details.append(f"{name}: {error}")
        if lost:
            result.details.append(f"{name}: lost {dict(lost.most_common(8))}")
        for block in missing:
            result.details.append(f"{name}: code block not intact: {block!r}")
        changed = [k.split(": ", 1)[1] for k in result.fidelity if k.startswith("literal changed")]
        result.fidelity = Counter({k: v for k, v in result.fidelity.items()
                                   if not k.startswith("literal changed")})
        if changed:
            result.details.append(f"{name}: not verbatim: {changed}")
    texts = list(answers.values())
    for md in texts:  # warm up (imports, caches of the libraries themselves)
        candidate.render_all(md)
    start = time.perf_counter()
    for _ in range(reps):
        for md in texts:
            candidate.render_all(md)
    result.ms = (time.perf_counter() - start) * 1000 / (reps * len(texts))
    return result


def _ratio(score: Counter[str], key: str) -> str:
    total = score[key]
    return f"{score[key + '_ok']}/{total}" if total else "-"


def table(results: list[Result], platform: str) -> str:
    head = ["renderer", "parse errors (answers)", "answers losing words (words)",
            "code blocks intact", "table rows", "nested indent", "headings bold",
            "snake/2*3*4 verbatim", "stray **"]
    if platform == "telegram":
        head += ["spoilers", "quotes"]
    head += ["ms/answer"]
    rows = [head, ["---"] * len(head)]
    for r in results:
        if r.platform != platform:
            continue
        shifted = f" ({r.blocks_shifted} shifted)" if r.blocks_shifted else ""
        row = [r.name, f"{r.errors} ({r.answers_with_errors})",
               f"{r.answers_losing} ({r.words_lost})", f"{r.blocks_ok}/{r.blocks}{shifted}",
               _ratio(r.fidelity, "table rows"), _ratio(r.fidelity, "nested"),
               _ratio(r.fidelity, "headings"), _ratio(r.fidelity, "literals"),
               str(r.fidelity["stray **"])]
        if platform == "telegram":
            row += [_ratio(r.fidelity, "spoilers"), _ratio(r.fidelity, "quotes")]
        row += [f"{r.ms:.2f}"]
        rows.append(row)
    return "\n".join("| " + " | ".join(row) + " |" for row in rows)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--reps", type=int, default=20, help="timing repetitions")
    parser.add_argument("--details", action="store_true", help="list every failure")
    parser.add_argument("--baseline", default="HEAD",
                        help="git ref whose renderers are 'today's code' (default HEAD)")
    args = parser.parse_args(argv)
    answers = {f.stem: f.read_text(encoding="utf-8") for f in FILES}
    total = sum(len(a) for a in answers.values())
    print(f"{len(answers)} answers, {total:,} characters, "
          f"{sum(len(a) > 4096 for a in answers.values())} longer than 4,096, "
          f"{sum(len(b) > 0 for a in answers.values() for b in fenced_blocks(a))} code blocks")
    results = [evaluate(c, answers, args.reps) for c in candidates(args.baseline)]
    for platform in ("telegram", "slack"):
        print(f"\n## {platform.capitalize()}\n")
        print(table(results, platform))
    if args.details:
        for r in results:
            if r.details:
                print(f"\n### {r.name}\n")
                print("\n".join(f"- {d}" for d in r.details))
    return 0


if __name__ == "__main__":
    sys.exit(main())
