"""Configuration: one YAML file, `${ENV}` interpolation, `TANDEM_<SECTION>__<KEY>` overrides.

Order of precedence (last wins): built-in defaults, the YAML file, environment overrides.
A `.env` file beside the config (or in the working directory) fills in environment
variables that are not already set. Every problem becomes a `ConfigError` naming the key.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Annotated, Any, Literal
from urllib.parse import urlsplit

import yaml
from pydantic import (
    AfterValidator,
    Field,
    ValidationError,
)

from bot.core.approvals_config import ApprovalRule, ApprovalsConfig
from bot.core.chat_config import (
    SlackAssistant,
    SlackConfig,
    TelegramConfig,
    TelegramWebhook,
)
from bot.core.context_config import ContextConfig
from bot.core.errors import ConfigError
from bot.core.llm_config import FailoverConfig, LLMConfig, ModelEntry
from bot.core.mcp_secrets import credentials
from bot.core.ops_config import AuditConfig, BudgetConfig, LoggingConfig, MetricsConfig
from bot.core.sections import (
    McpConfig,
    McpServerConfig,
    McpTools,
    MediaConfig,
    Policy,
    Section,
    TranscriptionConfig,
)
from bot.core.tools_config import ShellConfig, ToolsConfig, WebFetchConfig

__all__ = ["ApprovalRule", "ApprovalsConfig", "Config", "FailoverConfig", "LLMConfig",
           "ModelEntry", "SlackAssistant", "SlackConfig",
           "TelegramConfig", "TelegramWebhook",
           "McpConfig", "McpServerConfig", "McpTools", "MediaConfig", "Policy",
           "Section", "ShellConfig", "ToolsConfig", "TranscriptionConfig", "WebFetchConfig",
           "load_config", "require"]


class StoreConfig(Section):
    path: str = "data/tandem.db"
    url: str | None = None
    """`postgresql://…` for several workers, or `sqlite:///path`; unset: SQLite at `path`."""
    pool_size: int = Field(default=10, ge=1)
    """PostgreSQL connections per worker (the task queue uses a few more)."""

    @property
    def target(self) -> str:
        """What `open_store` is given: the URL, else the SQLite path."""
        return self.url or self.path


def _overlay_file(value: str) -> str:
    path = Path(value)
    if path.is_absolute() or ".." in path.parts or not value.strip():
        raise ValueError(f"must be a file inside persona.dir, like chats/ops.md, not {value!r}")
    return value


class PersonaConfig(Section):
    dir: str = "persona"
    max_file_chars: int = 20_000
    places: dict[str, Annotated[str, AfterValidator(_overlay_file)]] = Field(
        default_factory=dict)
    """A place (`telegram:<chat>`, `telegram:<chat>/<topic>`, `slack:<channel>`) -> a
    file inside `dir` whose text is added to the persona there."""


class WorkspaceConfig(Section):
    dir: str = "workspace"


class Breakers(Section):
    same_call: int = Field(default=5, ge=1)
    same_call_failures: int = Field(default=3, ge=1)
    tool_failures_warn: int = Field(default=6, ge=1)
    tool_failures_fatal: int = Field(default=8, ge=1)
    ledger_size: int = Field(default=50, ge=1)
    ignored_skips: int = Field(default=2, ge=1)
    """A model that repeats a skipped call this many times more is looping: end the turn."""
    loop_message: str = ("I stopped: I kept repeating `{tool}` after Tandem told me its "
                         "result was already returned. Please rephrase or try another way.")


class Limits(Section):
    max_steps: int = Field(default=25, ge=1)
    tool_output_chars: int = Field(default=16_000, ge=200)
    shell_timeout_s: float = Field(default=120.0, gt=0)
    max_message_chars: int = Field(default=200_000, ge=100)
    breakers: Breakers = Field(default_factory=Breakers)
    budget: BudgetConfig = Field(default_factory=BudgetConfig)


class SchedulerConfig(Section):
    timezone: str = "UTC"
    misfire_grace_s: int = Field(default=3600, ge=1)


class MemoryConfig(Section):
    scope: Literal["conversation", "user", "global"] = "conversation"
    """Whose prompt a `remember` note enters: this conversation's, this user's (in every
    conversation), or every conversation's (the persona's own USER.md / MEMORY.md)."""


class Config(Section):
    llm: LLMConfig = Field(default_factory=LLMConfig)
    store: StoreConfig = Field(default_factory=StoreConfig)
    persona: PersonaConfig = Field(default_factory=PersonaConfig)
    workspace: WorkspaceConfig = Field(default_factory=WorkspaceConfig)
    limits: Limits = Field(default_factory=Limits)
    context: ContextConfig = Field(default_factory=ContextConfig)
    approvals: ApprovalsConfig = Field(default_factory=ApprovalsConfig)
    telegram: TelegramConfig = Field(default_factory=TelegramConfig)
    slack: SlackConfig = Field(default_factory=SlackConfig)
    scheduler: SchedulerConfig = Field(default_factory=SchedulerConfig)
    memory: MemoryConfig = Field(default_factory=MemoryConfig)
    mcp: McpConfig = Field(default_factory=McpConfig)
    media: MediaConfig = Field(default_factory=MediaConfig)
    tools: ToolsConfig = Field(default_factory=ToolsConfig)
    audit: AuditConfig = Field(default_factory=AuditConfig)
    metrics: MetricsConfig = Field(default_factory=MetricsConfig)
    logging: LoggingConfig = Field(default_factory=LoggingConfig)
    busy: Literal["queue", "steer"] = "queue"
    """A message sent while Tandem works: `queue` answers it after the current turn
    (merged with others sent meanwhile); `steer` gives it to the running turn before its
    next model call."""
    source: str | None = None
    """Path of the file this was loaded from (kept so tools can refuse to touch it)."""

    def secrets(self) -> list[str]:
        """Every configured secret value, for redaction."""
        found = [
            *self.llm.keys(),
            self.telegram.token,
            self.telegram.webhook.secret_token,
            self.slack.bot_token,
            self.slack.app_token,
            self.slack.signing_secret,
            self.media.transcription.api_key,
            urlsplit(self.store.url).password if self.store.url else None,
        ]
        for server in self.mcp.servers.values():
            found += credentials(server)
        return [s for s in found if s and len(s) >= 6]


_ENV_REF = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}")
ENV_PREFIX = "TANDEM_"


def load_dotenv(path: Path) -> None:
    """Set variables from a `.env` file without overriding the real environment."""
    if not path.is_file():
        return
    for line in path.read_text(encoding="utf-8").splitlines():
        line = line.strip()
        if not line or line.startswith("#") or "=" not in line:
            continue
        key, _, value = line.removeprefix("export ").partition("=")
        value = value.strip().strip("'\"")
        os.environ.setdefault(key.strip(), value)


def _interpolate(node: Any, path: str) -> Any:
    if isinstance(node, dict):
        return {k: _interpolate(v, f"{path}.{k}" if path else str(k)) for k, v in node.items()}
    if isinstance(node, list):
        return [_interpolate(v, f"{path}[{i}]") for i, v in enumerate(node)]
    if isinstance(node, str):

        def sub(m: re.Match[str]) -> str:
            value = os.environ.get(m.group(1), m.group(2))
            if value is None:
                raise ConfigError(path, f"environment variable {m.group(1)} is not set")
            return value

        return _ENV_REF.sub(sub, node)
    return node


def _env_value(key: str, raw: str) -> Any:
    """Parse an override like YAML (`true`, `5`, `[1, 2]`), but keep secrets as text."""
    if key in _STRING_KEYS or not raw.strip():
        return raw
    try:
        value = yaml.safe_load(raw)
    except yaml.YAMLError:
        return raw
    return raw if value is None or isinstance(value, dict) else value


def _env_overrides(environ: dict[str, str]) -> dict[str, Any]:
    tree: dict[str, Any] = {}
    for name, raw in environ.items():
        if not name.startswith(ENV_PREFIX) or "__" not in name:
            continue
        keys = [k.lower() for k in name[len(ENV_PREFIX) :].split("__")]
        node = tree
        for key in keys[:-1]:
            node = node.setdefault(key, {})
            if not isinstance(node, dict):
                raise ConfigError(".".join(keys), f"conflicts with {name}")
        node[keys[-1]] = _env_value(keys[-1], raw)
    return tree


_STRING_KEYS = {"api_key", "token", "bot_token", "app_token", "signing_secret", "model", "chat_id"}


def _merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in over.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = _merge(out[key], value)
        else:
            out[key] = value
    return out


def _first_error(err: ValidationError) -> ConfigError:
    first = err.errors()[0]
    key = ".".join(str(p) for p in first["loc"]) or "config"
    msg = first["msg"]
    if first["type"] == "extra_forbidden":
        msg = "unknown key"
    return ConfigError(key, msg)


def load_config(path: str | None = None, environ: dict[str, str] | None = None) -> Config:
    """Load and validate the configuration; raise `ConfigError` naming the bad key."""
    explicit = path is not None
    file = Path(path or "config.yaml")
    load_dotenv(file.parent / ".env")
    if file.parent != Path.cwd():
        load_dotenv(Path.cwd() / ".env")
    env = dict(os.environ if environ is None else environ)
    data: dict[str, Any] = {}
    if file.is_file():
        try:
            loaded = yaml.safe_load(file.read_text(encoding="utf-8"))
        except yaml.YAMLError as exc:
            mark = getattr(exc, "problem_mark", None)
            where = f"line {mark.line + 1}" if mark else "syntax"
            raise ConfigError(str(file), f"not valid YAML ({where})") from None
        if loaded is not None and not isinstance(loaded, dict):
            raise ConfigError(str(file), "must be a mapping of sections")
        data = _interpolate(loaded or {}, "")
        data["source"] = str(file.resolve())
    elif explicit:
        raise ConfigError("--config", f"{file} does not exist")
    data = _merge(data, _env_overrides(env))
    try:
        return Config.model_validate(data)
    except ValidationError as err:
        raise _first_error(err) from None


def require(config: Config, key: str) -> Any:
    """The value at a dotted key, or a `ConfigError` when it is missing (a secret, say)."""
    node: Any = config
    for part in key.split("."):
        node = getattr(node, part)
    if node in (None, "", []):
        raise ConfigError(key, "is required but not set")
    return node
