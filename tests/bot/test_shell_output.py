"""The shell tool streams a command's output: the head and the tail are kept up to the
output limit and the rest is only counted, so a command that prints 50 MB costs Tandem
about the limit in memory, not 50 MB; secrets are redacted in what is kept, even one
that a cut splits in two."""

from __future__ import annotations

import asyncio
import contextlib
import re
import resource
import time
import tracemalloc
from pathlib import Path
from typing import Any

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from bot.core.history import Outcome
from bot.core.redact import MARK, Redactor
from bot.tools import ToolContext, outcome_of
from bot.tools.shell import shell

LIMIT = 16_000
CUT = re.compile(r"(.*)\n\n\[\.\.\. (\d+) characters cut \.\.\.\]\n\n(.*)", re.DOTALL)
KNOWN = "Zq8Wv0pLm4sTrK2xN7"  # a configured secret: no token shape matches it
TOKEN = "ghp_" + "a1B2c3D4e5F6g7H8i9J0k1L2m3N4o5P6q7R8"  # a GitHub token: found by its shape
FILLER = "ab cd\n"


def context(tmp_path: Path, **kwargs: Any) -> ToolContext:
    return ToolContext(workspace=tmp_path, protected=frozenset(),
                       env={"PATH": "/usr/bin:/bin"}, **kwargs)


async def run(ctx: ToolContext, command: str) -> tuple[Outcome, str]:
    """The call as the runner makes it: the tool, then `outcome_of` (redact, then cap)."""
    task = asyncio.ensure_future(shell(ctx, {"command": command}))
    await asyncio.gather(task, return_exceptions=True)
    return outcome_of(task, "shell", ctx.output_chars, ctx.redactor)


def parts(text: str) -> tuple[str, int, str]:
    """(head, characters cut, tail) of a cut output; exactly one cut note."""
    found = CUT.fullmatch(text)
    assert found is not None, text[:200]
    assert text.count("characters cut ...]") == 1
    return found[1], int(found[2]), found[3]


def peak_rss() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


async def test_50_mb_of_output_keeps_the_head_and_the_tail_and_counts_the_rest(
        tmp_path: Path) -> None:
    size = 50_000_000
    rss = peak_rss()
    tracemalloc.start()
    try:
        command = f"echo first-line; yes 2>/dev/null | head -c {size}; echo last-line"
        outcome, text = await run(context(tmp_path), command)
        traced_peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    grown = peak_rss() - rss
    assert traced_peak < 2_000_000, traced_peak  # the limit and a chunk, not 50 MB
    assert grown < 20_000_000, grown
    assert outcome is Outcome.OK and len(text) <= LIMIT
    head, cut, tail = parts(text)
    assert head.startswith("first-line\ny\ny\n") and tail.endswith("y\ny\nlast-line\n")
    assert len(head) + cut + len(tail) == len("first-line\n") + size + len("last-line\n")
    assert len(head) > LIMIT * 0.6 and len(tail) > LIMIT * 0.3  # the room is used


async def test_stderr_and_stdout_interleave_in_order(tmp_path: Path) -> None:
    outcome, text = await run(context(tmp_path),
                              "for i in 1 2 3; do echo out$i; echo err$i >&2; done")
    assert (outcome, text) == (Outcome.OK, "out1\nerr1\nout2\nerr2\nout3\nerr3\n")


async def test_a_short_output_is_whole_and_an_empty_one_says_so(tmp_path: Path) -> None:
    ctx = context(tmp_path, output_chars=1000)
    assert await shell(ctx, {"command": "seq 1 300"}) == "".join(f"{i}\n" for i in range(1, 301))
    assert await shell(ctx, {"command": "true"}) == "(no output)"


async def test_a_failing_command_reports_its_status_and_its_cut_output(tmp_path: Path) -> None:
    command = "echo oops-start >&2; yes no 2>/dev/null | head -c 3000000 >&2; echo oops-end; exit 7"
    outcome, text = await run(context(tmp_path), command)
    assert outcome is Outcome.ERROR and len(text) <= LIMIT  # the runner did not cut again
    head, cut, tail = parts(text)
    assert head.startswith("error: exit status 7\noops-start\nno\nno\n")
    assert tail.endswith("no\nno\noops-end\n")
    prefix = len("error: exit status 7\n")
    assert len(head) - prefix + cut + len(tail) == len("oops-start\noops-end\n") + 3_000_000


async def test_a_long_output_is_cut_within_a_small_limit(tmp_path: Path) -> None:
    outcome, text = await run(context(tmp_path, output_chars=1000), "seq 1 100000")
    head, cut, tail = parts(text)
    assert len(text) <= 1000 and head.startswith("1\n2\n3\n") and tail.endswith("99999\n100000\n")
    assert len(head) + cut + len(tail) == sum(len(f"{i}\n") for i in range(1, 100_001))


def printing(before: int, secret: str, total: int) -> str:
    """A command printing `total` characters of filler, `secret` at `before`."""
    after = total - before - len(secret)
    filler = f"yes '{FILLER[:-1]}' 2>/dev/null | head -c"
    return f"{filler} {before}; printf %s '{secret}'; {filler} {after}"


def leaks(text: str, secret: str, size: int = 5) -> list[str]:
    """Pieces of `secret` (`size` characters or more) that `text` shows."""
    return [secret[i:i + size] for i in range(len(secret) - size + 1)
            if secret[i:i + size] in text]


