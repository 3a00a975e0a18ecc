"""Markdown → Telegram HTML, approval cards, commands and mentions: pure functions.

The HTML is checked with the fake server's parser, which is as strict as Telegram's."""

from __future__ import annotations

import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from adapters.live import split_text
from adapters.telegram_render import (
    CARD_SUMMARY_LIMIT,
    approval_card,
    duration,
    outcome_line,
    parse_command,
    plain,
    strip_mention,
    to_html,
)
from tests.fakes.telegram_server import ApiError, parse_text


def visible(html_text: str) -> tuple[str, list[str]]:
    text, entities = parse_text(html_text, "HTML", None)
    return text, [e["type"] for e in entities]


@pytest.mark.parametrize(("markdown", "html"), [
    ("plain & simple <tag>", "plain &amp; simple &lt;tag&gt;"),
    ("**bold** and __also bold__", "<b>bold</b> and <b>also bold</b>"),
    ("__init__ and __pycache__/ stay", "__init__ and __pycache__/ stay"),
    ("*it* and _it_", "<i>it</i> and <i>it</i>"),
    ("~~gone~~", "<s>gone</s>"),
    ("snake_case_name and 2 * 3 * 4", "snake_case_name and 2 * 3 * 4"),
    ("`a < b` and ``x`y``", "<code>a &lt; b</code> and <code>x`y</code>"),
    ("`**not bold**`", "<code>**not bold**</code>"),
    (r"\*literal\*", "*literal*"),
    ("[docs](https://example.com/?a=1&b=2)",
     '<a href="https://example.com/?a=1&amp;b=2">docs</a>'),
    ("[bad](javascript:alert(1))", "[bad](javascript:alert(1))"),
    ("# Title", "<b>Title</b>"),
    ("- one\n* two", "• one\n• two"),
    ("**a *b** c*", "<b>a *b</b> c*"),
    ("**unclosed", "**unclosed"),
    ("****", "****"),
    ("```python\nif a < b:\n    pass\n```",
     '<pre><code class="language-python">if a &lt; b:\n    pass</code></pre>'),
    ("```\nno language\n```", "<pre>no language</pre>"),
    ("```js\nstill streaming", '<pre><code class="language-js">still streaming</code></pre>'),
])
def test_markdown_to_html(markdown: str, html: str) -> None:
    assert to_html(markdown) == html
    visible(html)  # Telegram accepts it


@pytest.mark.parametrize(("markdown", "url"), [
    ("[x](tg://user?id=1)", None),
    ("ping [Ann](TG://user?id=123456789) now", None),
    ("[join](tg://resolve?domain=spam_bot&start=x)", None),
    ("[bad](javascript:alert(1))", None),
    ("[img](data:text/html;base64,PHNjcmlwdD4=)", None),
    ("[x](https:tg://user?id=1)", None),
    ("[x](&#116;g://user?id=1)", None),
    ('[x](https://a.b/"><a/href="tg://user?id=1">)', None),
    ('<a href="tg://user?id=1">hi</a>', None),
    ("<a href='tg://user?id=1'>hi</a> and <a href=javascript:alert(1)>x</a>", None),
    ("**[x](tg://user?id=1)**", None),
    ("[docs](https://example.com/a?b=1&c=2)", "https://example.com/a?b=1&c=2"),
    ("[site](HTTP://EXAMPLE.COM/)", "HTTP://EXAMPLE.COM/"),
    ("[mail](mailto:ann@example.com)", "mailto:ann@example.com"),
])
def test_links_only_to_the_web_and_mail(markdown: str, url: str | None) -> None:
    html_text = to_html(markdown)
    _, entities = parse_text(html_text, "HTML", None)
    links = [e["url"] for e in entities if e["type"] == "text_link"]
    assert links == ([url] if url else [])
    hrefs = re.findall(r"<a\s[^>]*>", html_text, flags=re.IGNORECASE)
    assert len(hrefs) == len(links)  # every tag is one Tandem made, for a web or mail link
    assert all(re.match(r'<a href="(https?://|mailto:)', tag, flags=re.IGNORECASE)
               for tag in hrefs)


def test_model_html_is_shown_as_text() -> None:
    text, kinds = visible(to_html("Use <b>unclosed and <foo>bar</foo> & co"))
    assert text == "Use <b>unclosed and <foo>bar</foo> & co" and kinds == []


