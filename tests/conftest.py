"""Shared fixtures: the fake model server, a config in tmp_path, and a running core."""

from __future__ import annotations

import os

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

import asyncio
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import litellm  # noqa: F401  (imported once up front: the first import takes seconds)
import pytest
from hypothesis import settings

from bot.core.config import Config
from bot.core.events import ApprovalRequested, ConvKey, Event, TurnEnded, User, UserMessage
from bot.run.app import build
from bot.serve.hub import Hub
from tests.fakes.model_server import FakeModelServer

# CI draws the same examples on every run (a failure there is reproducible, never a fluke);
# local runs draw fresh ones, and what they find goes into the tests as @example.
settings.register_profile("ci", derandomize=True, print_blob=True)
if os.environ.get("TANDEM_HYPOTHESIS") == "ci":
    settings.load_profile("ci")

REPO = Path(__file__).resolve().parent.parent
PERSONA = REPO / "persona"


STATE_NOTE = "[Current state"


def said(messages: list[dict[str, Any]]) -> list[str]:
    """The user messages of a model request, without Tandem's per-request state note."""
    return [str(m.get("content")) for m in messages
            if m.get("role") == "user" and not str(m.get("content")).startswith(STATE_NOTE)]


class Recorder:
    """A sink that keeps every event and lets a test wait for one."""

    def __init__(self) -> None:
        self.events: list[Event] = []
        self._changed = asyncio.Condition()

    async def emit(self, event: Event) -> None:
        async with self._changed:
            self.events.append(event)
            self._changed.notify_all()

    def of(self, kind: type[Any]) -> list[Any]:
        return [e for e in self.events if isinstance(e, kind)]

    async def wait(self, predicate: Callable[[], Any], timeout: float = 10.0) -> Any:
        async def check() -> Any:
            async with self._changed:
                while not (found := predicate()):
                    await self._changed.wait()
                return found

        try:
            return await asyncio.wait_for(check(), timeout)
        except TimeoutError:
            raise AssertionError(f"timed out; events: {self.events[-10:]}") from None

    async def ended(self, count: int = 1, timeout: float = 10.0) -> list[TurnEnded]:
        await self.wait(lambda: len(self.of(TurnEnded)) >= count, timeout)
        return self.of(TurnEnded)


@pytest.fixture
async def model() -> AsyncIterator[FakeModelServer]:
    server = FakeModelServer()
    await server.start()
    try:
        yield server
    finally:
        await server.close()
    assert server.violations == [], server.violations


def make_config(tmp: Path, model: FakeModelServer, **overrides: Any) -> Config:
    data: dict[str, Any] = {
        "llm": {"model": "openai/fake", "api_base": model.api_base, "api_key": "sk-test",
                "context_window": 32000, "timeout_s": 5, "retries": 1},
        "store": {"path": str(tmp / "tandem.db")},
        "persona": {"dir": str(tmp / "persona")},
        "workspace": {"dir": str(tmp / "workspace")},
    }
    for dotted, value in overrides.items():
        node = data
        *path, last = dotted.split("__")
        for key in path:
            node = node.setdefault(key, {})
        node[last] = value
    persona = tmp / "persona"
    if not persona.exists():
        persona.mkdir()
        for f in PERSONA.glob("*.md"):
            (persona / f.name).write_text(f.read_text())
    (tmp / "workspace").mkdir(exist_ok=True)
    return Config.model_validate(data)


class Core:
    """A hub on a real SQLite store with a recording sink for the console platform."""

    def __init__(self, config: Config, **build_args: Any) -> None:
        self.config = config
        self.hub: Hub
        self.hub, self.dispatch = build(config, **build_args)
        self.sink = Recorder()
        self.dispatch.sinks["console"] = self.sink
        self.key = ConvKey("console", "c1")
        self.user = User("u1", "Ann")

    async def __aenter__(self) -> Core:
        await self.hub.d.store.open()
        await self.hub.recover()
        await self.hub.scheduler.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.hub.scheduler.shutdown()
        await self.hub.close()
        await self.hub.d.store.close()

    async def say(self, text: str, ref: str | None = None, user: User | None = None) -> None:
        await self.hub.submit(UserMessage(self.key, user or self.user, text, ref=ref))


@pytest.fixture
def config_factory(tmp_path: Path, model: FakeModelServer) -> Callable[..., Config]:
    def factory(**overrides: Any) -> Config:
        return make_config(tmp_path, model, **overrides)

    return factory


class HoldCards:
    """A sink that holds the next approval card until released (and forwards everything)."""

    def __init__(self, sink: Recorder) -> None:
        self.sink = sink
        self.posting = asyncio.Event()
        self.release = asyncio.Event()

    async def emit(self, event: Event) -> None:
        if (isinstance(event, ApprovalRequested) and not event.reminder
                and not self.posting.is_set()):
            self.posting.set()
            await self.release.wait()
        await self.sink.emit(event)
