"""What the runner works with: the store, the model, the tools, the prompt, where events
go, and the watchers; `bot.run.app` builds one for the process."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from bot.core.config import Config, McpConfig
from bot.core.events import Event
from bot.core.redact import Redactor
from bot.core.watch import Watch
from bot.llm import ModelClient
from bot.store import Store
from bot.tools import Registry, ToolContext
from bot.tools.mcp import Servers
from bot.turn.budget import Budget
from bot.turn.conversation import Conversation
from bot.turn.prompt import Prompt


@dataclass(slots=True)
class Deps:
    config: Config
    store: Store
    model: ModelClient
    tools: Registry
    prompt: Prompt
    emit: Callable[[Event], Awaitable[None]]
    tool_context: Callable[[Conversation], ToolContext]
    redact: Redactor = field(default_factory=Redactor)
    """Scrubs every tool result, model answer and error text before it is kept or sent."""
    mcp: Servers = field(default_factory=lambda: Servers(McpConfig(), Registry()))
    """MCP servers whose tools are in `tools` (started by whoever starts Tandem)."""
    watch: Watch = field(default_factory=Watch)
    """Told what happened: the audit log and the metrics (`bot.core.watch`)."""
    budget: Budget | None = None
    """Daily budgets (`bot.ops.budget`, injected by `bot.run.app`); None: no budgets."""
    steer: Callable[[Conversation], Awaitable[None]] | None = None
    """`busy: steer`: gives a running turn the messages sent meanwhile, before each model
    call (set by the worker that owns the lanes); None: they wait for the next turn."""
