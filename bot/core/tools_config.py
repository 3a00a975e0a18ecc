"""Configuration of Tandem's own tools: `tools.web_fetch` and `tools.shell`.
`bot.core.config` assembles it into `Config`."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from bot.core.sections import Section


class WebFetchConfig(Section):
    allow_private: bool = False
    max_bytes: int = 2_000_000
    timeout_s: float = 20.0


class ShellConfig(Section):
    sandbox: Literal["bwrap", "none"] = "none"
    """`bwrap`: every command runs under bubblewrap (the workspace writable, the system
    read-only, a private /tmp, no network, its own processes); `none`: as Tandem's user."""
    bwrap: str = "bwrap"
    """The bubblewrap program (a name on PATH or a path)."""
    memory_mb: int | None = Field(default=1024, gt=0)
    """The most memory a sandboxed command's process may allocate (RLIMIT_DATA); unset:
    no limit."""
    processes: int | None = Field(default=256, gt=0)
    """The most processes Tandem's user may have while a sandboxed command forks
    (RLIMIT_NPROC; the kernel does not apply it to root); unset: no limit."""
    hide: list[str] = Field(default_factory=lambda: [
        "~/.ssh", "~/.gnupg", "~/.aws", "~/.azure", "~/.kube", "~/.docker", "~/.netrc",
        "~/.config/gcloud", "~/.git-credentials", "~/.pgpass"])
    """Paths the sandbox shows empty, besides Tandem's own config, `.env`, database and
    persona, which it never shows."""


class ToolsConfig(Section):
    web_fetch: WebFetchConfig = Field(default_factory=WebFetchConfig)
    shell: ShellConfig = Field(default_factory=ShellConfig)
