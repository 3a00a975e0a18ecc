"""Configuration sections that stand on their own (the base `Section`, MCP servers,
media); `bot.core.config` assembles them with the rest into `Config`."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator
from pydantic_core import PydanticCustomError

Policy = Literal["allow", "ask", "deny"]


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
    """The server's whole environment, with `PATH` (nothing else of Tandem's is passed)."""
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

    @model_validator(mode="after")
    def _one_transport(self) -> McpServerConfig:
        if bool(self.command) == bool(self.url):
            raise PydanticCustomError("mcp_transport",
                                      "needs exactly one of `command` (stdio) or `url` (HTTP)")
        return self


class McpConfig(Section):
    servers: dict[str, McpServerConfig] = Field(default_factory=dict)


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
