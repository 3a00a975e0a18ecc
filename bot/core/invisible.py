"""Characters a reader cannot see, written out so that what is shown is what will run.

`visible` writes every hidden character as `⟨U+XXXX⟩`: controls, format characters
(direction overrides, zero-width...), unusual spaces and line separators, surrogates,
private-use and unassigned code points, and every Default_Ignorable_Code_Point of Unicode
whatever its category (variation selectors, the combining grapheme joiner, Hangul
fillers, Khmer inherent vowels, Mongolian free variation selectors, tag characters).
`smuggled` reads back what runs of variation selectors or tag characters spell (one byte
or one ASCII character each): how text hides a payload in what looks like nothing.
"""

from __future__ import annotations

import re
import unicodedata

DEFAULT_IGNORABLE = (
    (0x00AD, 0x00AD), (0x034F, 0x034F), (0x061C, 0x061C), (0x115F, 0x1160),
    (0x17B4, 0x17B5), (0x180B, 0x180F), (0x200B, 0x200F), (0x202A, 0x202E),
    (0x2060, 0x206F), (0x3164, 0x3164), (0xFE00, 0xFE0F), (0xFEFF, 0xFEFF),
    (0xFFA0, 0xFFA0), (0xFFF0, 0xFFF8), (0x1BCA0, 0x1BCA3), (0x1D173, 0x1D17A),
    (0xE0000, 0xE0FFF),
)
"""Unicode's Default_Ignorable_Code_Point ranges (DerivedCoreProperties.txt, 15.1)."""
IGNORABLE = re.compile("[" + "".join(
    re.escape(chr(a)) if a == b else f"{re.escape(chr(a))}-{re.escape(chr(b))}"
    for a, b in DEFAULT_IGNORABLE) + "]")
HIDDEN_CATEGORIES = frozenset({"Cc", "Cf", "Cs", "Co", "Cn", "Zs", "Zl", "Zp"})
SHOWN_AS_IS = frozenset("\n\t ")
SMUGGLED = re.compile("[\ufe00-\ufe0f\U000e0100-\U000e01ef]{4,}|[\U000e0000-\U000e007f]{4,}")
"""Runs of variation selectors (a byte each) or tag characters (an ASCII character each)."""


def hidden(char: str, *, one_line: bool = False) -> bool:
    """A reader cannot see `char`, or it changes how the text around it is shown (with
    `one_line`, line breaks and tabs count too)."""
    if char in SHOWN_AS_IS and not (one_line and char != " "):
        return False
    return unicodedata.category(char) in HIDDEN_CATEGORIES or IGNORABLE.match(char) is not None


def visible(text: str, *, one_line: bool = False) -> str:
    """`text` with every hidden character written out, e.g. ⟨U+202E⟩, so a card shows
    exactly what will run; `one_line` writes out line breaks and tabs too (a log line or
    an audit entry that nobody can split or overwrite)."""
    if text.isascii() and text.isprintable():
        return text
    return "".join(f"⟨U+{ord(c):04X}⟩" if hidden(c, one_line=one_line) else c for c in text)


def smuggled(run: str) -> str:
    """What a run of variation selectors or tag characters spells."""
    out = bytearray()
    for char in run:
        code = ord(char)
        if 0xFE00 <= code <= 0xFE0F:
            out.append(code - 0xFE00)
        elif 0xE0100 <= code <= 0xE01EF:
            out.append(code - 0xE0100 + 16)
        else:
            out.append(code - 0xE0000)
    return out.decode("utf-8", "replace")


__all__ = ["DEFAULT_IGNORABLE", "IGNORABLE", "SMUGGLED", "hidden", "smuggled", "visible"]
