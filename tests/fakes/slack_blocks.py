"""Block Kit payloads checked as Slack checks them, for the fake Slack server.

Each block goes through slack_sdk's own Block Kit models (``Block.parse`` then
``to_dict``, which runs every model validator: text lengths of headers, buttons
and section fields, element counts, button styles, ...).  A block the models
cannot read, or read only by dropping or changing part of it (an unknown field,
a string where a text object belongs, an empty ``text``), is refused too: what
Slack renders is what the models keep.  On top of the models, the documented
limits the models leave out:

* every text object (``plain_text`` / ``mrkdwn``) has 1-3,000 characters;
* ``block_id`` is unique within the message, ``action_id`` within its block
  (both at most 255 characters, which the models check).

The message-wide limits (50 blocks, 12,000 characters of ``markdown`` blocks in
all) are the server's.  Errors read like Slack's ``invalid_blocks`` errors, each
with a ``[json-pointer:...]``.
"""

from __future__ import annotations

from typing import Any

from slack_sdk.errors import SlackObjectFormationError
from slack_sdk.models.blocks import Block

TEXT_TYPES = frozenset({"plain_text", "mrkdwn"})
MAX_TEXT_OBJECT = 3_000


REFUSALS: list[str] = []
"""Every refused blocks payload's errors in this process (the test suite fails a test
that sent one, unless it is marked ``refused_calls``)."""


def recorded(errors: list[str]) -> list[str]:
    """``errors``, kept in :data:`REFUSALS` when there are any."""
    REFUSALS.extend(errors)
    return errors


def model_errors(blocks: list[Any]) -> list[str]:
    """What Slack would say about these blocks (empty when they are valid)."""
    errors: list[str] = []
    block_ids: set[str] = set()
    for i, block in enumerate(blocks):
        pointer = f"/blocks/{i}"
        errors.extend(_model_error(block, pointer))
        errors.extend(_text_object_errors(block, pointer))
        block_id = block.get("block_id") if isinstance(block, dict) else None
        if isinstance(block_id, str):
            if block_id in block_ids:
                errors.append(f"duplicate block_id [json-pointer:{pointer}/block_id]")
            block_ids.add(block_id)
        errors.extend(_action_id_errors(block, pointer))
    return errors


def _model_error(block: Any, pointer: str) -> list[str]:
    try:
        parsed = Block.parse(block)
        if parsed is None:
            return [f"unsupported type: {block.get('type')!r} [json-pointer:{pointer}/type]"]
        kept = parsed.to_dict()
    except SlackObjectFormationError as exc:
        return [f"{exc} [json-pointer:{pointer}]"]
    except (TypeError, ValueError, AttributeError, KeyError) as exc:
        return [f"invalid block: {exc} [json-pointer:{pointer}]"]
    where = _difference(block, kept, pointer)
    if where is not None:
        return [f"unsupported or malformed field [json-pointer:{where}]"]
    return []


def _difference(sent: Any, kept: Any, pointer: str) -> str | None:
    """The first place where what the models kept differs from what was sent."""
    if isinstance(sent, dict) and isinstance(kept, dict):
        for key in sorted(set(sent) | set(kept)):
            if key not in sent or key not in kept:
                return f"{pointer}/{key}"
            found = _difference(sent[key], kept[key], f"{pointer}/{key}")
            if found is not None:
                return found
        return None
    if isinstance(sent, list) and isinstance(kept, list):
        if len(sent) != len(kept):
            return pointer
        for i, (a, b) in enumerate(zip(sent, kept, strict=True)):
            found = _difference(a, b, f"{pointer}/{i}")
            if found is not None:
                return found
        return None
    return None if sent == kept and type(sent) is type(kept) else pointer


def _text_object_errors(node: Any, pointer: str) -> list[str]:
    errors: list[str] = []
    if isinstance(node, dict):
        if node.get("type") in TEXT_TYPES and "text" in node:
            text = node["text"]
            if not isinstance(text, str) or not 1 <= len(text) <= MAX_TEXT_OBJECT:
                errors.append(
                    f"must be between 1 and {MAX_TEXT_OBJECT} characters "
                    f"[json-pointer:{pointer}/text]"
                )
        for key, value in node.items():
            errors.extend(_text_object_errors(value, f"{pointer}/{key}"))
    elif isinstance(node, list):
        for i, value in enumerate(node):
            errors.extend(_text_object_errors(value, f"{pointer}/{i}"))
    return errors


def _action_id_errors(block: Any, pointer: str) -> list[str]:
    if not isinstance(block, dict):
        return []
    elements: list[tuple[str, Any]] = []
    if isinstance(block.get("accessory"), dict):
        elements.append((f"{pointer}/accessory", block["accessory"]))
    if isinstance(block.get("elements"), list) and block.get("type") in ("actions", "input"):
        elements.extend((f"{pointer}/elements/{j}", e) for j, e in enumerate(block["elements"]))
    if isinstance(block.get("element"), dict):
        elements.append((f"{pointer}/element", block["element"]))
    seen: set[str] = set()
    errors: list[str] = []
    for where, element in elements:
        action_id = element.get("action_id") if isinstance(element, dict) else None
        if isinstance(action_id, str):
            if action_id in seen:
                errors.append(f"duplicate action_id [json-pointer:{where}/action_id]")
            seen.add(action_id)
    return errors
