"""The documentation cannot drift from the code: `config.example.yaml` and the README's
Configuration section name every configuration key with its default, the README's
Tools table names every built-in tool with its default approval policy, and its layout
table (How a turn works) names every package of `bot/`.

The rules:

* A *key* is a leaf path of `Config`, found by walking pydantic's `model_fields`: a
  field whose type is a section (a model) is walked into; any other field is a leaf,
  dict- and list-valued ones included (`approvals.tools`, `mcp.servers`). `source` is
  left out: the loader sets it, it is not configured.
* `config.example.yaml`: every key is present, uncommented, at its path, with the model's
  default. A string holding `${...}` is an environment reference (a secret): its value
  is not compared, but the default must be unset (None). Commented-out lines are ignored,
  so only examples *inside* a dict-valued key may be commented out: the example MCP
  servers under `mcp.servers: {}`, which must validate and use every server key. The
  `approvals.tools` entries must restate the tools' own default policies, so the file
  behaves exactly as the defaults do; loading it with `load_config` (only
  `OPENAI_API_KEY` set) gives the defaults.
* README table (`| key | default | meaning |`): the first cell's backticked names are its
  keys. The first is a full path; a later one whose first part is not a section is
  short for a sibling of the first (`limits.breakers.same_call` / `same_call_failures`).
  Every key has a row and every name is a key. Defaults: the default cell is split like
  the key cell (on " / " or ", "); one part covers every name, else there must be one
  part per name. A part in backticks or a bare number is a YAML literal and must equal
  the default, `unset` means None, anything else is prose and is not compared.
* README Tools table (`| tool | default policy | when tainted | ... |`): one row per
  built-in tool (`bot.run.app.default_tools`), no others; the policy in backticks equals
  `Tool.policy`; "when tainted" is `asks` for a tool that writes lasting state or sends
  data out, `asks for a URL nobody gave` for one that only reaches a URL, else
  `its policy`.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from pydantic import BaseModel

from bot.core.config import Config, McpServerConfig, load_config
from bot.run.app import default_tools
from bot.tools import Tool

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
EXAMPLE = ROOT / "config.example.yaml"
NOT_CONFIGURED = {"source"}
ENV_REF = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-[^}]*)?\}")
MISSING = object()


def leaves(model: type[BaseModel] = Config, prefix: str = "") -> Iterator[tuple[str, Any]]:
    """(dotted key, default) for every leaf of `model`."""
    for name, field in model.model_fields.items():
        path = prefix + name
        if path in NOT_CONFIGURED:
            continue
        kind = field.annotation
        if isinstance(kind, type) and issubclass(kind, BaseModel):
            yield from leaves(kind, path + ".")
        else:
            yield path, field.get_default(call_default_factory=True)


KEYS = dict(leaves())


def same(a: Any, b: Any) -> bool:
    """Equal, and a boolean only where the other is one (`1 == True` is not enough)."""
    return bool(a == b) and isinstance(a, bool) == isinstance(b, bool)


def at(tree: Any, path: str) -> Any:
    for part in path.split("."):
        if not isinstance(tree, dict) or part not in tree:
            return MISSING
        tree = tree[part]
    return tree


def example() -> dict[str, Any]:
    data: dict[str, Any] = yaml.safe_load(EXAMPLE.read_text(encoding="utf-8"))
    return data


def env_refs(tree: Any, prefix: str = "") -> Iterator[str]:
    if isinstance(tree, dict):
        for key, value in tree.items():
            yield from env_refs(value, f"{prefix}{key}.")
    elif isinstance(tree, str) and ENV_REF.search(tree):
        yield prefix.rstrip(".")


def tool_defaults() -> dict[str, Tool]:
    return {tool.name: tool for tool in default_tools()}


# config.example.yaml

def test_every_key_is_in_the_example_with_its_default() -> None:
    data = example()
    problems = []
    for key, default in KEYS.items():
        value = at(data, key)
        if value is MISSING:
            problems.append(f"{key}: missing (default {default!r})")
        elif isinstance(value, str) and ENV_REF.search(value):
            if default is not None:
                problems.append(f"{key}: an environment reference, but the default is "
                                f"{default!r}, not unset")
        elif key == "approvals.tools":
            continue  # checked below: its entries restate the tools' defaults
        elif not same(value, default):
            problems.append(f"{key}: {value!r} in the example, {default!r} in the code")
    assert not problems, "config.example.yaml:\n" + "\n".join(problems)


def test_the_example_approvals_restate_the_tools_defaults() -> None:
    tools = tool_defaults()
    listed = example()["approvals"]["tools"]
    assert listed, "approvals.tools lists no example entries"
    for name, policy in listed.items():
        assert name in tools, f"approvals.tools.{name}: no such built-in tool"
        assert policy == tools[name].policy, (
            f"approvals.tools.{name}: {policy} in the example, {tools[name].policy} in the code")


def test_the_commented_mcp_servers_are_valid_and_use_every_server_key() -> None:
    lines = EXAMPLE.read_text(encoding="utf-8").splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("  servers: {}"))
    block = []
    for line in lines[start + 1:]:
        if not line.startswith("  # "):
            break
        block.append(line.removeprefix("  # "))
    servers: dict[str, Any] = yaml.safe_load("\n".join(block))
    assert servers, "no example MCP servers after `servers: {}`"
    used: set[str] = set()
    for server in servers.values():
        McpServerConfig.model_validate(server)
        used |= set(server)
    assert used == set(McpServerConfig.model_fields), "keys no example MCP server shows: " + \
        ", ".join(sorted(set(McpServerConfig.model_fields) - used))


def test_the_example_loads_as_the_defaults(monkeypatch: pytest.MonkeyPatch) -> None:
    refs = set(env_refs(example()))
    for ref in ENV_REF.finditer(EXAMPLE.read_text(encoding="utf-8")):
        monkeypatch.delenv(ref.group(1), raising=False)
    monkeypatch.setenv("OPENAI_API_KEY", "sk-example")
    loaded = load_config(str(EXAMPLE), environ={}).model_dump()
    defaults = Config().model_dump()
    for key in refs | {"source", "approvals.tools"}:  # approvals.tools: checked above
        *parents, last = key.split(".")
        for tree in (loaded, defaults):
            for part in parents:
                tree = tree[part]
            del tree[last]
    assert loaded == defaults


# README: the Configuration table

def configuration() -> tuple[str, str]:
    """The Configuration section: (the key table's part, the Tools part)."""
    text = README.read_text(encoding="utf-8")
    start = text.index("## Configuration\n")
    end = text.index("\n## ", start + 1)
    keys, _, tools = text[start:end].partition("\n### Tools\n")
    assert tools, "the Configuration section has no `### Tools` heading"
    return keys, tools


def rows(text: str, header: str) -> list[list[str]]:
    """The cells of each row of the table whose header row starts with `header`."""
    lines = text[text.index(header):].splitlines()
    out = []
    for line in lines[2:]:
        if not line.startswith("|"):
            break
        out.append([cell.strip() for cell in line.strip().strip("|").split("|")])
    return out


def names(cell: str) -> tuple[list[str], str]:
    """The full keys a key cell names, and the separator between them."""
    found = re.findall(r"`([^`]+)`", cell)
    assert found, f"a row names no key: {cell}"
    first = found[0]
    assert first.split(".")[0] in Config.model_fields, f"not a full key path: {first}"
    parent = first.rpartition(".")[0]
    keys = [first] + [name if name.split(".")[0] in Config.model_fields else f"{parent}.{name}"
                      for name in found[1:]]
    return keys, " / " if " / " in cell else ", "


def literal(part: str) -> Any:
    """The value a default cell's part states, or MISSING for prose."""
    quoted = re.fullmatch(r"`([^`]*)`", part)
    if quoted:
        return yaml.safe_load(quoted.group(1))
    if re.fullmatch(r"-?\d+(\.\d+)?", part):
        return yaml.safe_load(part)
    if part == "unset":
        return None
    return MISSING


def test_every_key_is_in_the_readme_table_with_its_default() -> None:
    table, _ = configuration()
    documented: dict[str, str] = {}
    problems = []
    for cells in rows(table, "| key | default | meaning |"):
        keys, sep = names(cells[0])
        parts = [p.strip() for p in cells[1].split(sep)] if len(keys) > 1 else [cells[1]]
        if len(parts) == 1:
            parts *= len(keys)
        if len(parts) != len(keys):
            problems.append(f"{cells[0]}: {len(keys)} keys but {len(parts)} defaults")
            continue
        for key, part in zip(keys, parts, strict=True):
            if key not in KEYS:
                problems.append(f"{key}: in the README but not a key")
                continue
            documented[key] = part
            stated, default = literal(part), KEYS[key]
            if stated is not MISSING and not same(stated, default):
                problems.append(f"{key}: README says {part}, the code {default!r}")
    problems += [f"{key}: not in the README table" for key in KEYS if key not in documented]
    assert not problems, "README Configuration table:\n" + "\n".join(problems)


# README: the Tools table

def tainted(tool: Tool) -> str:
    if tool.lasting:
        return "asks"
    if tool.reaches:
        return "asks for a URL nobody gave"
    return "its policy"


def test_every_tool_is_in_the_readme_with_its_default_policy() -> None:
    _, text = configuration()
    tools = tool_defaults()
    documented = {}
    for cells in rows(text, "| tool | default policy | when tainted |"):
        found = re.fullmatch(r"`(\w+)`", cells[0])
        assert found, f"a Tools row must name one tool: {cells[0]}"
        documented[found.group(1)] = cells
    assert set(documented) == set(tools), (
        f"missing from the README: {sorted(set(tools) - set(documented))}; "
        f"not built-in tools: {sorted(set(documented) - set(tools))}")
    for name, cells in documented.items():
        assert cells[1] == f"`{tools[name].policy}`", (
            f"{name}: README says {cells[1]}, the code `{tools[name].policy}`")
        assert cells[2] == tainted(tools[name]), (
            f"{name}: README says {cells[2]!r} when tainted, the code {tainted(tools[name])!r}")


# README: the layout of bot/

def test_the_readme_layout_names_every_package_of_bot() -> None:
    text = README.read_text(encoding="utf-8")
    start = text.index("## How a turn works\n")
    section = text[start:text.index("\n## ", start + 1)]
    documented = set()
    for cells in rows(section, "| package | what it holds |"):
        documented |= set(re.findall(r"`bot/(\w+)/`", cells[0]))
    packages = {p.parent.name for p in (ROOT / "bot").glob("*/__init__.py")}
    assert documented == packages, (
        f"missing from the README: {sorted(packages - documented)}; "
        f"not packages of bot/: {sorted(documented - packages)}")
