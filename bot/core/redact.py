"""One redaction pass for every text that leaves a tool or the model.

Tool results, model answers and error texts go through `Redactor.redact` before they
reach the model, the store, a log or a chat. It knows every secret Tandem was given
(config values, secrets in its own environment, MCP server credentials once added) and
common token shapes, and replaces each with `[secret]` in one precompiled regex pass.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Mapping
from dataclasses import replace

from bot.core.events import ApprovalRequested, Event, Notice, Progress, Suspended, TurnEnded
from bot.core.invisible import IGNORABLE, SMUGGLED, smuggled

MARK = "[secret]"
MIN_SECRET_CHARS = 6
"""Shorter values are left alone: redacting `abc` everywhere would mangle text."""
SECRET_NAME = re.compile(r"TOKEN|SECRET|PASSWORD|PASSWD|API_?KEY|PRIVATE|CREDENTIAL",
                         re.IGNORECASE)
"""Environment variable names whose values are secrets."""
TOKEN_SHAPES = (
    # (a literal-led probe, the shape, at most how many digits before the probe it starts)
    ("xox", r"xox[abposr]-[A-Za-z0-9-]{8,}", 0),           # Slack bot, user... tokens
    ("xapp-", r"xapp-[A-Za-z0-9-]{8,}", 0),                # Slack app-level tokens
    ("sk-", r"sk-[A-Za-z0-9_-]{12,}", 0),                  # OpenAI, Anthropic (sk-ant-...)
    (":[A-Za-z0-9_-]{30}", r"[0-9]{6,12}:[A-Za-z0-9_-]{30,}", 12),  # Telegram bot tokens
    ("gh", r"gh[pousr]_[A-Za-z0-9]{20,}", 0),              # GitHub tokens
    ("github_pat_", r"github_pat_[A-Za-z0-9_]{20,}", 0),
    ("AKIA", r"AKIA[0-9A-Z]{16}", 0),                      # AWS access key ids
    ("ASIA", r"ASIA[0-9A-Z]{16}", 0),
    ("AIza", r"AIza[0-9A-Za-z_-]{35}", 0),                 # Google API keys
)
"""No word boundaries: a shape matches wherever it appears, glued to other text too."""
SHAPE_REACH = 64
"""Every shape matches once this many of its characters are there (a Telegram token
needs 43): a cut further into a token than that leaves a part that is still found."""
TOKEN_RUN = re.compile(r"[A-Za-z0-9_:-]+")
"""The characters every shape is made of: a text cut inside a token starts with a run
of them, which no shape may match without the token's start."""


def environment_secrets(environ: Mapping[str, str] | None = None) -> list[str]:
    """Values of this process's variables whose names say they are secrets."""
    environ = os.environ if environ is None else environ
    return [v for k, v in environ.items() if SECRET_NAME.search(k) and len(v) >= 8]


_SHAPES = tuple((re.compile(probe), re.compile(shape), digits)
                for probe, shape, digits in TOKEN_SHAPES)


def _shapes(text: str) -> list[tuple[int, int]]:
    """Where token shapes stand in `text`: the shape is tried only where its probe hit."""
    spans = []
    for probe, shape, digits in _SHAPES:
        for hit in probe.finditer(text):
            start = hit.start()
            while digits and start > 0 and hit.start() - start < digits \
                    and "0" <= text[start - 1] <= "9":  # ASCII only: "²".isdigit()
                start -= 1
            found = shape.match(text, start)
            if found is not None:
                spans.append(found.span())
    return spans


def _cut(text: str, spans: list[tuple[int, int]]) -> str:
    """`text` with each span (overlapping ones merged) replaced by the mark."""
    out, last = [], 0
    for start, end in sorted(spans):
        if end <= last:
            continue
        out.append(text[last:max(start, last)])
        out.append(MARK if start >= last else "")
        last = end
    out.append(text[last:])
    return "".join(out)


