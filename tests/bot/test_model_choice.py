"""Failover as a chat sees it, and `/model` in the core: the answer's footer once per
outage and chat, `/status`, the audit log and the metrics naming the model that
answered; a conversation's switch, kept across a restart, its history still valid.

A primary and a backup endpoint (`tests.fakes.failing_model`), the real litellm client,
a real SQLite store; time is a clock the test moves.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from bot.core.buttons import ItemButton, unpack
from bot.core.config import Config
from bot.core.events import Command, ConvKey, Notice, TurnEnded, User, UserMessage
from bot.llm import LiteLLMClient
from bot.llm.failover import Health
from bot.ops.metrics import Metrics
from bot.store import Store
from bot.store.backends import open_store
from tests import pg
from tests.conftest import Core, make_config
from tests.fakes.failing_model import Clock, FailingModel
from tests.fakes.model_server import Reply, ToolCallSpec

FOOTER = "↪ answered by openai/backup: openai/fake is unavailable"


def configure(tmp_path: Path, primary: FailingModel, backup: FailingModel,
              **overrides: Any) -> Config:
    other = {"model": "openai/backup", "api_base": backup.api_base, "api_key": "sk-backup"}
    settings = {"llm__retries": 0, "llm__fallbacks": [other], "llm__models": [other]}
    return make_config(tmp_path, primary, **{**settings, **overrides})


def core(config: Config, clock: Clock) -> Core:
    return Core(config, model=LiteLLMClient(config.llm, Health.of(config.llm, clock)))


async def command(c: Core, name: str, args: str = "", user: User | None = None,
                  key: ConvKey | None = None) -> Notice:
    before = len(c.sink.of(Notice))
    await c.hub.submit(Command(key or c.key, user or c.user, name, args))
    await c.sink.wait(lambda: len(c.sink.of(Notice)) > before)
    await c.hub.idle()
    return c.sink.of(Notice)[-1]


def counted(watcher: Metrics, name: str, **labels: str) -> float:
    text = generate_latest(watcher.registry).decode()
    return sum(s.value for family in text_string_to_metric_families(text)
               for s in family.samples
               if s.name == name and labels.items() <= s.labels.items())


def answers(c: Core, key: ConvKey | None = None) -> list[str]:
    return [e.text for e in c.sink.of(TurnEnded) if e.conv == (key or c.key)]


# -- the footer: once per outage and chat ----------------------------------------------------

async def test_the_chat_is_told_once_per_outage(tmp_path: Path, primary: FailingModel,
                                                backup: FailingModel) -> None:
    clock = Clock()
    primary.down = "500"
    backup.responder = lambda messages: Reply(text="backup answers")
    primary.responder = lambda messages: Reply(text="primary answers")
    other = ConvKey("console", "c2")
    async with core(configure(tmp_path, primary, backup), clock) as c:
        watcher = Metrics()
        c.hub.d.watch.add(watcher)
        for n in range(1, 4):
            await c.say(f"question {n}")
            await c.sink.ended(n)
        await c.hub.submit(UserMessage(other, c.user, "elsewhere"))  # told there once too
        await c.sink.ended(4)
        status = (await command(c, "status")).text
        primary.down = None  # back after the cool-down: that outage is over
        clock.now += 61
        await c.say("question 4")
        await c.sink.ended(5)
        primary.down = "500"  # a new outage: told again, once
        for n in (5, 6):
            await c.say(f"question {n}")
            await c.sink.ended(n + 1)
        await c.hub.d.watch.flush()
        audit = await c.hub.d.store.audit(conv=str(c.key))
        audit_other = await c.hub.d.store.audit(conv=str(other))
    told = f"backup answers\n\n{FOOTER}"
    assert answers(c) == [told, "backup answers", "backup answers", "primary answers",
                          told, "backup answers"]
    assert answers(c, other) == [told]
    assert "Model: openai/fake" in status
    assert "Last answer by: openai/backup (openai/fake was unavailable)" in status
    assert [json.loads(r.detail) for r in audit if r.kind == "model"] == [
        {"change": "failover", "answered": "openai/backup", "unavailable": ["openai/fake"]}] * 2
    assert len([r for r in audit_other if r.kind == "model"]) == 1
    assert counted(watcher, "tandem_model_calls_total", model="openai/backup", ok="true") == 6
    assert counted(watcher, "tandem_model_calls_total", model="openai/fake", ok="true") == 1
    assert counted(watcher, "tandem_failovers_total", model="openai/fake") == 3


# -- /model in the core -------------------------------------------------------------------

async def test_model_lists_buttons_switches_and_persists_across_a_restart(
        tmp_path: Path, primary: FailingModel, backup: FailingModel) -> None:
    config = configure(tmp_path, primary, backup)
    backup.responder = lambda messages: Reply(text="from the other model")
    async with core(config, Clock()) as c:
        listing = await command(c, "model")
        assert listing.text.startswith("This conversation uses openai/fake.")
        assert [b.label for b in listing.buttons] == ["✓ openai/fake", "openai/backup"]
        pressed = unpack(listing.buttons[1].data)  # a press is the command with its id
        assert isinstance(pressed, ItemButton) and pressed.command == "model"
        switched = await command(c, pressed.command, pressed.item_id)
        assert switched.text == "This conversation now uses openai/backup (switched by Ann)."
        await c.say("hi")
        [ended] = await c.sink.ended()
    assert ended.text == "from the other model"  # chosen, not a failover: no footer
    assert primary.requests == [] and backup.keys == ["sk-backup"]
    async with core(config, Clock()) as again:  # another process, the same store
        status = await command(again, "status")
        await again.say("still there?")
        await again.sink.ended()
        assert (await command(again, "model")).buttons[1].label == "✓ openai/backup"
        back = await command(again, "model", "fake")  # without its provider prefix
        await again.say("and now?")
        await again.sink.ended(2)
        await again.hub.d.watch.flush()
        audit = await again.hub.d.store.audit(conv=str(again.key))
    assert status.text.startswith("Model: openai/backup (chosen with /model)")
    assert len(backup.requests) == 2 and len(primary.requests) == 1
    assert back.text.startswith("This conversation now uses openai/fake")
    assert [(r.actor, json.loads(r.detail)) for r in audit if r.kind == "model"] == [
        ("u1", {"change": "switched", "model": "openai/backup"}),
        ("u1", {"change": "switched", "model": "openai/fake"})]


async def test_an_unknown_name_changes_nothing(tmp_path: Path, primary: FailingModel,
                                               backup: FailingModel) -> None:
    async with core(configure(tmp_path, primary, backup), Clock()) as c:
        told = await command(c, "model", "gpt-9")
        assert await c.hub.d.store.chat_model(1) is None
    assert told.text == "No model called gpt-9 here. The choices: openai/fake, openai/backup."


async def test_a_bare_name_two_providers_share_asks_for_the_provider(
        tmp_path: Path, primary: FailingModel, backup: FailingModel) -> None:
    config = configure(tmp_path, primary, backup, llm__models=[
        {"model": "azure/fake", "api_base": backup.api_base}])
    async with core(config, Clock()) as c:
        told = await command(c, "model", "fake")
        switched = await command(c, "model", "azure/fake")
    assert told.text == "fake is openai/fake and azure/fake: name it with its provider."
    assert switched.text.startswith("This conversation now uses azure/fake")


async def test_a_choice_no_longer_configured_is_no_choice(
        tmp_path: Path, primary: FailingModel, backup: FailingModel) -> None:
    async with core(configure(tmp_path, primary, backup), Clock()) as c:
        await command(c, "model", "openai/backup")
    plain = make_config(tmp_path, primary, llm__retries=0)  # llm.models emptied since
    async with core(plain, Clock()) as c:
        await c.say("hi")
        await c.sink.ended()
        status = await command(c, "status")
    assert len(primary.requests) == 1 and backup.requests == []
    assert status.text.startswith("Model: openai/fake\n")


async def test_a_switch_keeps_the_history_valid_for_the_new_model(
        tmp_path: Path, primary: FailingModel, backup: FailingModel) -> None:
    (tmp_path / "workspace").mkdir(exist_ok=True)
    (tmp_path / "workspace" / "notes.txt").write_text("remember the milk")
    primary.script(Reply(tool_calls=[ToolCallSpec("read_file", {"path": "notes.txt"})]),
                   Reply(text="It says to remember the milk."))
    backup.script(Reply(text="Milk, as I read before."))
    async with core(configure(tmp_path, primary, backup), Clock()) as c:
        await c.say("what is in notes.txt?")
        await c.sink.ended()
        await command(c, "model", "backup")
        await c.say("what did it say?")
        [_, ended] = await c.sink.ended(2)
    assert ended.text == "Milk, as I read before."
    sent = backup.requests[0]["messages"]  # the strict fake checked it as both providers do
    roles = [m["role"] for m in sent]
    assert roles.count("tool") == 1 and roles.index("tool") > roles.index("assistant")
    assert any("remember the milk" in str(m.get("content")) for m in sent if m["role"] == "tool")


# -- the choice in both stores ------------------------------------------------------------

@pytest.fixture(params=["sqlite", "postgresql"])
async def store(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Store]:
    with contextlib.ExitStack() as stack:
        target = stack.enter_context(pg.database()) if request.param == "postgresql" \
            else str(tmp_path / "store.db")
        opened = open_store(target)
        await opened.open()
        try:
            yield opened
        finally:
            await opened.close()


async def test_the_choice_is_kept_per_conversation(store: Store) -> None:
    one = await store.conversation(ConvKey("telegram", "1"))
    two = await store.conversation(ConvKey("telegram", "2"))
    assert await store.chat_model(one.id) is None
    await store.set_chat_model(one.id, "openai/a", "42")
    await store.set_chat_model(one.id, "anthropic/b", "43")
    assert await store.chat_model(one.id) == "anthropic/b"
    assert await store.chat_model(two.id) is None
    await store.set_chat_model(one.id, None, "42")
    assert await store.chat_model(one.id) is None


# -- a cut answer on screen ---------------------------------------------------------------

async def test_a_cut_answer_is_not_finished_by_another_model_unless_marked(
        tmp_path: Path, primary: FailingModel, backup: FailingModel) -> None:
    partial = "The first half of an answer that goes on and on"
    primary.script(Reply(text=partial, fault="drop"))
    async with core(configure(tmp_path, primary, backup), Clock()) as c:
        await c.say("tell me")
        [ended] = await c.sink.ended()
    assert backup.requests == []  # the text on screen is not followed by another model's
    assert ended.reason == "error" and "↪" not in ended.text
    primary.script(Reply(text=partial, fault="drop"))
    backup.script(Reply(text="A whole answer."))
    marked = configure(tmp_path, primary, backup, llm__failover={"after_cut": True})
    async with core(marked, Clock()) as c:
        await c.say("tell me again")
        [ended] = await c.sink.ended()
    assert ended.text == ("A whole answer.\n\n"
                          "↪ answered by openai/backup: openai/fake was cut off mid-answer")
    assert partial not in ended.text  # said once: the cut text was replaced, not repeated


async def test_a_switch_made_by_one_process_holds_in_another_on_postgresql(
        tmp_path: Path, primary: FailingModel, backup: FailingModel) -> None:
    backup.responder = lambda messages: Reply(text="from the other model")
    with pg.database() as url:
        config = configure(tmp_path, primary, backup, store__url=url)
        async with core(config, Clock()) as one, core(config, Clock()) as two:
            await two.say("first")  # the conversation is in the second one's memory
            await two.sink.ended()
            await command(one, "model", "backup")  # switched by the first
            await two.say("second")
            await two.sink.ended(2)
            status = await command(two, "status")
    assert [r["model"] for r in primary.requests] == ["fake"]
    assert [r["model"] for r in backup.requests] == ["backup"]
    assert status.text.startswith("Model: openai/backup (chosen with /model)")
