"""The audit log's watcher and `tandem audit`'s reading of times, on a real SQLite store."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable
from datetime import UTC, datetime
from pathlib import Path

import pytest

from bot.cli import audit_cli
from bot.core import redact
from bot.core import watch as w
from bot.core.buttons import ItemButton, unpack
from bot.core.config import Config
from bot.core.errors import ConfigError
from bot.core.events import Command, ConvKey, Notice, TurnEnded, User
from bot.ops.audit import Audit
from bot.store import Store
from bot.store.backends import open_store
from tests.conftest import Core
from tests.fakes.model_server import FakeModelServer, Reply

KEY = ConvKey("telegram", "5")
SECRET = "sk-live-0123456789abcdef"


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[Store]:
    store = open_store(str(tmp_path / "a.db"))
    await store.open()
    yield store
    await store.close()


async def test_entries_are_batched_redacted_and_written_by_close(store: Store) -> None:
    clock = [1_800_000_000.0]
    audit = Audit(store, redact.known([SECRET]), keep_days=90, clock=lambda: clock[0])
    await audit.see(w.ToolRan(KEY, "shell", f"curl -H 'key: {SECRET}' x", "ok", 0.25, "42"))
    await audit.see(w.ModelCalled("m", 1.0, 10, 2, 0.0, True))  # counted only, not audited
    await audit.see(w.TurnDone(KEY, "completed", 1.2))
    assert await store.audit() == []  # gathered, not yet written
    await audit.close()
    rows = await store.audit()
    assert len(rows) == 1 and rows[0].kind == "tool" and rows[0].at == clock[0]
    assert SECRET not in rows[0].detail
    detail = json.loads(rows[0].detail)
    assert detail["outcome"] == "ok" and detail["seconds"] == 0.25
    assert rows[0].line().startswith("2027-01-15T08:00:00Z [telegram:5] ran by 42: shell curl")


async def test_old_entries_are_pruned_with_the_first_write_after_a_start(store: Store) -> None:
    now = datetime(2026, 12, 3, 12, tzinfo=UTC).timestamp()
    old = Audit(store, redact.Redactor(), keep_days=90, clock=lambda: now - 100 * 86_400)
    await old.see(w.Refused("telegram", "77", "access", "not allowed"))
    await old.close()
    fresh = Audit(store, redact.Redactor(), keep_days=90, clock=lambda: now)
    await fresh.see(w.Refused("telegram", "78", "access", "not allowed"))
    await fresh.close()
    assert [r.actor for r in await store.audit()] == ["78"]


def test_since_reads_ages_and_dates_and_names_a_bad_value() -> None:
    now = 1_800_000_000.0
    assert audit_cli.since("30m", now) == now - 1800
    assert audit_cli.since("7d", now) == now - 7 * 86_400
    assert audit_cli.since("2026-12-01", now) == datetime(2026, 12, 1, tzinfo=UTC).timestamp()
    assert audit_cli.since("2026-12-01T09:30+01:00", now) == \
        datetime(2026, 12, 1, 8, 30, tzinfo=UTC).timestamp()
    with pytest.raises(ConfigError, match="--since.*neither an age"):
        audit_cli.since("last tuesday", now)


async def test_a_conversation_budget_in_the_terminal_and_its_lift_by_the_person_there(
        config_factory: Callable[..., Config], model: FakeModelServer) -> None:
    """The terminal's person runs Tandem: they may lift a budget (and read `/audit`);
    a conversation's budget counts whoever asks, in cost too."""
    model.script(Reply(text="one", usage=(400, 100)), Reply(text="two", usage=(10, 1)))
    config = config_factory(limits__budget={"per_conversation_day": {"tokens": 500}})
    async with Core(config) as core:
        await core.say("first")
        await core.sink.wait(lambda: core.sink.of(TurnEnded))
        await core.hub.idle()
        await core.say("second", user=User("u2", "Bob"))
        ended = await core.sink.wait(lambda: core.sink.of(TurnEnded)[1:])
        assert ended[0].reason == "budget" and "this conversation's daily budget" in \
            ended[0].text and "500 of 500 tokens" in ended[0].text
        notice = next(n for n in core.sink.of(Notice) if n.buttons)
        lift = unpack(notice.buttons[0].data)
        assert isinstance(lift, ItemButton) and lift.kind == "budget"
        assert len(model.requests) == 1
        await core.hub.submit(Command(core.key, core.user, lift.command, lift.item_id))
        await core.sink.wait(lambda: any("lifted for today" in n.text
                                         for n in core.sink.of(Notice)))
        await core.say("third")
        await core.sink.wait(lambda: any(e.text == "two" for e in core.sink.of(TurnEnded)))
        await core.hub.submit(Command(core.key, core.user, "audit", ""))
        shown = await core.sink.wait(lambda: [n for n in core.sink.of(Notice)
                                              if "audit entries" in n.text])
        assert "budget" in shown[0].text and "change=lifted" in shown[0].text


