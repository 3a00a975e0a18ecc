"""An MCP server's tools as Tandem tools: names, schemas, cards and results.

Each tool is `mcp_<server>_<tool>` with every character outside `[A-Za-z0-9_-]` replaced,
at most 64 characters (a short hash when it is cut or collides). Its schema is passed to
the model as the server gave it, after a check: a tool whose schema the model could not
use is left out with one log line, the rest of the server stays. Every MCP tool asks by
default (`mcp.servers.<name>.approvals` says otherwise per tool), counts as lasting
(it may do anything) and as untrusted (what it returns taints the conversation). Its
description and schema are the server's words, not Tandem's: unless the server is marked
`trusted`, they taint every conversation they are offered to (`Tool.outside`). A
server's own hints (`readOnlyHint`...) are shown on the card and never relax the policy.
"""

from __future__ import annotations

import base64
import fnmatch
import functools
import hashlib
import json
import logging
import re
from collections.abc import Awaitable, Callable, Iterable
from typing import Any

from bot.core.config import McpServerConfig
from bot.core.errors import ToolError
from bot.tools import Tool, ToolContext
from bot.tools.mcp.media import Kept

log = logging.getLogger(__name__)

MAX_NAME = 64
_UNSAFE = re.compile(r"[^A-Za-z0-9_-]")
Keep = Callable[[str, str, bytes], str]
"""(kind, mime type, bytes) of a part that is not text -> where it was kept."""
Call = Callable[[str, dict[str, Any], Keep | None], Awaitable[str]]
"""(the server's tool name, arguments, where other parts go) -> the result text, or
ToolError."""


def tool_name(server: str, tool: str, taken: set[str]) -> str:
    name = _UNSAFE.sub("_", f"mcp_{server}_{tool}")
    if len(name) > MAX_NAME or name in taken:
        digest = hashlib.sha256(f"{server}\x00{tool}".encode()).hexdigest()[:6]
        name = f"{name[:MAX_NAME - 7]}_{digest}"
    return name


def offered(config: McpServerConfig, tool: str) -> bool:
    """`tools.include` / `tools.exclude` (names or globs) let this tool through."""
    def hit(patterns: list[str]) -> bool:
        return any(fnmatch.fnmatchcase(tool, p) for p in patterns)
    return hit(config.tools.include) and not hit(config.tools.exclude)


def schema_problem(schema: Any) -> str | None:
    """Why the model could not use `schema` as a function's parameters (None: it can)."""
    if not isinstance(schema, dict):
        return "its input schema is not an object"
    if schema.get("type", "object") != "object":
        return f"its input schema has type {schema.get('type')!r}, not 'object'"
    if not isinstance(schema.get("properties", {}), dict):
        return "its input schema's `properties` is not an object"
    try:
        text = json.dumps(schema, sort_keys=True)
    except (TypeError, ValueError):
        return "its input schema is not JSON"
    invalid = _invalid(text)
    if invalid is not None:
        return f"its input schema is invalid ({invalid})"
    missing = [ref for ref in _refs(schema) if _pointer(schema, ref) is None]
    if missing:
        return f"its input schema refers to {missing[0]!r}, which it does not define"
    return None


_META: dict[type, Any] = {}


@functools.lru_cache(maxsize=1024)
def _invalid(text: str) -> str | None:
    """What the JSON Schema meta-schema says against this schema (tools often share one)."""
    schema = json.loads(text)
    error = next(_meta_validator(schema).iter_errors(schema), None)
    return None if error is None else str(error.message)


def _meta_validator(schema: dict[str, Any]) -> Any:
    """A validator of schemas of `schema`'s draft, built once per draft (building one
    costs far more than using it)."""
    import jsonschema

    cls = jsonschema.validators.validator_for(schema)
    if cls not in _META:
        _META[cls] = cls(cls.META_SCHEMA, format_checker=None)
    return _META[cls]


def _refs(node: Any) -> list[str]:
    """Every local `$ref` in `node` (other references are the server's business)."""
    if isinstance(node, dict):
        found = [node["$ref"]] if isinstance(node.get("$ref"), str) else []
        return found + [r for value in node.values() for r in _refs(value)]
    if isinstance(node, list):
        return [r for value in node for r in _refs(value)]
    return []


