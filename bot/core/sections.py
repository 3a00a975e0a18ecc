"""Configuration sections that stand on their own (the base `Section`, MCP servers,
media); `bot.core.config` assembles them with the rest into `Config`."""

from __future__ import annotations

import re
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator
from pydantic_core import PydanticCustomError

Policy = Literal["allow", "ask", "deny", "sandboxed"]
"""`sandboxed` (for the shell): allow inside its sandbox, ask outside it or with the network
(`bot.tools.sandbox`); for any other tool it asks."""


_UNSAFE = re.compile(r"[^A-Za-z0-9_-]")
"""What an MCP tool's name may not hold (`bot.tools.mcp.tools` replaces it with `_`)."""


class Section(BaseModel):
    model_config = ConfigDict(extra="forbid")


class McpTools(Section):
    include: list[str] = Field(default_factory=lambda: ["*"])
    """Tool names (as the server names them) or globs to offer; the rest are hidden."""
    exclude: list[str] = Field(default_factory=list)


class McpServerConfig(Section):
    """One MCP server: `command` (stdio) or `url` (streamable HTTP), never both."""

    command: str | None = None
    args: list[str] = Field(default_factory=list)
    env: dict[str, str] = Field(default_factory=dict)
    """The server's whole environment, with `PATH`, `HOME`, `USER`, `LOGNAME`, `SHELL` and
    `TERM` (nothing else of Tandem's is passed); given as the process's environment, never
    on its command line. Values that look like credentials are treated as secrets."""
    cwd: str | None = None
    url: str | None = None
    headers: dict[str, str] = Field(default_factory=dict)
    """Sent with every HTTP request; the values are treated as secrets."""
    enabled: bool = True
    timeout_s: float = Field(default=60.0, gt=0)
    """Per call."""
    connect_timeout_s: float = Field(default=20.0, gt=0)
    tools: McpTools = Field(default_factory=McpTools)
    approvals: dict[str, Policy] = Field(default_factory=dict)
    """Per tool (the server's name for it): allow | ask | deny; every other tool asks."""
    trusted: bool = False
    """Its tool descriptions and schemas are trusted like Tandem's own. False: they are
    content from outside, and every conversation they are offered to is tainted."""

    @model_validator(mode="after")
    def _one_transport(self) -> McpServerConfig:
        if bool(self.command) == bool(self.url):
            raise PydanticCustomError("mcp_transport",
                                      "needs exactly one of `command` (stdio) or `url` (HTTP)")
        return self


class McpConfig(Section):
    servers: dict[str, McpServerConfig] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _distinct_tool_names(self) -> McpConfig:
        """Two servers whose tools could get the same name (`a` with `b_c`, `a_b` with
        `c`: both `mcp_a_b_c`) are refused, naming both."""
        names = sorted((_UNSAFE.sub("_", name), name) for name in self.servers)
        for i, (short, first) in enumerate(names):
            for long, second in names[i + 1:]:
                if long != short and not long.startswith(f"{short}_"):
                    continue
                raise PydanticCustomError(
                    "mcp_names", "the servers `{first}` and `{second}` could give two tools "
                    "the same name (mcp_{long}_…); rename one (a `-` instead of `_` will "
                    "do)", {"first": first, "second": second, "long": long})
        return self


class TranscriptionConfig(Section):
    model: str | None = "whisper-1"
    """Any litellm transcription model; empty turns voice notes off."""
    api_base: str | None = None
    """Falls back to `llm.api_base`."""
    api_key: str | None = None
    """Falls back to `llm.api_key`."""
    timeout_s: float = Field(default=120.0, gt=0)


class MediaConfig(Section):
    max_mb: float = Field(default=20.0, gt=0)
    """The largest file Tandem takes from a chat (each platform's own limit applies too)."""
    vision: bool | None = None
    """Send pictures to the model; unset asks litellm whether the model can see them."""
    pdf: bool | None = None
    """Send PDFs to the model as files; unset asks litellm whether the model reads them."""
    transcription: TranscriptionConfig = Field(default_factory=TranscriptionConfig)
