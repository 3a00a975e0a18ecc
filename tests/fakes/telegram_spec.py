"""Every call to the fake Telegram server checked against the Bot API's own spec.

``spec/telegram_bot_api.json`` is generated from the machine-readable Bot API
description by ``spec/regen.py`` (MIT, see ``spec/LICENSE.telegram-bot-api``).
:func:`check_call` decodes a request's parameters by the types the spec gives
them (form values are strings on the wire; nested objects are JSON) and refuses,
with a 400 in Telegram's wording where Telegram has one:

* a parameter the method does not have (Telegram ignores those; the fake refuses
  them so that a misspelt or dropped parameter is noticed): ``unknown parameter``;
* a missing required parameter: ``<name> is empty`` (``message text is empty``);
* a value of the wrong type, at any depth: ``can't parse <param>: Field "<f>" must
  be of type <T>``; a field an object does not have; a subtype whose ``type`` is
  none of the spec's;
* every range the spec states: string lengths in characters or bytes
  (``callback_data`` 1-64 bytes is ``BUTTON_DATA_INVALID``, a callback answer over
  200 characters ``MESSAGE_TOO_LONG``), integer values, array lengths; lengths
  "after entities parsing" are left to the handlers, which parse first
  (:func:`visible_range` gives them the spec's numbers);
* a button with other than exactly one action (an inline keyboard's) or more than
  one (a reply keyboard's).

Unknown methods are 404 ``Not Found``, as Telegram answers.
"""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path
from typing import Any

SPEC_FILE = Path(__file__).with_name("spec") / "telegram_bot_api.json"
JSONDict = dict[str, Any]

# Telegram's own error texts for some of the spec's rules, by (method or type, field).
MISSING_TEXTS = {
    ("sendMessage", "text"): "message text is empty",
    ("editMessageText", "text"): "message text is empty",
    ("answerCallbackQuery", "callback_query_id"): "QUERY_ID_INVALID",
}
RANGE_TEXTS = {
    ("InlineKeyboardButton", "callback_data"): "BUTTON_DATA_INVALID",
    ("answerCallbackQuery", "text"): "MESSAGE_TOO_LONG",
    ("BotCommand", "command"): "BOT_COMMAND_INVALID",
    ("BotCommand", "description"): "BOT_COMMAND_DESCRIPTION_INVALID",
    ("setWebhook", "secret_token"): "secret token contains unallowed characters",
    ("CopyTextButton", "text"): "COPY_TEXT_INVALID",
}
SHAPE_TEXTS = {
    "InlineKeyboardButton": (
        "can't parse inline keyboard button: Text buttons are unallowed in the inline keyboard"
    ),
    "KeyboardButton": "can't parse keyboard button: exactly one button action may be used",
}
TYPE_NAMES = {
    "InlineKeyboardButton": "inline keyboard button",
    "KeyboardButton": "keyboard button",
    "InlineKeyboardMarkup": "inline keyboard markup",
    "ReplyKeyboardMarkup": "reply keyboard markup",
}


class SpecError(Exception):
    """A call the Bot API would refuse: HTTP status and Telegram's description."""

    def __init__(self, status: int, description: str) -> None:
        super().__init__(description)
        self.status = status
        self.description = description


def _bad(text: str) -> SpecError:
    return SpecError(400, f"Bad Request: {text}")


@cache
def spec() -> JSONDict:
    data: JSONDict = json.loads(SPEC_FILE.read_text(encoding="utf-8"))
    return data


@cache
def _method_names() -> dict[str, str]:
    return {name.lower(): name for name in spec()["methods"]}


def method_name(name: str) -> str | None:
    """The method's spelling in the spec (Telegram matches names case-insensitively)."""
    return _method_names().get(name.lower())


def fields_of(owner: str) -> dict[str, JSONDict]:
    """A method's parameters or a type's fields, by name."""
    table = spec()["methods"] if owner in spec()["methods"] else spec()["types"]
    return {f["name"]: f for f in table[owner]["fields"]}


def visible_range(owner: str, name: str) -> tuple[int, int]:
    """The spec's characters-after-entity-parsing range of a text parameter."""
    low, high, unit = fields_of(owner)[name]["range"]
    assert unit == "visible", (owner, name, unit)
    return low, high


REFUSALS: list[str] = []
"""Every call refused by the spec in this process, as ``method: description`` (the test
suite fails a test that made one, unless it is marked ``refused_calls``)."""


def check_call(method: str, params: JSONDict) -> JSONDict:
    """The parameters decoded by the spec's types; :class:`SpecError` if refused."""
    try:
        return _checked(method, params)
    except SpecError as exc:
        REFUSALS.append(f"{method}: {exc.description}")
        raise


def _checked(method: str, params: JSONDict) -> JSONDict:
    known = fields_of(method)
    for key in params:
        if key not in known:
            raise _bad(f'unknown parameter "{key}" for method {method}')
    out: JSONDict = {}
    for name, field in known.items():
        value = params.get(name)
        if value is None or (value == "" and "String" not in field["types"]):
            if field["required"]:
                raise _bad(MISSING_TEXTS.get((method, name), f"{name} is empty"))
            if name in params:
                out[name] = value
            continue
        out[name] = _value(method, name, field, value, name, top=True)
    return out