def _pointer(schema: dict[str, Any], ref: str) -> Any:
    if not ref.startswith("#"):
        return schema  # remote: not checked here
    node: Any = schema
    for part in filter(None, ref[1:].split("/")):
        part = part.replace("~1", "/").replace("~0", "~")
        if not isinstance(node, dict) or part not in node:
            return None
        node = node[part]
    return node


def hints(annotations: Any) -> str:
    """What the server says about a tool, for the card (it decides nothing)."""
    if annotations is None:
        return ""
    said = []
    for attribute, text in (("read_only_hint", "read-only"), ("destructive_hint", "destructive"),
                            ("idempotent_hint", "idempotent"), ("open_world_hint", "open world")):
        value = getattr(annotations, attribute, None)
        if value is not None:
            said.append(text if value else f"not {text}")
    return ", ".join(said)


def build_tools(server: str, config: McpServerConfig, listed: Iterable[Any],
                call: Call) -> list[Tool]:
    """Tandem tools for the server's `listed` tools (`mcp.types.Tool`), sorted by name."""
    taken: set[str] = set()
    tools = []
    for spec in sorted(listed, key=lambda s: str(s.name)):
        original = str(spec.name)
        if not offered(config, original):
            continue
        problem = schema_problem(spec.input_schema)
        if problem is not None:
            log.warning("mcp: %s's tool %r is left out: %s", server, original, problem)
            continue
        name = tool_name(server, original, taken)
        taken.add(name)
        tools.append(_tool(server, config, original, name, spec, call))
    return tools


def _tool(server: str, config: McpServerConfig, original: str, name: str, spec: Any,
          call: Call) -> Tool:
    said = hints(spec.annotations)
    description = (spec.description or "").strip() or f"The {original} tool of {server}."

    async def run(ctx: ToolContext, args: dict[str, Any]) -> str:
        kept = Kept(ctx.workspace, server, original)
        text = await call(original, args, kept)
        return "\n".join([text, *await kept.show(ctx.extras.get("send_file"))])

    def render(args: dict[str, Any]) -> str:
        head = f"{server} › {original}" + (f"  (the server says: {said})" if said else "")
        body = json.dumps(args, ensure_ascii=False, indent=1, sort_keys=True)
        return f"{head}\n{body}"

    return Tool(name, f"[MCP server {server}] {description}", spec.input_schema, run,
                policy=config.approvals.get(original, "ask"), render=render, lasting=True,
                untrusted=True, outside=None if config.trusted else f"the MCP server `{server}`")


def result_text(server: str, result: Any, keep: Keep | None = None) -> str:
    """A `CallToolResult` as text for the model (other parts given to `keep`, else only
    named); `isError` raises ToolError."""
    parts = [_part(server, item, keep) for item in result.content or []]
    if not parts and result.structured_content is not None:
        parts.append(json.dumps(result.structured_content, ensure_ascii=False))
    text = "\n".join(p for p in parts if p)
    if result.is_error:
        raise ToolError(text or f"{server} reported an error without a message")
    return text or "(no output)"


def _bytes(data: str | None) -> bytes:
    try:
        return base64.b64decode(data or "", validate=False)
    except ValueError:
        return b""


def _part(server: str, item: Any, keep: Keep | None) -> str:
    kind = getattr(item, "type", "")
    if kind == "text":
        return str(item.text)
    if kind in {"image", "audio"}:
        data = _bytes(item.data)
        where = keep(kind, item.mime_type, data) if keep and data else "not shown here"
        return f"[{kind} from {server}: {item.mime_type}, {len(data):,} bytes; {where}]"
    if kind == "resource":
        resource = item.resource
        text = getattr(resource, "text", None)
        if isinstance(text, str):
            return f"[resource {resource.uri}]\n{text}"
        data = _bytes(getattr(resource, "blob", None))
        mime = resource.mime_type or "application/octet-stream"
        where = keep("resource", mime, data) if keep and data else "not shown here"
        return f"[resource {resource.uri}: {mime}, {len(data):,} bytes; {where}]"
    if kind == "resource_link":
        return f"[resource link {item.uri}: {item.name}]"
    return f"[{kind or 'unknown'} content from {server}; not shown here]"


__all__ = ["build_tools", "result_text", "schema_problem", "tool_name"]
