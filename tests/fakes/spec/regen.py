"""Regenerate ``telegram_bot_api.json`` from the Bot API's machine-readable spec.

    python tests/fakes/spec/regen.py path/to/api.min.json

The source is the community-maintained machine-readable Bot API description (MIT,
see ``LICENSE.telegram-bot-api``).  What is kept is what the fake Telegram server
checks calls against: every method's parameters (name, types, required) and the
input types they reach, with the limits the descriptions state turned into data:

* ``range``: ``[low, high, unit]``; unit ``chars`` (a string's length), ``visible``
  (characters after entity parsing, checked by the fake's handlers), ``bytes``
  (UTF-8 length), ``value`` (an Integer's value) or ``items`` (an Array's length);
* ``const``: the one value a subtype's ``type`` field takes (``always "emoji"``);
* ``one_of`` / ``at_most_one_of`` on a type: the fields of which exactly one / at
  most one may be present (the button shapes).
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path
from typing import Any

OUT = Path(__file__).with_name("telegram_bot_api.json")
PRIMITIVES = {"Integer", "String", "Boolean", "Float", "True", "InputFile"}

_CHARS = re.compile(r"\b(\d+)-(\d+) (characters|bytes)( after entit(?:y|ies) parsing)?", re.I)
_VALUES = re.compile(r"\b(\d+)-(\d+)\b")
_ITEMS = re.compile(r"\b(?:list|array) of (\d+)-(\d+)\b|must include (\d+)-(\d+) items", re.I)
_CONST = re.compile(r'(?:always|must be) "?([a-z0-9_]+)"?\s*$')
_SHAPE = re.compile(
    r"(Exactly one|At most one) of the fields other than ([a-z_, ]+?) must be used", re.I
)


def base_type(name: str) -> str:
    return name.removeprefix("Array of ").removeprefix("Array of ")


def field_range(field: dict[str, Any]) -> list[Any] | None:
    text = " ".join(field["description"]) if isinstance(field["description"], list) else ""
    text = text or str(field["description"])
    types = field["types"]
    if types == ["String"]:
        match = _CHARS.search(text)
        if match:
            low, high, unit, parsed = match.groups()
            kind = "visible" if parsed else ("bytes" if unit.lower() == "bytes" else "chars")
            return [int(low), int(high), kind]
    if types == ["Integer"]:
        match = re.search(r"Values between (\d+)-(\d+)", text) or _VALUES.fullmatch(text.strip())
        if match is None:
            match = re.search(r"(?:^|[,;] )(\d+)-(\d+)(?:$|[.;,])", text)
        if match:
            return [int(match.group(1)), int(match.group(2)), "value"]
    if all(t.startswith("Array of") for t in types):
        match = _ITEMS.search(text)
        if match:
            low, high = [int(g) for g in match.groups() if g is not None]
            return [low, high, "items"]
    return None


def slim_field(field: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {
        "name": field["name"],
        "types": field["types"],
        "required": field["required"],
    }
    limits = field_range(field)
    if limits:
        out["range"] = limits
    if field["name"] == "type" and field["types"] == ["String"]:
        match = _CONST.search(str(field["description"]).rstrip(". "))
        if match:
            out["const"] = match.group(1)
    return out


def slim_type(spec: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {"fields": [slim_field(f) for f in spec.get("fields", [])]}
    if spec.get("subtypes"):
        out["subtypes"] = spec["subtypes"]
    match = _SHAPE.search(" ".join(spec.get("description", [])))
    if match:
        kept = {name.strip() for name in re.split(r",|\band\b", match.group(2)) if name.strip()}
        key = "one_of" if match.group(1).lower() == "exactly one" else "at_most_one_of"
        out[key] = [f["name"] for f in spec.get("fields", []) if f["name"] not in kept]
    return out


def referenced(types: list[str]) -> set[str]:
    return {base_type(base_type(t)) for t in types} - PRIMITIVES


def build(source: dict[str, Any]) -> dict[str, Any]:
    methods = {
        name: {"fields": [slim_field(f) for f in spec.get("fields", [])]}
        for name, spec in source["methods"].items()
    }
    wanted: set[str] = set()
    for spec in source["methods"].values():
        for field in spec.get("fields", []):
            wanted |= referenced(field["types"])
    types: dict[str, Any] = {}
    while wanted:
        name = wanted.pop()
        if name in types or name not in source["types"]:
            continue
        spec = source["types"][name]
        types[name] = slim_type(spec)
        wanted |= set(spec.get("subtypes", []))
        for field in spec.get("fields", []):
            wanted |= referenced(field["types"])
    return {
        "version": source["version"],
        "release_date": source["release_date"],
        "licence": "MIT, see LICENSE.telegram-bot-api; regenerate with regen.py",
        "methods": methods,
        "types": dict(sorted(types.items())),
    }


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    source = json.loads(Path(argv[1]).read_text(encoding="utf-8"))
    OUT.write_text(json.dumps(build(source), indent=1, ensure_ascii=False) + "\n", "utf-8")
    print(f"wrote {OUT} ({source['version']})")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
