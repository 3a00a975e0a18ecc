"""A shell command cut into the parts a rule must each cover.

The command is tokenized with `shlex` (POSIX rules, `;&|<>()` and newlines as operators)
and cut at every operator that starts another command: `;`, `&&`, `||`, `|`, `|&`, `&`,
newlines and parentheses (subshells). A redirection that reads or writes a file is a
part of its own (`>out.txt`, `<in.txt`): it must be covered too. Redirections to
`/dev/null` and copies of a descriptor (`2>&1`) change no file and are left out.

Whatever the parse does not model makes it inexact (`Parsed.exact` false), and an inexact
command is never allowed by a rule: `$` (variables, `$(…)`, `$'…'`), backticks, here
documents (`<<`), process substitution (`<(…)`), comments (`#`), control characters,
quotes that do not close, and an operator or keyword escaped or quoted (`\\;`, `\\{`,
`";"`: a word for the shell, a program, where the cut sees an operator or a keyword).
Cutting too often is safe (a quoted `"a;b"` makes extra parts that must be covered as
well); cutting too rarely is what the property tests look for.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass

OPERATORS = ";&|<>()\n"
KEYWORDS = frozenset({"{", "}", "!", "if", "then", "elif", "else", "fi", "do", "done", "while",
                      "until", "time"})
"""Words a part may start with that are not its program (dropped before matching)."""
UNMODELLED = ("$", "`", "#", "<<", "<(", ">(")
HARMLESS_TARGETS = frozenset({"/dev/null"})


@dataclass(frozen=True, slots=True)
class Part:
    """One simple command (`words`; `text` is them joined by single spaces, what a rule's
    glob sees), or one redirection (no words; `text` like `>out.txt`)."""

    text: str
    words: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class Parsed:
    parts: tuple[Part, ...]
    exact: bool
    """False: the command holds something this parse does not model; no rule allows it."""


def _controls(command: str) -> bool:
    return any((ord(c) < 32 and c not in "\t\n") or ord(c) == 127 for c in command)


def _tokens(command: str) -> list[str] | None:
    lexer = shlex.shlex(command, posix=True, punctuation_chars=OPERATORS)
    lexer.whitespace = " \t"
    lexer.whitespace_split = True
    lexer.commenters = ""
    try:
        raw = list(lexer)
    except ValueError:  # a quote that does not close
        return None
    return [t for token in raw
            for t in (_split_operators(token) if _is_operator(token) else [token])]


_OPERATOR_SPELLINGS = sorted(
    ["&&", "||", "|&", ";;", ">>", "&>>", "&>", ">&", "<&", "<>", ">|", "<<<", "<<-", "<<",
     "<(", ">(", *OPERATORS], key=len, reverse=True)


def _split_operators(run: str) -> list[str]:
    """A run of operator characters shlex kept together (`;>`), as the shell reads it."""
    out: list[str] = []
    while run:
        spelling = next(s for s in _OPERATOR_SPELLINGS if run.startswith(s))
        out.append(spelling)
        run = run[len(spelling):]
    return out


def _is_operator(token: str) -> bool:
    return bool(token) and all(c in OPERATORS for c in token)


def _is_redirection(token: str) -> bool:
    return all(c in "<>&|" for c in token) and ("<" in token or ">" in token)


_WORD_OF_OPERATORS = re.compile(
    r"""\\[;&|<>(){}!]|(["'])(?:[;&|<>()\s]+|[{}!]|if|then|elif|else|fi|do|done|while|until|time)\1""")
"""An operator or keyword escaped (`\\;`, `\\{`) or quoted (`";"`, `'if'`): a word for the
shell, a program to run, which the cut would take for an operator or a keyword."""


def parse(command: str) -> Parsed:
    """The parts of `command`, and whether the parse is exact."""
    exact = not _controls(command) and not any(u in command for u in UNMODELLED) \
        and _WORD_OF_OPERATORS.search(command) is None
    tokens = _tokens(command)
    if tokens is None:
        return Parsed(tuple(Part(w, (w,)) for w in command.split()), False)
    parts: list[Part] = []
    words: list[str] = []

    def close() -> None:
        while words and words[0] in KEYWORDS:
            words.pop(0)
        if words:
            parts.append(Part(" ".join(words), tuple(words)))
        words.clear()

    i = 0
    while i < len(tokens):
        token = tokens[i]
        if not _is_operator(token):
            words.append(token)
        elif _is_redirection(token):
            target = tokens[i + 1] if i + 1 < len(tokens) else None
            if words and words[-1].isdigit():
                words.pop()  # `2>`: the descriptor, not an argument
            if target is None or _is_operator(target):
                exact = False
            else:
                i += 1
                if not _harmless(token, target):
                    parts.append(Part(token + target))
        else:
            close()
        i += 1
    close()
    return Parsed(tuple(parts), exact)


def _harmless(operator: str, target: str) -> bool:
    if operator.endswith("&") and (target.isdigit() or target == "-"):
        return True  # `2>&1`, `>&2`, `<&-`: descriptors, no file
    return operator in (">", ">>", "&>") and target in HARMLESS_TARGETS