def _decode(value: Any, types: list[str], top: bool) -> Any:
    """A form value (a string) as the type wants it; JSON for objects and arrays."""
    if not top or not isinstance(value, str) or "String" in types:
        if top and isinstance(value, str) and "Integer" in types:
            stripped = value.strip()
            if stripped.lstrip("-").isdigit():
                return int(stripped)
        return value
    kind = types[0]
    if kind in ("Integer", "Float"):
        try:
            return int(value) if kind == "Integer" else float(value)
        except ValueError:
            return value
    if kind in ("Boolean", "True"):
        lowered = value.strip().lower()
        return {"true": True, "1": True, "false": False, "0": False}.get(lowered, value)
    if kind == "InputFile":
        return value
    try:
        return json.loads(value)
    except ValueError:
        return value


def _value(owner: str, name: str, field: JSONDict, value: Any, where: str, top: bool) -> Any:
    types: list[str] = field["types"]
    value = _decode(value, types, top)
    for kind in types:
        if _matches(kind, value):
            _check_value(owner, name, field, kind, value, where)
            return value
    objects = [kind for kind in types if kind in spec()["types"]]
    if len(objects) == 1 and isinstance(value, dict):
        _check_object(objects[0], value, where)  # raises, naming the field at fault
    raise _bad(f"can't parse {_where(owner, where)}: Field \"{name}\" must be of type "
               f"{' or '.join(types)}")


def _where(owner: str, where: str) -> str:
    root = where.split("/")[0].split("[")[0]
    return TYPE_NAMES.get(owner, root)


def _matches(kind: str, value: Any) -> bool:
    if kind.startswith("Array of "):
        return isinstance(value, list)
    if kind == "Integer":
        return isinstance(value, int) and not isinstance(value, bool)
    if kind == "Float":
        return isinstance(value, int | float) and not isinstance(value, bool)
    if kind == "String":
        return isinstance(value, str)
    if kind == "Boolean":
        return isinstance(value, bool)
    if kind == "True":
        return value is True
    if kind == "InputFile":
        return not isinstance(value, str | int | float | bool | list | dict)
    if kind == "KeyboardButton" and isinstance(value, str):
        return True
    return isinstance(value, dict) and _object_fits(kind, value)


def _object_fits(kind: str, value: JSONDict) -> bool:
    """Whether an object can be this type: its required fields are there (for a
    union, one of its subtypes fits)."""
    entry = spec()["types"].get(kind)
    if entry is None:
        return False
    if entry.get("subtypes"):
        return _subtype(kind, value) is not None
    required = [f["name"] for f in entry["fields"] if f["required"]]
    return all(key in value for key in required) or not required


def _subtype(kind: str, value: JSONDict) -> str | None:
    for sub in spec()["types"][kind]["subtypes"]:
        fields = fields_of(sub)
        const = fields.get("type", {}).get("const")
        if const is not None and value.get("type") == const:
            return str(sub)
    return None


def _check_value(owner: str, name: str, field: JSONDict, kind: str, value: Any, where: str) -> None:
    limits = field.get("range")
    if limits is not None:
        _check_range(owner, name, limits, value)
    if kind.startswith("Array of "):
        inner = kind.removeprefix("Array of ")
        item_field = {"types": [inner]}
        for i, item in enumerate(value):
            _value(owner, name, item_field, item, f"{where}[{i}]", top=False)
        return
    if isinstance(value, dict):
        _check_object(kind, value, where)


def _check_range(owner: str, name: str, limits: list[Any], value: Any) -> None:
    low, high, unit = limits
    size: int
    if unit == "visible":
        return  # the handlers count what is left after entity parsing
    if unit == "chars" and isinstance(value, str):
        size = len(value)
    elif unit == "bytes" and isinstance(value, str):
        size = len(value.encode())
    elif unit == "items" and isinstance(value, list):
        size = len(value)
    elif unit == "value" and isinstance(value, int):
        size = value
    else:
        return
    if not low <= size <= high:
        what = "must be" if unit == "value" else f"must have {unit} in"
        raise _bad(RANGE_TEXTS.get((owner, name), f"{name} {what} {low}-{high}"))


def _check_object(kind: str, value: JSONDict, where: str) -> None:
    entry = spec()["types"].get(kind)
    if entry is None:
        raise _bad(f"can't parse {where}: unknown type {kind}")
    if entry.get("subtypes"):
        sub = _subtype(kind, value)
        if sub is None:
            raise _bad(f"can't parse {where}: unsupported {kind} type {value.get('type')!r}")
        kind, entry = sub, spec()["types"][sub]
    fields = {f["name"]: f for f in entry["fields"]}
    for key in value:
        if key not in fields:
            raise _bad(f'can\'t parse {_where(kind, where)}: unknown field "{key}"')
    for name, field in fields.items():
        if name not in value:
            if field["required"]:
                raise _bad(
                    f"can't parse {_where(kind, where)}: Field \"{name}\" must be of type "
                    f"{' or '.join(field['types'])}"
                )
            continue
        const = field.get("const")
        if const is not None and value[name] != const:
            raise _bad(f"can't parse {where}: Field \"type\" must be {const!r}")
        _value(kind, name, field, value[name], f"{where}/{name}", top=False)
    _check_shape(kind, entry, value)


def _check_shape(kind: str, entry: JSONDict, value: JSONDict) -> None:
    if "one_of" in entry:
        used = [key for key in entry["one_of"] if key in value]
        if len(used) != 1:
            raise _bad(SHAPE_TEXTS.get(kind, f"{kind}: exactly one of {entry['one_of']}"))
    if "at_most_one_of" in entry:
        used = [key for key in entry["at_most_one_of"] if key in value]
        if len(used) > 1:
            raise _bad(SHAPE_TEXTS.get(kind, f"{kind}: at most one of {entry['at_most_one_of']}"))
