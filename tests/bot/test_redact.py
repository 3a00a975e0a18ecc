"""The one redaction pass: known secrets and token shapes, wherever they stand."""

from __future__ import annotations

import asyncio

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from bot.core.errors import ToolError
from bot.core.events import ApprovalRequested, ConvKey, Notice, Phase, Progress, TurnEnded, User
from bot.core.redact import MARK, Redactor, environment_secrets
from bot.tools import outcome_of

SIGNING = "3f9c2b7a1d8e4f60a5b9c3d2e1f0a7b6"
TOKEN = "123456789:AAFakeTelegramTokenValue1234567890abcd"
SHAPES = {
    "openai": "sk-proj-AbCdEf0123456789xyz",
    "anthropic": "sk-ant-api03-AbCdEf0123456789xyz",
    "slack bot": "xoxb-1111-2222-abcdefghijkl",
    "slack app": "xapp-1-A0123-456-abcdef0123",
    "telegram": TOKEN,
    "github": "ghp_" + "a1B2c3D4e5F6g7H8i9J0k1L2m3",
    "github pat": "github_pat_11ABCDEFG0123456789_abcdefghij",
    "aws": "AKIAIOSFODNN7EXAMPLE",
    "google": "AIza" + "SyA-abcdefghijklmnopqrstuvwxyz01234",
}


@pytest.mark.parametrize("kind", sorted(SHAPES))
def test_each_token_shape_is_replaced_glued_to_other_text_too(kind: str) -> None:
    secret = SHAPES[kind]
    redact = Redactor()
    for text in (secret, f"key={secret}\n", f"x{secret}", f'{{"k": "{secret}"}}'):
        out = redact(text)
        assert secret not in out and MARK in out, (kind, text, out)


def test_configured_secrets_of_any_shape_are_replaced_longest_first() -> None:
    redact = Redactor([SIGNING, SIGNING[:12], "short"])
    out = redact(f"a {SIGNING} b {SIGNING[:12]} c short")
    assert SIGNING not in out and SIGNING[:12] not in out
    assert out == f"a {MARK} b {MARK} c short"  # under 6 characters: not a secret


def test_plain_text_is_unchanged() -> None:
    text = "ls -la\n2026-12-01 12:30:45 sk-short  the task-list xox 1234567:abc\n"
    assert Redactor([SIGNING])(text) == text


@given(st.text(max_size=200), st.text(max_size=200), st.sampled_from(sorted(SHAPES)))
@example(head="\u00b2", tail="", kind="telegram")  # a digit to str.isdigit, not to [0-9]
@example(head="\u0663" * 3, tail="", kind="telegram")  # Arabic-Indic digits
@example(head="9" * 20, tail="", kind="telegram")
def test_a_secret_never_survives_whatever_surrounds_it(head: str, tail: str, kind: str) -> None:
    redact = Redactor([SIGNING])
    for secret in (SHAPES[kind], SIGNING):
        assert secret not in redact(head + secret + tail)


def test_environment_secrets_are_known_by_their_names() -> None:
    found = environment_secrets({"OPENAI_API_KEY": "sk-abcdefgh", "HOME": "/root/longer",
                                 "DB_PASSWORD": "hunter2hunter2", "SHORT_TOKEN": "abc"})
    assert sorted(found) == ["hunter2hunter2", "sk-abcdefgh"]


def test_a_capped_tool_output_is_redacted_before_the_cut() -> None:
    """The cap keeps a head and a tail: a secret straddling the cut must not leave half."""
    redact = Redactor([SIGNING])
    text = "x" * 660 + SIGNING + "y" * 2000  # the head of a 1,000 cap ends inside it

    async def result() -> str:
        return text

    async def failure() -> str:
        raise ToolError(text)

    async def outcomes() -> list[str]:
        done = []
        for make in (result, failure):
            task = asyncio.ensure_future(make())
            await asyncio.gather(task, return_exceptions=True)
            done.append(outcome_of(task, "shell", 1000, redact)[1])
        return done

    for out in asyncio.run(outcomes()):
        assert "characters cut" in out
        assert SIGNING[:8] not in out and SIGNING[-8:] not in out


def test_events_shown_in_a_chat_are_redacted() -> None:
    redact = Redactor([SIGNING])
    conv = ConvKey("telegram", "1")
    for event in (Notice(conv, f"key {SIGNING}"), Progress(conv, 1, Phase.THINKING, TOKEN),
                  TurnEnded(conv, 1, f"done {SIGNING}", "completed")):
        shown = redact.event(event)
        assert isinstance(shown, type(event)) and MARK in shown.text
        assert SIGNING not in shown.text and TOKEN not in shown.text
    card = redact.event(ApprovalRequested(conv, "a", "shell", f"echo {SIGNING}", User("1"), 60,
                                          reason=f"read {SIGNING}"))
    assert isinstance(card, ApprovalRequested)
    assert SIGNING not in card.summary and SIGNING not in (card.reason or "")
