"""Which model to call: the chain of models, and the ones skipped because they keep failing.

A conversation's chain is the model it uses (`llm.model`, or its `/model` choice) and
then `llm.fallbacks`, each reached with its own entry (never the primary's `api_base`
or key). `Health` is kept once per process and shared by every conversation: a model
that failed `llm.failover.failures` times in a row is skipped for `cooldown_s`; then one
call may try it again (half-open): a success closes the circuit, a failure opens it for
another cool-down. The stretch from a model's first failure to its next success is an
*outage*; each has its own number, so a chat is told of it once.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from contextvars import ContextVar
from dataclasses import dataclass, field

from bot.core.llm_config import LLMConfig, ModelEntry

_chosen: ContextVar[str | None] = ContextVar("tandem_chosen_model", default=None)
"""The model the current turn's conversation chose with `/model` (None: the primary)."""


@contextlib.contextmanager
def choosing(model: str | None) -> Iterator[None]:
    """Model calls made inside (and in tasks started inside) use `model` first."""
    token = _chosen.set(model)
    try:
        yield
    finally:
        _chosen.reset(token)


def chosen() -> str | None:
    return _chosen.get()


def bare(name: str) -> str:
    """The name without its provider prefix (`openai/gpt-4o` → `gpt-4o`)."""
    return name.split("/", 1)[-1]


def find(config: LLMConfig, name: str) -> ModelEntry | None:
    """The switchable model called `name`, with or without its provider prefix."""
    wanted = name.strip().lower()
    choices = config.choices()
    exact = next((m for m in choices if m.model.lower() == wanted), None)
    if exact is not None:
        return exact
    short = [m for m in choices if bare(m.model).lower() == bare(wanted)]
    return short[0] if len(short) == 1 else None


@dataclass(frozen=True, slots=True)
class Target:
    """One model of the chain, with everything a call to it needs."""

    model: str
    api_base: str | None
    api_key: str | None
    timeout_s: float
    max_output_tokens: int
    temperature: float | None

    @property
    def key(self) -> str:
        """What `Health` knows it by: one model at one endpoint."""
        return f"{self.model}@{self.api_base or ''}"


def _target(config: LLMConfig, entry: ModelEntry) -> Target:
    return Target(entry.model, entry.api_base, entry.api_key,
                  entry.timeout_s or config.timeout_s,
                  entry.max_output_tokens or config.max_output_tokens,
                  entry.temperature if entry.temperature is not None else config.temperature)


def targets(config: LLMConfig, choice: str | None = None) -> list[Target]:
    """The models to try in order: the chosen one (or the primary), then the fallbacks."""
    head = (find(config, choice) if choice else None) or config.primary()
    entries = [head, *(m for m in config.fallbacks if m.model != head.model
                       or (m.api_base or None) != (head.api_base or None))]
    return [_target(config, entry) for entry in entries]


@dataclass(frozen=True, slots=True)
class Unavailable:
    """A model that was skipped or failed before another answered."""

    model: str
    outage: int
    """Which outage of that model (a chat is told of each once)."""
    cut: bool = False
    """It was cut off mid-answer, its text on screen (`llm.failover.after_cut`)."""


@dataclass(slots=True)
class _Circuit:
    failures: int = 0
    """Failures in a row."""
    open_until: float = 0.0
    """Skipped until then (0: not skipped)."""
    outage: int = 0
    """The current outage's number (0: none since the last success)."""
    trying: bool = False
    """Past the cool-down, one call is trying the model again."""


@dataclass(slots=True)
class Health:
    """Every model's recent failures, for every conversation of the process."""

    failures: int = 3
    cooldown_s: float = 60.0
    clock: Callable[[], float] = time.monotonic
    _circuits: dict[str, _Circuit] = field(default_factory=dict)
    _outages: int = 0

    @classmethod
    def of(cls, config: LLMConfig, clock: Callable[[], float] = time.monotonic) -> Health:
        return cls(config.failover.failures, config.failover.cooldown_s, clock)

    def available(self, key: str) -> bool:
        """May be called now: healthy, or its cool-down is over and no other call is
        trying it yet (that call is the trial)."""
        circuit = self._circuits.get(key)
        if circuit is None or not circuit.open_until:
            return True
        if self.clock() < circuit.open_until or circuit.trying:
            return False
        circuit.trying = True
        return True

    def available_later(self, key: str) -> bool:
        """Not skipped now (`available` without claiming a trial)."""
        circuit = self._circuits.get(key)
        return circuit is None or not circuit.open_until or (
            self.clock() >= circuit.open_until and not circuit.trying)

    def release(self, key: str) -> None:
        """A call is done with the model, however it ended: a trial that neither
        succeeded nor failed (cancelled) lets the next call try."""
        circuit = self._circuits.get(key)
        if circuit is not None:
            circuit.trying = False

    def outage(self, key: str) -> int:
        """The number of the model's current outage (one starts now if none has)."""
        circuit = self._circuits.setdefault(key, _Circuit())
        if not circuit.outage:
            self._outages += 1
            circuit.outage = self._outages
        return circuit.outage

    def failed(self, key: str) -> None:
        circuit = self._circuits.setdefault(key, _Circuit())
        self.outage(key)
        circuit.failures += 1
        if circuit.trying or circuit.failures >= self.failures:
            circuit.open_until = self.clock() + self.cooldown_s
        circuit.trying = False

    def succeeded(self, key: str) -> None:
        self._circuits.pop(key, None)
