"""`tandem doctor`: check what Tandem needs and say what is wrong in plain words.

The checks that wait on something else (the database, each platform's service, the MCP
servers, the model) run at once, while litellm, which takes seconds to import, loads in
a thread from the start. `quick` checks the config, the persona and the database only:
no network and no litellm, for a container's health check.
"""

from __future__ import annotations

import asyncio
import logging
import shlex
from collections.abc import Sequence
from pathlib import Path

from bot.core.config import Config
from bot.core.file_modes import too_open
from bot.turn.persona import Persona

OK, BAD, WARN = "ok  ", "FAIL", "warn"
Result = tuple[str, str, str]
"""(what, OK | BAD | WARN, text): one line of the report."""
NO_PLATFORM = ("no platform is enabled (telegram.enabled, slack.enabled): `tandem run` would "
               "talk in this terminal; `tandem init` sets one up")


def doctor(config: Config, *, quick: bool = False) -> int:
    """Print one line per check and a verdict; 1 when a check failed, else 0."""
    logging.disable(logging.WARNING)
    if not quick:
        from bot.llm import preload

        preload()
    results = asyncio.run(_quick(config) if quick else _everything(config))
    for name, status, text in results:
        print(f"[{status}] {name}: {text}")
    failed = sum(1 for _, status, _ in results if status == BAD)
    print("All checks passed." if not failed else f"{failed} check(s) failed.")
    return 1 if failed else 0


async def _quick(config: Config) -> list[Result]:
    """The sandbox too when it is on (Tandem would not start without it)."""
    shell = config.tools.shell.sandbox == "bwrap"
    return [("config", OK, f"loaded from {config.source or 'built-in defaults'}"),
            *_persona(config), *await _database(config), *(sandbox(config) if shell else [])]


async def _everything(config: Config) -> list[Result]:
    local, live, mcp, model = await asyncio.gather(
        _quick(config), _platform_checks(config), _mcp(config), _model(config))
    shell = [] if config.tools.shell.sandbox == "bwrap" else sandbox(config)  # else in local
    return [*local, *shell, *privacy(config), *_by_platform([*_platforms(config), *live]),
            *mcp, *model]


def _by_platform(results: list[Result]) -> list[Result]:
    """Each platform's lines together, who may talk last."""
    order = ("platforms", "telegram", "slack")
    return sorted(results, key=lambda r: (order.index(r[0].split()[0]), r[0].endswith(" access")))


def _persona(config: Config) -> list[Result]:
    persona = Persona(config.persona.dir)
    if persona.packaged():
        return [("persona", WARN, persona.note())]
    missing = persona.missing()
    if missing:
        return [("persona", BAD, f"missing in {config.persona.dir}/: {', '.join(missing)}")]
    return [("persona", OK, f"{config.persona.dir}/ ({len(persona.system_prompt())} chars)")]


async def _database(config: Config) -> list[Result]:
    from bot.core.errors import StoreError
    from bot.store.backends import open_store

    target = config.store.target
    postgres = target.startswith(("postgresql://", "postgres://"))
    if postgres:
        from bot.store.postgres_base import redact

        where = f"PostgreSQL {redact(target)}"
    else:
        where = f"SQLite {Path(target.removeprefix('sqlite://'))}"
    store = open_store(target)
    try:
        await store.open()
        check = await store.integrity_check()
    except StoreError as exc:
        return [("database", BAD, str(exc))]
    finally:
        await store.close()
    status = OK if check == "ok" else BAD
    out = [("database", status, f"{where}: integrity {check}")]
    if postgres:
        from bot.serve.cluster import stats

        try:
            workers, depth = await stats(target)
        except Exception as exc:  # the queue's tables are the workers' business
            out.append(("workers", WARN, f"could not read the task queue ({type(exc).__name__})"))
        else:
            out.append(("workers", OK, f"{workers} alive, {depth} jobs queued or running"))
    return out


def sandbox(config: Config) -> list[Result]:
    """Whether the shell's sandbox runs here: a `true` run in it, as every command would be."""
    from bot.tools import sandbox as bwrap

    why = bwrap.check(config.tools.shell)
    if config.tools.shell.sandbox != "bwrap":
        works = "bubblewrap works here" if why is None else f"it could not run here: {why}"
        return [("sandbox", OK, f"off (tools.shell.sandbox: none); {works}")]
    if why is not None:
        return [("sandbox", BAD, f"{why}. Tandem will not start with tools.shell.sandbox: "
                 "bwrap until it runs")]
    return [("sandbox", OK, "shell commands run under bubblewrap (no network, own "
             "processes, only the workspace writable)")]


def _private_paths(config: Config) -> list[Path]:
    """What holds conversations or memory: the database and its folder, the persona's
    USER.md and MEMORY.md, and its `memory/` folder with everything in it."""
    paths = []
    if config.store.url is None and config.store.path != ":memory:":
        db = Path(config.store.path)
        paths += [db.parent, db, db.with_name(db.name + "-wal"), db.with_name(db.name + "-shm")]
    persona = Path(config.persona.dir)
    paths += [persona / "USER.md", persona / "MEMORY.md"]
    memory = persona / "memory"
    if memory.is_dir():
        paths += [memory, *sorted(memory.rglob("*"))]
    return paths