class Redactor:
    """Replaces known secrets and token shapes; `add` teaches it more (kept for good).

    Known secrets are found by plain substring search and each shape is tried only where
    its literal-led probe hit, so a 16 kB output costs one fast scan per secret and per
    shape (about 0.1 ms; `benchmarks/redact_bench.py`) instead of a regex alternation
    tried at every position."""

    def __init__(self, secrets: Iterable[str] = ()) -> None:
        self._secrets: tuple[str, ...] = ()
        self.add(secrets)

    def add(self, secrets: Iterable[str]) -> None:
        new = {s for s in secrets if s and len(s) >= MIN_SECRET_CHARS}
        # a secret that a shape matches whole is found by that shape wherever it stands
        new = {s for s in new if not any(shape.fullmatch(s) for _, shape, _ in _SHAPES)}
        # longest first, so a secret that contains another is replaced whole
        self._secrets = tuple(sorted({*self._secrets, *new}, key=lambda s: (-len(s), s)))

    def redact(self, text: str) -> str:
        if not text:
            return text
        for secret in self._secrets:
            if secret in text:
                text = text.replace(secret, MARK)
        spans = _shapes(text)
        text = _cut(text, spans) if spans else text
        if text.isascii() or IGNORABLE.search(text) is None:
            return text
        return self._through_ignorables(text)

    def _through_ignorables(self, text: str) -> str:
        """Secrets hidden with invisible characters: spelled by a run of them (variation
        selectors, tag characters), or with them strewn between their characters."""
        text = SMUGGLED.sub(lambda m: MARK if self._holds_secret(smuggled(m.group()))
                            else m.group(), text)
        bare = IGNORABLE.sub("", text)
        found = self._spans(bare) if len(bare) < len(text) else []
        if not found:
            return text
        kept = [i for i, char in enumerate(text) if IGNORABLE.match(char) is None]
        return _cut(text, [(kept[start], kept[end - 1] + 1) for start, end in found])

    def _holds_secret(self, text: str) -> bool:
        bare = IGNORABLE.sub("", text)
        return bool(self._spans(bare))

    def _spans(self, text: str) -> list[tuple[int, int]]:
        """Where known secrets and token shapes stand in `text`."""
        spans = _shapes(text)
        for secret in self._secrets:
            start = text.find(secret)
            while start >= 0:
                spans.append((start, start + len(secret)))
                start = text.find(secret, start + len(secret))
        return spans

    __call__ = redact

    @property
    def reach(self) -> int:
        """How far past a cut a secret that the cut split can stand: the longest known
        secret, or as far as a shape needs to match."""
        return max(SHAPE_REACH, len(self._secrets[0]) if self._secrets else 0)

    def head(self, text: str, keep: int) -> tuple[str, int]:
        """`text`, the start of a longer output cut at its end, redacted and shortened to
        at most `keep` characters that end where no secret is split: (what to show, how
        many characters of `text` it stands for).

        Its last `reach` characters are never shown (a secret the cut split may start
        there, and would not be found), and the shown part must redact as it does within
        the whole `text`, else it ends earlier: a secret it would split is never halved."""
        whole = self.redact(text)
        end, step = max(0, min(keep, len(text) - self.reach)), 1
        while end > 0:
            shown = self.redact(text[:end])
            if len(shown) <= keep and whole.startswith(shown):
                return shown, end
            end, step = max(0, end - step), step * 2
        return "", 0

    def tail(self, text: str, keep: int) -> tuple[str, int]:
        """`text`, the end of a longer output cut at its start, redacted and shortened to
        at most `keep` characters that start where no secret is split: (what to show, how
        many characters of `text` it stands for).

        A secret the cut split ends within `reach` characters of the start, a token within
        the run of token characters the text starts with (however long): neither is
        shown, and the shown part must redact as it does within the whole `text`."""
        whole = self.redact(text)
        run = TOKEN_RUN.match(text)
        start, step = max(len(text) - keep, self.reach, run.end() if run else 0), 1
        while start < len(text):
            shown = self.redact(text[start:])
            if len(shown) <= keep and whole.endswith(shown):
                return shown, len(text) - start
            start, step = min(len(text), start + step), step * 2
        return "", 0

    def event(self, event: Event) -> Event:
        """`event` with every text a chat shows redacted."""
        match event:
            case Progress() | TurnEnded() | Suspended() | Notice() if event.text:
                return replace(event, text=self.redact(event.text))
            case ApprovalRequested():
                return replace(event, summary=self.redact(event.summary),
                               reason=self.redact(event.reason) if event.reason else None)
        return event


def known(secrets: Iterable[str]) -> Redactor:
    """A redactor for `secrets` (the config's) and the secrets in Tandem's environment."""
    return Redactor([*secrets, *environment_secrets()])


__all__ = ["MARK", "Redactor", "environment_secrets", "known"]
