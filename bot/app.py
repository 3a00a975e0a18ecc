"""Wiring: build the core (store, model, tools, persona, hub) from a `Config`."""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Iterable
from datetime import datetime
from pathlib import Path
from zoneinfo import ZoneInfo

from bot.config import Config
from bot.conversation import Conversation
from bot.events import Event
from bot.hub import Hub, Sink
from bot.llm import LiteLLMClient, ModelClient, context_window
from bot.persona import Persona
from bot.runner import Deps
from bot.scheduler import Scheduler
from bot.store.sqlite import SQLiteStore
from bot.tools import Registry, Tool, ToolContext, files, memory, shell, tasks, web

log = logging.getLogger(__name__)


class Dispatch:
    """Routes each outbound event to the sink of its platform."""

    def __init__(self) -> None:
        self.sinks: dict[str, Sink] = {}

    async def emit(self, event: Event) -> None:
        sink = self.sinks.get(event.conv.platform)
        if sink is None:
            log.warning("no sink for platform %s; event dropped", event.conv.platform)
            return
        await sink.emit(event)


def default_tools() -> list[Tool]:
    return [*files.TOOLS, *shell.TOOLS, *tasks.TOOLS, *web.TOOLS, *memory.TOOLS]


def protected_paths(config: Config) -> frozenset[Path]:
    paths = [Path(config.store.path), Path(config.persona.dir) / "RULES.md", Path(".env"),
             Path("config.yaml")]
    if config.source:
        paths += [Path(config.source), Path(config.source).parent / ".env"]
    db = Path(config.store.path)
    paths += [db.with_name(db.name + "-wal"), db.with_name(db.name + "-shm")]
    return frozenset(p.resolve() for p in paths)


def build(config: Config, *, model: ModelClient | None = None, store: SQLiteStore | None = None,
          tools: Iterable[Tool] | None = None) -> tuple[Hub, Dispatch]:
    """The hub with its dependencies; the caller opens the store and adds sinks."""
    dispatch = Dispatch()
    store = store or SQLiteStore(config.store.path)
    persona = Persona(config.persona.dir, config.persona.max_file_chars)
    registry = Registry(default_tools() if tools is None else tools)
    protected = protected_paths(config)
    env = shell.clean_env(dict(os.environ), config.secrets())
    tz = ZoneInfo(config.scheduler.timezone)

    def tool_context(conv: Conversation) -> ToolContext:
        return ToolContext(
            workspace=Path(config.workspace.dir), protected=protected, env=env,
            shell_timeout_s=config.limits.shell_timeout_s,
            output_chars=config.limits.tool_output_chars,
            extras={"conv": conv.row, "persona_dir": Path(config.persona.dir),
                    "track_process": store.track_process,
                    "untrack_process": store.untrack_process, "scheduler": hub.scheduler,
                    "web_fetch": config.tools.web_fetch,
                    "persona_max_chars": config.persona.max_file_chars,
                    "requester": conv.turn.requester if conv.turn else ""})

    def hint(conv: Conversation) -> str:
        used = int(conv.kept * conv.calibration)
        now = datetime.fromtimestamp(time.time(), tz)
        dropped = conv.dropped_turns
        older = f"; {dropped} older turns are out of view" if dropped else ""
        jobs = len(hub.scheduler.active.get(conv.row.id, ())) if hub.scheduler else 0
        tasks_note = f" Scheduled tasks here: {jobs} (list_tasks shows them)." if jobs else ""
        return (f"[Current state; earlier state notes are stale. Time: "
                f"{now:%Y-%m-%d %H:%M %Z}. Context: ~{used:,} of {deps.window:,} tokens{older}."
                f"{tasks_note}]")

    deps = Deps(config=config, store=store, model=model or LiteLLMClient(config.llm),
                tools=registry, persona=persona, emit=dispatch.emit,
                tool_context=tool_context, window_source=lambda: context_window(config.llm),
                hint=hint)
    approvers = {"telegram": {str(i) for i in config.telegram.approvers},
                 "slack": set(config.slack.approvers)}
    hub = Hub(deps, approvers)
    hub.scheduler = Scheduler(hub, config.scheduler.timezone, config.scheduler.misfire_grace_s)
    return hub, dispatch