def privacy(config: Config) -> list[Result]:
    """Warn when other users of the machine can open the database or the memory files."""
    open_ = [p for p in _private_paths(config) if too_open(p)]
    if not open_:
        return [("privacy", OK, "the database and memory files are private to this user")]
    fixes = []
    for command, group in (("chmod 600", [p for p in open_ if not p.is_dir()]),
                           ("chmod 700", [p for p in open_ if p.is_dir()])):
        if group:
            fixes.append(" ".join([command, *(shlex.quote(str(p)) for p in group)]))
    names = ", ".join(str(p) for p in open_)
    return [("privacy", WARN, f"other users of this machine can open {names}, which hold "
             f"conversations or memory. Fix: {'; '.join(fixes)}")]


def _platforms(config: Config) -> list[Result]:
    """What the config says of each platform: secrets set, and who may talk."""
    out: list[Result] = []
    if not (config.telegram.enabled or config.slack.enabled):
        return [("platforms", WARN, NO_PLATFORM)]
    if config.telegram.enabled:
        if not config.telegram.token:
            out.append(("telegram", BAD, "telegram.token is not set"))
        out.append(_access("telegram", config.telegram.allowed_users,
                           config.telegram.approvers))
    if config.slack.enabled:
        need = ["bot_token", "app_token" if config.slack.mode == "socket" else "signing_secret"]
        missing = [k for k in need if not getattr(config.slack, k)]
        if missing:
            out.append(("slack", BAD, ", ".join(f"slack.{k} is not set" for k in missing)))
        out.append(_access("slack", config.slack.allowed_users, config.slack.approvers))
    return out


def _access(platform: str, allowed: Sequence[int | str], approvers: Sequence[int | str]) -> Result:
    what = f"{platform} access"
    if not allowed and not approvers:
        return (what, WARN, f"{platform}.allowed_users and {platform}.approvers are empty: "
                "nobody can talk to Tandem (message the bot: it tells a stranger their id)")
    users = "everyone may talk (\"*\")" if "*" in allowed else _count(len(allowed),
                                                                      "allowed user")
    return (what, OK, f"{users}, {_count(len(approvers), 'approver')}")


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"


async def _platform_checks(config: Config) -> list[Result]:
    """What each enabled platform's adapter finds by asking its service, all at once (an
    adapter module may offer `check(config)`: [(name, ok | warn | fail, text)])."""
    import importlib

    statuses = {"ok": OK, "warn": WARN, "fail": BAD}
    checks = []
    for name in ("telegram", "slack"):
        if not getattr(config, name).enabled:
            continue
        check = getattr(importlib.import_module(f"adapters.{name}"), "check", None)
        if check is not None:
            checks.append(check(config))
    found = await asyncio.gather(*checks)
    return [(what, statuses[status], text) for lines in found for what, status, text in lines]


async def _mcp(config: Config) -> list[Result]:
    """Connect to each enabled MCP server once and say how it went."""
    if not any(server.enabled for server in config.mcp.servers.values()):
        return []  # and the MCP library stays unloaded
    from bot.tools import Registry
    from bot.tools.mcp import Servers

    servers = Servers(config.mcp, Registry())
    if not servers.connections:
        return []
    servers.start()
    limit = max(s.connect_timeout_s for s in config.mcp.servers.values()) + 5
    try:
        async with asyncio.timeout(limit):
            await servers.ready()
    except TimeoutError:
        pass
    finally:
        await servers.close()
    results = []
    for name, connection in servers.connections.items():
        if connection.connected_at is not None:
            results.append((f"mcp {name}", OK, f"connected, {connection.tool_count} tools "
                            "offered"))
        else:
            why = connection.error or f"no answer within {limit:.0f} s"
            results.append((f"mcp {name}", BAD, f"could not connect: {why}"))
    return results


async def _model(config: Config) -> list[Result]:
    from bot import llm as models
    from bot.core.errors import ModelError, ModelUnreachable
    from bot.llm import Completion, LiteLLMClient

    llm = config.llm.model_copy(update={"retries": 0, "timeout_s": min(config.llm.timeout_s, 20),
                                        "max_output_tokens": 8, "fallbacks": []})
    client = LiteLLMClient(llm)
    try:
        async for item in client.stream([{"role": "user", "content": "Say OK."}], []):
            if isinstance(item, Completion):
                return [("model", OK, f"{config.llm.model} answered")]
    except ModelError as exc:
        if isinstance(exc, ModelUnreachable):  # why, and where, in one line
            detail = f"{exc.cause} ({exc.where})"
        else:
            detail = str(exc)
        return [("model", BAD, f"{config.llm.model}: {detail}. Check llm.model, "
                 "llm.api_base and llm.api_key.")]
    finally:
        await models.close()  # litellm's HTTP clients, while this loop still runs
    return [("model", BAD, "the model returned no answer")]
