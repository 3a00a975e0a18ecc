"""`tandem doctor`: check what Tandem needs and say what is wrong in plain words."""

from __future__ import annotations

import asyncio
import logging
import shlex
from pathlib import Path

from bot.config import Config
from bot.file_modes import too_open
from bot.persona import Persona

OK, BAD, WARN = "ok  ", "FAIL", "warn"


def doctor(config: Config) -> int:
    logging.disable(logging.WARNING)
    results = [("config", OK, f"loaded from {config.source or 'built-in defaults'}")]
    results += _persona(config)
    results += asyncio.run(_database(config))
    results += privacy(config)
    results += _platforms(config)
    results += asyncio.run(_platform_checks(config))
    results += asyncio.run(_mcp(config))
    results += asyncio.run(_model(config))
    for name, status, text in results:
        print(f"[{status}] {name}: {text}")
    failed = sum(1 for _, status, _ in results if status == BAD)
    print("All checks passed." if not failed else f"{failed} check(s) failed.")
    return 1 if failed else 0


def _persona(config: Config) -> list[tuple[str, str, str]]:
    persona = Persona(config.persona.dir)
    missing = persona.missing()
    if missing:
        return [("persona", BAD, f"missing in {config.persona.dir}/: {', '.join(missing)}")]
    return [("persona", OK, f"{config.persona.dir}/ ({len(persona.system_prompt())} chars)")]


async def _database(config: Config) -> list[tuple[str, str, str]]:
    from bot.errors import StoreError
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
        from bot.cluster import stats

        try:
            workers, depth = await stats(target)
        except Exception as exc:  # the queue's tables are the workers' business
            out.append(("workers", WARN, f"could not read the task queue ({type(exc).__name__})"))
        else:
            out.append(("workers", OK, f"{workers} alive, {depth} jobs queued or running"))
    return out


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


def privacy(config: Config) -> list[tuple[str, str, str]]:
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


def _platforms(config: Config) -> list[tuple[str, str, str]]:
    out = []
    if config.telegram.enabled:
        if not config.telegram.token:
            out.append(("telegram", BAD, "telegram.token is not set"))
        elif not config.telegram.allowed_users:
            out.append(("telegram", WARN, "telegram.allowed_users is empty: nobody can talk"))
        else:
            users = config.telegram.allowed_users
            who = "everyone may talk (\"*\")" if "*" in users else f"{len(users)} allowed users"
            out.append(("telegram", OK, who))
    if config.slack.enabled:
        need = ["bot_token", "app_token" if config.slack.mode == "socket" else "signing_secret"]
        missing = [k for k in need if not getattr(config.slack, k)]
        if missing:
            out.append(("slack", BAD, ", ".join(f"slack.{k} is not set" for k in missing)))
        else:
            out.append(("slack", OK, f"{config.slack.mode} mode"))
    return out


async def _platform_checks(config: Config) -> list[tuple[str, str, str]]:
    """What each enabled platform's adapter finds by asking its service (an adapter
    module may offer `check(config)`: [(name, ok | warn | fail, text)])."""
    import importlib

    out = []
    statuses = {"ok": OK, "warn": WARN, "fail": BAD}
    for name in ("telegram", "slack"):
        if not getattr(config, name).enabled:
            continue
        check = getattr(importlib.import_module(f"adapters.{name}"), "check", None)
        if check is not None:
            out += [(what, statuses[status], text) for what, status, text in await check(config)]
    return out


async def _mcp(config: Config) -> list[tuple[str, str, str]]:
    """Connect to each enabled MCP server once and say how it went."""
    from bot.mcp import Servers
    from bot.tools import Registry

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


async def _model(config: Config) -> list[tuple[str, str, str]]:
    from bot import llm as models
    from bot.errors import ModelError, ModelUnreachable
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
