"""The credentials in an MCP server's configuration, for redaction.

Every value of its `headers` (and a header's last word: `Bearer <token>`), and each value
of its `env` and `args` that looks like a credential: one named like a secret
(`GITHUB_TOKEN`, `--api-key X`, `--password=X`, `API_KEY=X`), the password in a URL
(`postgresql://bot:<password>@db/app`) or a secret-named parameter of its query, and a
long random-looking word (a key given without a name).
"""

from __future__ import annotations

import re
from urllib.parse import parse_qsl, urlsplit

from bot.core.redact import SECRET_NAME
from bot.core.sections import McpServerConfig

RANDOM_CHARS = 20
"""A word this long of letters and digits mixed (and `+/=_.~-`) counts as a key."""
_WORD = re.compile(r"[A-Za-z0-9+/=_.~-]+")
_SPLIT = re.compile(r"[\s,;\"']+")


def credentials(server: McpServerConfig) -> list[str]:
    """What the redactor must learn from `server`'s configuration."""
    found: list[str] = []
    for value in server.headers.values():
        found += [value, *value.split()[-1:], *_in(value, named=False)]
    for key, value in server.env.items():
        found += _in(value, named=_named(key))
    args = server.args
    for i, arg in enumerate(args):
        flag, equals, value = arg.partition("=")
        if equals and _named(flag):
            found += _in(value, named=True)  # --api-key=X, API_KEY=X
        elif arg.startswith("-") and _named(arg) and i + 1 < len(args):
            found += _in(args[i + 1], named=True)  # --api-key X
        else:
            found += _in(arg, named=False)
    return list(dict.fromkeys(s for s in found if s))


def _named(name: str) -> bool:
    return SECRET_NAME.search(name.replace("-", "_")) is not None


def _in(value: str, *, named: bool) -> list[str]:
    """The secrets in one value: all of it when its name says so, else what looks like
    one inside it."""
    found = [value] if named else []
    for word in _SPLIT.split(value):
        if "://" in word:
            found += _from_url(word)
        elif _random(word):
            found.append(word)
    return found


def _from_url(url: str) -> list[str]:
    try:
        parts = urlsplit(url)
        password = parts.password
    except ValueError:
        return []
    found = [password] if password else []
    found += [v for k, v in parse_qsl(parts.query) if _named(k) or _random(v)]
    return found


def _random(word: str) -> bool:
    """A long word of letters and digits mixed, not a path: a key with no name."""
    return (len(word) >= RANDOM_CHARS and _WORD.fullmatch(word) is not None
            and not word.startswith(("/", ".", "~"))
            and any(c.isdigit() for c in word) and any(c.isalpha() for c in word)
            and len(set(word)) >= 10)


__all__ = ["credentials"]