def test_the_text_view_writes_out_line_breaks_and_escapes(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A command of several lines cannot print a forged entry, and a rule key's ESC
    sequences cannot erase the entry before it: `tandem audit` shows one line per entry."""
    db = tmp_path / "a.db"
    forged = "2027-01-15T08:00:01Z [telegram:5] ran by 111: shell rm -rf / → ok in 0.1 s"

    async def write() -> None:
        store = open_store(str(db))
        await store.open()
        audit = Audit(store, redact.Redactor(), keep_days=90, clock=lambda: 1_800_000_000.0)
        await audit.see(w.ToolRan(KEY, "shell", f"ls\n{forged}", "ok", 0.1, "42"))
        await audit.see(w.RuleChanged(KEY, "shell", "echo hi\x1b[2K\x1b[1A\r\u2028", "added",
                                      "42"))
        await audit.close()
        await store.close()

    asyncio.run(write())
    assert audit_cli.run(Config.model_validate({"store": {"path": str(db)}}), None, None,
                         as_json=False) == 0
    out = capsys.readouterr().out
    assert out.count("\n") == 2 and not any(c in out for c in "\x1b\r\u2028"), repr(out)
    first, second = out.splitlines()
    assert first.endswith(f"ran by 42: shell ls⟨U+000A⟩{forged} → ok in 0.1 s")
    assert second.endswith("rule added by 42: shell echo hi⟨U+001B⟩[2K⟨U+001B⟩[1A"
                           "⟨U+000D⟩⟨U+2028⟩")


async def test_a_strangers_refusals_make_one_entry_per_sender_in_ten_minutes(
        store: Store) -> None:
    clock = [1_800_000_000.0]
    audit = Audit(store, redact.Redactor(), keep_days=90, clock=lambda: clock[0])
    for _ in range(50):
        await audit.see(w.Refused("telegram", "77", "access", "not allowed"))
        clock[0] += 1
    await audit.see(w.Refused("telegram", "78", "access", "not allowed"))
    await audit.see(w.Refused("slack", "77", "access", "not allowed"))  # another sender
    await audit.see(w.Refused("telegram", "78", "press", "expired"))  # not a stranger's
    await audit.see(w.Refused("telegram", "78", "press", "expired"))
    clock[0] += 600
    await audit.see(w.Refused("telegram", "77", "access", "not allowed"))
    await audit.close()
    rows = [(r.actor, json.loads(r.detail)["platform"], json.loads(r.detail)["what"],
             json.loads(r.detail)["why"]) for r in await store.audit()]
    assert rows == [
        ("77", "telegram", "access", "not allowed"),
        ("78", "telegram", "access", "not allowed"),
        ("77", "slack", "access", "not allowed"),
        ("78", "telegram", "press", "expired"), ("78", "telegram", "press", "expired"),
        ("77", "telegram", "access",
         "not allowed (49 more refusals of this sender since the last entry)")]