@pytest.mark.parametrize("secret", [KNOWN, TOKEN], ids=["configured", "shape"])
async def test_a_secret_is_redacted_in_the_head_and_the_tail_even_split_by_a_cut(
        tmp_path: Path, secret: str) -> None:
    ctx = context(tmp_path, redactor=Redactor([KNOWN]))
    total = 400_000
    _, plain = await run(ctx, printing(0, "", total))
    head, _, tail = parts(plain)
    h, s = len(head), total - len(tail)  # where the head ends and where the tail starts
    n = len(secret)
    starts = {"whole in the head": 100, "split by the head's end": [h - n + 1, h - n // 2, h - 1],
              "just after the head": h, "just before the tail": s - n,
              "split by the tail's start": [s - n + 1, s - n // 2, s - 1],
              "at the start of the tail": s, "whole in the tail": total - n - 100}
    for where, at in starts.items():
        for start in at if isinstance(at, list) else [at]:
            _, text = await run(ctx, printing(start, secret, total))
            assert not leaks(text, secret), (where, start)
            if where.startswith("whole") or where == "at the start of the tail":
                assert text.count(MARK) == 1, (where, start)
    _, text = await run(ctx, printing(s, secret, total))
    assert parts(text)[2].startswith(MARK)  # the tail window starts with it, redacted


async def test_a_secret_across_read_chunks_is_redacted(tmp_path: Path) -> None:
    ctx = context(tmp_path, output_chars=300_000, redactor=Redactor([KNOWN]))
    total = 1_000_000
    for start in (65_536 - 7, 131_072 - 3, total - 65_536 - 5):
        for secret in (KNOWN, TOKEN):
            _, text = await run(ctx, printing(start, secret, total))
            assert not leaks(text, secret) and MARK in text, (start, secret)


def _group_alive(pgid: int) -> bool:
    """Whether a process of group `pgid` is still running (a zombie is dead)."""
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError):
            fields = stat.read_text().rsplit(")", 1)[1].split()
            if int(fields[2]) == pgid and fields[0] != "Z":
                return True
    return False


async def test_cancel_while_the_command_prints_kills_it_within_a_second(
        tmp_path: Path) -> None:
    pids: list[int] = []

    async def track(pid: int) -> None:
        pids.append(pid)

    ctx = context(tmp_path, extras={"track_process": track})
    task = asyncio.ensure_future(shell(ctx, {"command": "yes printing"}))
    await asyncio.sleep(0.5)
    assert pids and _group_alive(pids[0]) and not task.done()
    started = time.monotonic()
    task.cancel()
    await asyncio.wait({task}, timeout=2)  # the pipe full and unread: no wait for it
    assert task.done()
    while _group_alive(pids[0]) and time.monotonic() - started < 1:
        await asyncio.sleep(0.02)
    assert not _group_alive(pids[0]) and time.monotonic() - started < 1
    assert task.cancelled()


@pytest.mark.parametrize("command", ["yes | head -c 5000000; sleep 30", "yes"])
async def test_a_command_that_prints_past_its_timeout_is_killed(
        tmp_path: Path, command: str) -> None:
    started = time.monotonic()
    outcome, text = await asyncio.wait_for(
        run(context(tmp_path, shell_timeout_s=1.0), command), 10)
    assert outcome is Outcome.ERROR and "timed out after 1 s" in text
    assert time.monotonic() - started < 3


# -- the cut, on its own: no piece of a secret on either side of it ----------------------

REDACTOR = Redactor([KNOWN])


def _text(before: int, secret: str, after: int) -> str:
    return (FILLER * (before // 6 + 1))[:before] + secret + (FILLER * (after // 6 + 1))[:after]


@given(st.integers(0, 300), st.sampled_from([KNOWN, TOKEN, "sk-" + "x" * 300]),
       st.integers(0, 300), st.integers(1, 400))
@example(100, KNOWN, 100, 105)  # the head's cut inside the secret
@example(100, TOKEN, 100, 110)
def test_a_head_shows_no_piece_of_a_secret_its_cut_split(
        before: int, secret: str, after: int, keep: int) -> None:
    text = _text(before, secret, after)
    for end in range(len(text) + 1):
        shown, used = REDACTOR.head(text[:end], keep)
        assert len(shown) <= keep and used <= end
        assert not leaks(shown, secret), (end, shown)
        assert used >= min(keep, end - REDACTOR.reach) - 2 * len(secret)  # no needless loss


@given(st.integers(0, 300), st.sampled_from([KNOWN, TOKEN, "sk-" + "x" * 300,
                                             "1234567890:" + "A" * 40]),
       st.integers(0, 300), st.integers(1, 400))
@example(100, KNOWN, 100, 105)  # the tail's start inside the secret
@example(100, TOKEN, 100, 130)
def test_a_tail_shows_no_piece_of_a_secret_its_cut_split(
        before: int, secret: str, after: int, keep: int) -> None:
    text = _text(before, secret, after)
    for start in range(len(text) + 1):
        shown, used = REDACTOR.tail(text[start:], keep)
        assert len(shown) <= keep and used <= len(text) - start
        assert not leaks(shown, secret), (start, shown)


def test_a_cut_away_from_any_secret_keeps_what_it_may() -> None:
    text = FILLER * 1000
    assert REDACTOR.head(text, 500) == (text[:500], 500)
    assert REDACTOR.tail(text, 500) == (text[-500:], 500)
    assert REDACTOR.head(text[:300], 500) == (text[:300 - REDACTOR.reach], 300 - REDACTOR.reach)


def test_the_redactor_reaches_as_far_as_its_longest_secret() -> None:
    assert Redactor().reach >= 43  # a Telegram token's shape: 12 digits, ':', 30 characters
    assert Redactor(["p" * 500]).reach >= 500
