"""Wiring: build the core (store, model, tools, persona, hub) from a `Config`."""

from __future__ import annotations

import functools
import logging
import os
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO

from bot.core import redact
from bot.core.config import Config
from bot.core.errors import ConfigError, ToolError
from bot.core.events import Event
from bot.core.redact import Redactor
from bot.core.tools_config import ShellConfig
from bot.llm import LiteLLMClient, ModelClient
from bot.llm.senses import Senses
from bot.media import FilePort, size_text
from bot.media.receive import Receiver
from bot.ops.audit import Audit
from bot.ops.budget import Budget
from bot.serve.access import Access
from bot.serve.cluster import Cluster, owner_id
from bot.serve.cluster.lanes import ClusterLanes, HeldLanes
from bot.serve.hub import Hub, Sink
from bot.serve.scheduler import Scheduler
from bot.serve.worker import LanesFactory
from bot.store import Store
from bot.store.backends import POSTGRES_SCHEMES, open_store
from bot.tools import Registry, Tool, ToolContext, files, memory, sandbox, send, shell, tasks, web
from bot.tools.mcp import Servers
from bot.turn.conversation import Conversation
from bot.turn.memory import scope_dir
from bot.turn.persona import Persona
from bot.turn.prompt import Prompt
from bot.turn.runner import Deps

log = logging.getLogger(__name__)
Send = Callable[[BinaryIO, int, str, str, bool], Awaitable[None]]


class Dispatch:
    """Routes each outbound event, redacted, to the sink of its platform."""

    def __init__(self, redactor: Redactor | None = None) -> None:
        self.sinks: dict[str, Sink] = {}
        self.ports: dict[str, FilePort] = {}
        """Each platform's files (downloads and uploads), registered by its adapter."""
        self.redactor = redactor or Redactor()

    async def emit(self, event: Event) -> None:
        sink = self.sinks.get(event.conv.platform)
        if sink is None:
            log.warning("no sink for platform %s; event dropped", event.conv.platform)
            return
        await sink.emit(self.redactor.event(event))


def default_tools(workspace: Path = Path("workspace"),
                  shell_config: ShellConfig | None = None) -> list[Tool]:
    return [*files.TOOLS, *shell.tools(shell_config), *tasks.TOOLS, *web.TOOLS, *memory.TOOLS,
            send.tool(workspace)]


def protected_paths(config: Config) -> frozenset[Path]:
    paths = [Path(config.store.path), Path(config.persona.dir) / "RULES.md", Path(".env"),
             Path("config.yaml")]
    if config.source:
        paths += [Path(config.source), Path(config.source).parent / ".env"]
    db = Path(config.store.path)
    paths += [db.with_name(db.name + "-wal"), db.with_name(db.name + "-shm")]
    return frozenset(p.resolve() for p in paths)


@dataclass(frozen=True, slots=True)
class ToolEnv:
    """What every tool call is given: the workspace, a clean environment, services."""

    config: Config
    store: Store
    scheduler: Scheduler
    protected: frozenset[Path]
    env: dict[str, str]
    ports: dict[str, FilePort]
    owner: str = ""
    """Whose tool processes these are (the worker's id with several workers)."""
    redactor: Redactor = field(default_factory=Redactor)
    """The runner's, for a tool that redacts the output it cuts itself (the shell)."""

    def __call__(self, conv: Conversation) -> ToolContext:
        config = self.config
        requester = conv.turn.requester if conv.turn else ""
        persona = Path(config.persona.dir)
        return ToolContext(
            workspace=Path(config.workspace.dir), protected=self.protected, env=self.env,
            shell_timeout_s=config.limits.shell_timeout_s,
            output_chars=config.limits.tool_output_chars, redactor=self.redactor,
            extras={"conv": conv.row, "persona_dir": persona,
                    "memory_dir": scope_dir(persona, config.memory.scope, conv.row.key,
                                            requester),
                    "track_process": functools.partial(self.store.track_process,
                                                       owner=self.owner),
                    "untrack_process": functools.partial(self.store.untrack_process,
                                                         owner=self.owner),
                    "scheduler": self.scheduler,
                    "web_fetch": config.tools.web_fetch, "shell": config.tools.shell,
                    "store_dir": (Path(config.store.path).parent
                                  if config.store.url is None else None),
                    "persona_max_chars": config.persona.max_file_chars,
                    "requester": requester, "send_file": self._sender(conv)})

    def _sender(self, conv: Conversation) -> Send | None:
        """Posts a file to `conv` through its platform (None where it cannot)."""
        key = conv.row.key
        port = self.ports.get(key.platform)
        if port is None:
            return None

        async def send(fh: BinaryIO, size: int, name: str, caption: str, picture: bool) -> None:
            if size > port.upload_limit:
                raise ToolError(f"{name} is {size_text(size)}; {port.platform_name} lets bots "
                                f"send files up to {size_text(port.upload_limit)}")
            try:
                await port.upload(key, fh, name, caption, picture=picture)
            except ValueError as exc:
                raise ToolError(f"{port.platform_name} refused {name}: {exc}") from None

        return send


def build(config: Config, *, model: ModelClient | None = None, store: Store | None = None,
          tools: Iterable[Tool] | None = None,
          cluster: Cluster | None = None) -> tuple[Hub, Dispatch]:
    """The hub with its dependencies; the caller opens the store and adds sinks. With
    `cluster`, the conversations' work is shared with the other workers; without one, on
    PostgreSQL (a terminal beside them), each conversation is held while it is handled."""
    if sandbox.enabled(config.tools.shell) and (why := sandbox.check(config.tools.shell)):
        raise ConfigError("tools.shell.sandbox", f"the shell's sandbox cannot run here: {why}")
    redactor = redact.known(config.secrets())
    dispatch = Dispatch(redactor)
    store = store or open_store(config.store.target, pool_size=config.store.pool_size)
    persona = Persona(config.persona.dir, config.persona.max_file_chars)
    registry = Registry(default_tools(Path(config.workspace.dir), config.tools.shell)
                        if tools is None else tools)
    scheduler = Scheduler(store, config.scheduler.timezone, config.scheduler.misfire_grace_s)
    env = ToolEnv(config, store, scheduler, protected_paths(config),
                  shell.clean_env(dict(os.environ), config.secrets()), dispatch.ports,
                  owner_id(cluster is not None), redactor)
    deps = Deps(config=config, store=store, model=model or LiteLLMClient(config.llm),
                tools=registry, prompt=Prompt(config, persona, registry, scheduler.count),
                emit=dispatch.emit, tool_context=env, redact=redactor,
                mcp=Servers(config.mcp, registry), budget=Budget(config, store))
    deps.watch.add(Audit(store, redactor, config.audit.keep_days))
    receiver = Receiver(config, dispatch.ports, Senses(config.llm, config.media))
    lanes: LanesFactory | None = None
    if cluster is not None:
        lanes = functools.partial(ClusterLanes, cluster=cluster, store=store)
    elif config.store.target.lower().startswith(POSTGRES_SCHEMES):
        lanes = functools.partial(HeldLanes, url=config.store.target)
    hub = Hub(deps, Access.from_config(config), scheduler, receiver, lanes)
    scheduler.deliver = hub.deliver
    if config.metrics.listen:  # imported only then: prometheus_client costs ~60 ms
        from bot.ops.metrics import Metrics
        deps.watch.add(Metrics(hub.lanes.queue_stats if hub.lanes.shared else None))
    return hub, dispatch