def test_code_block_keeps_its_language_and_text() -> None:
    text, kinds = visible(to_html("Run:\n```bash\necho '<hi>' && ls\n```\ndone"))
    assert text == "Run:\necho '<hi>' && ls\ndone" and kinds == ["pre"]


MARKDOWNISH = st.lists(st.sampled_from([*"ab *_~`[]()#-<>&\\\n:/.é😀", "```", "**",
                                        "https://x.y", "```py\n"]), max_size=80).map("".join)


@settings(max_examples=400, deadline=None)
@given(MARKDOWNISH)
def test_any_text_gives_html_telegram_accepts_and_no_longer(markdown: str) -> None:
    html_text = to_html(markdown)
    try:
        shown, _ = parse_text(html_text, "HTML", None)
    except ApiError as exc:  # pragma: no cover - the failure message is the point
        raise AssertionError(f"{markdown!r} -> {html_text!r}: {exc.description}") from None
    assert len(shown) <= len(markdown.strip()) or not markdown.strip()
    assert plain(html_text).strip() == shown


@settings(max_examples=100, deadline=None)
@given(st.lists(st.sampled_from(["word " * 30, "```py\nx = 1 < 2\n" * 20 + "```", "**b** " * 40,
                                 "\n\n"]), max_size=30))
def test_split_parts_each_render_within_the_limit(pieces: list[str]) -> None:
    markdown = "".join(pieces)
    for part in split_text(markdown or " ", 4096):
        shown, _ = parse_text(to_html(part), "HTML", None)
        assert len(shown) <= 4096


def test_approval_card() -> None:
    card = approval_card("shell", "rm -rf build/ && echo <done>", "Ann", 1800)
    text, kinds = visible(card)
    assert text == ("🔐 Tandem wants to run shell:\nrm -rf build/ && echo <done>\n"
                    "Requested by Ann · expires in 30 min")
    assert kinds == ["code", "pre"]


def test_approval_card_says_why_it_asks() -> None:
    reason = "Asked because this conversation has read content from web_fetch of <x>."
    text, _ = visible(approval_card("remember", "a fact", "Ann", 60, reason=reason))
    assert text == ("🔐 Tandem wants to run remember:\na fact\n"
                    f"⚠️ {reason}\nRequested by Ann · expires in 60 s")


def test_approval_card_for_a_long_call_points_to_the_file() -> None:
    summary = "x" * (CARD_SUMMARY_LIMIT + 1)
    text, _ = visible(approval_card("shell", summary, "Ann", 60, "command.txt"))
    assert "xxxx" not in text and "command.txt" in text and f"{len(summary):,}" in text


@pytest.mark.parametrize(("outcome", "line"), [
    ("approved", "✅ Approved by Ann"), ("denied", "❌ Denied by Ann"),
    ("always", "✅ Always allowed in this chat by Ann"), ("expired", "⌛ Expired — not run"),
    ("cancelled", "⏹ Cancelled — not run"),
    ("superseded", "↪️ Skipped — a new message came first"),
])
def test_outcome_lines(outcome: str, line: str) -> None:
    assert outcome_line(outcome, "Ann") == line


@pytest.mark.parametrize(("seconds", "text"), [(1, "1 s"), (45, "45 s"), (1800, "30 min"),
                                               (7200, "2 h")])
def test_duration(seconds: float, text: str) -> None:
    assert duration(seconds) == text


@pytest.mark.parametrize(("text", "parsed"), [
    ("/help", ("help", "", None)),
    ("/Status@Tandem_Bot", ("status", "", "Tandem_Bot")),
    ("/new please now", ("new", "please now", None)),
    ("hello /help", None),
    ("/", None),
    ("/help@", None),
])
def test_parse_command(text: str, parsed: tuple[str, str, str | None] | None) -> None:
    assert parse_command(text) == parsed


def test_strip_mention() -> None:
    assert strip_mention("@Tandem_bot, what's up?", "tandem_bot") == "what's up?"
    assert strip_mention("ask @tandem_bot about x", "tandem_bot") == "ask about x"
    assert strip_mention("mail a@tandem_bot.dev or @tandem_bot2", "tandem_bot") == \
        "mail a@tandem_bot.dev or @tandem_bot2"
