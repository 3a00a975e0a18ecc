"""Running Tandem for a team, through the Telegram fake: the audit log (every approval
asked and decided, every tool run, refused presses, standing rules; append-only) and
daily budgets (checked before each model call, lifted by an approver, reset at midnight).
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from bot.core.buttons import ItemButton, pack, unpack
from bot.core.errors import StoreError
from bot.core.events import Verdict
from bot.store import AuditRow
from tests.adapters.test_telegram import (
    ANN,
    BOB,
    CAROL,
    ECHO,
    GROUP,
    STRANGER,
    rig,
)
from tests.fakes.model_server import FakeModelServer, Reply
from tests.fakes.telegram_server import FakeTelegram

REPO = Path(__file__).resolve().parent.parent.parent


@pytest.fixture
async def fake() -> AsyncIterator[FakeTelegram]:
    async with FakeTelegram(flood=False) as server:
        yield server
        assert server.internal_errors == []


async def tandem_audit(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """`tandem audit` on the test's database, as a separate process."""
    config = tmp_path / "audit.yaml"
    config.write_text(f"store:\n  path: {tmp_path / 'tandem.db'}\n")
    return await asyncio.to_thread(
        subprocess.run, [sys.executable, "-m", "bot", "audit", "--config", str(config), *args],
        capture_output=True, text=True, cwd=tmp_path, check=True,
        env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO),
             "LITELLM_LOCAL_MODEL_COST_MAP": "True"})


def details(rows: list[AuditRow]) -> list[tuple[str, str, str, dict[str, object]]]:
    return [(r.kind, r.actor, r.tool, json.loads(r.detail)) for r in rows]


async def test_the_audit_log_records_approvals_runs_refusals_and_rules(
        tmp_path: Path, model: FakeModelServer, fake: FakeTelegram) -> None:
    model.script(Reply(tool_calls=[ECHO]), Reply(text="approved and done"),
                 Reply(tool_calls=[ECHO]), Reply(text="denied, fine"),
                 Reply(tool_calls=[ECHO]), Reply(text="always, done"))
    group = f"telegram:{GROUP}"
    async with rig(tmp_path, model, fake, allowed_users=[ANN, BOB], approvers=[CAROL]) as r:
        # approve, after a refused press by someone who may not decide
        fake.push_message(GROUP, ANN, "@tandem_bot write it", chat_type="supergroup")
        card, approval_id = await r.card(GROUP)
        refused = r.press(GROUP, BOB, card, approval_id, Verdict.APPROVE, name="Bob")
        await r.until(lambda: refused in fake.callback_answers)
        r.press(GROUP, CAROL, card, approval_id, Verdict.APPROVE, name="Carol")
        await r.answered(GROUP, "approved and done")
        await r.hub.idle()
        # deny
        fake.push_message(GROUP, ANN, "@tandem_bot again", chat_type="supergroup")
        await r.until(lambda: sum(m.text.startswith("🔐") and bool(m.reply_markup)
                                  for m in r.bot(GROUP)) == 1)
        card, approval_id = await r.card(GROUP)
        r.press(GROUP, ANN, card, approval_id, Verdict.DENY)
        await r.answered(GROUP, "denied, fine")
        await r.hub.idle()
        # always
        fake.push_message(GROUP, ANN, "@tandem_bot once more", chat_type="supergroup")
        card, approval_id = await r.card(GROUP)
        r.press(GROUP, ANN, card, approval_id, Verdict.ALWAYS)
        await r.answered(GROUP, "always, done")
        await r.hub.idle()
        # a stranger is turned away
        fake.push_message(STRANGER, STRANGER, "hello?")
        await r.settle()
        await r.hub.d.watch.flush()
        rows = await r.hub.d.store.audit()
        # nothing the bot's store code runs can change or remove a fresh entry
        with pytest.raises(StoreError, match="append-only"):
            await r.hub.d.store.prune_audit(rows[-1].at + 1)
        assert len(await r.hub.d.store.audit()) == len(rows)
    usage = [e for e in details(rows) if e[0] == "usage"]  # one per turn, its tokens
    entries = [e for e in details(rows) if e[0] != "usage"]
    assert len(usage) >= 3 and all(u[1] == str(ANN) for u in usage), usage
    kinds = [k for k, *_ in entries]
    assert kinds == ["asked", "refused", "decided", "tool",   # approved by Carol
                     "asked", "decided",                      # denied by Ann
                     "asked", "rule", "decided", "tool",      # always, by Ann
                     "refused"]                               # the stranger
    asked = entries[0]
    assert asked[1:3] == (str(ANN), "shell") and asked[3]["call"] == "echo hi > out.txt"
    assert str(asked[3]["expires"]).endswith("Z")
    assert entries[1][1] == str(BOB) and entries[1][3]["what"] == "press"
    assert "not yours" in str(entries[1][3]["why"])
    assert entries[2][1] == str(CAROL) and entries[2][3]["button"] == "approved"
    assert entries[3][3]["outcome"] == "ok" and entries[3][3]["call"] == "echo hi > out.txt"
    assert entries[5][1] == str(ANN) and entries[5][3]["status"] == "denied"
    assert entries[7][3] == {"change": "added", "key": "echo hi > out.txt"}
    assert entries[8][3]["button"] == "always"
    assert entries[10][1] == str(STRANGER) and entries[10][3]["what"] == "access"
    assert {r.conv for r in rows[:10]} == {group}

    # `tandem audit`: a line per entry, or JSON; by conversation, since a time
    done = await tandem_audit(tmp_path, "--conversation", group, "--json")
    printed = [p for line in done.stdout.splitlines()
               if (p := json.loads(line))["kind"] != "usage"]
    assert [p["kind"] for p in printed] == kinds[:10]
    assert printed[2]["actor"] == str(CAROL) and printed[2]["conversation"] == group
    done = await tandem_audit(tmp_path, "--since", "1h")
    lines = done.stdout.splitlines()
    assert len(lines) == 11 + len(usage)
    assert f"approved by {CAROL}: shell echo hi > out.txt" in lines[2]


async def test_an_expiry_is_audited_and_slash_audit_is_for_approvers(
        tmp_path: Path, model: FakeModelServer, fake: FakeTelegram) -> None:
    model.script(Reply(tool_calls=[ECHO]), Reply(text="Nobody approved."))
    async with rig(tmp_path, model, fake, allowed_users=[ANN], approvers=[CAROL],
                   approvals={"expire_after_s": 1}) as r:
        fake.push_message(GROUP, ANN, "@tandem_bot write it", chat_type="supergroup")
        await r.answered(GROUP, "Nobody approved.")
        await r.hub.idle()
        await r.hub.d.watch.flush()
        decided = [json.loads(e.detail) for e in await r.hub.d.store.audit()
                   if e.kind == "decided"]
        assert decided and decided[0]["status"] == "expired" and "button" not in decided[0]
        fake.push_message(GROUP, ANN, "/audit", chat_type="supergroup")
        await r.until(lambda: any("Only an approver" in m.text for m in r.bot(GROUP)))
        fake.push_message(GROUP, CAROL, "/audit", chat_type="supergroup")
        await r.until(lambda: any("audit entries of this chat" in m.text for m in r.bot(GROUP)))
        shown = next(m.text for m in r.bot(GROUP) if "audit entries of this chat" in m.text)
        assert "expired: shell echo hi > out.txt" in shown
        await r.hub.idle()


async def test_a_daily_budget_stops_before_the_model_an_approver_lifts_it_midnight_resets(
        tmp_path: Path, model: FakeModelServer, fake: FakeTelegram) -> None:
    model.script(Reply(text="one", usage=(900, 200)), Reply(text="two", usage=(50, 10)),
                 Reply(text="three", usage=(50, 10)), Reply(text="four", usage=(50, 10)))
    budget = {"budget": {"per_user_day": {"tokens": 1000}}}
    async with rig(tmp_path, model, fake, allowed_users=[ANN], approvers=[CAROL],
                   limits=budget) as r:
        clock = [1_796_031_240.0]  # 2026-11-30 09:34 UTC
        r.hub.runner.budget.clock = lambda: clock[0]
        fake.push_message(GROUP, ANN, "@tandem_bot first", chat_type="supergroup")
        await r.answered(GROUP, "one")
        await r.hub.idle()
        calls = len(model.requests)
        fake.push_message(GROUP, ANN, "@tandem_bot second", chat_type="supergroup")
        await r.until(lambda: any("daily budget is used up" in m.text for m in r.bot(GROUP)))
        await r.settle()
        assert len(model.requests) == calls  # no model call
        stop = next(m.text for m in r.bot(GROUP) if "daily budget is used up" in m.text)
        assert "1,100 of 1,000 tokens" in stop and "resets at 00:00 UTC (in 14 h 26 min)" in stop
        notice = next(m for m in r.bot(GROUP) if m.reply_markup and "budget" in m.text)
        data = notice.reply_markup["inline_keyboard"][0][0]["callback_data"]
        assert unpack(data) == ItemButton("budget", f"u20261130{ANN}")
        # the user cannot lift their own budget; an approver can
        mine = fake.push_callback(GROUP, ANN, notice.message_id, data, first_name="Ann")
        await r.until(lambda: mine in fake.callback_answers)
        await r.settle()
        assert not any("lifted for today" in m.text for m in r.bot(GROUP))
        fake.push_callback(GROUP, CAROL, notice.message_id, data, first_name="Carol")
        await r.until(lambda: any("lifted for today by Carol" in m.text for m in r.bot(GROUP)))
        fake.push_message(GROUP, ANN, "@tandem_bot third", chat_type="supergroup")
        await r.answered(GROUP, "two")
        await r.hub.idle()
        # the next day: a fresh budget (and yesterday's lift is gone with it)
        clock[0] += 86_400
        fake.push_message(GROUP, ANN, "/status", chat_type="supergroup")
        await r.until(lambda: any("Budget today, you: 0 of 1,000 tokens" in m.text
                                  for m in r.bot(GROUP)))
        fake.push_message(GROUP, ANN, "@tandem_bot fourth", chat_type="supergroup")
        await r.answered(GROUP, "three")
        await r.hub.idle()
        stale = pack(ItemButton("budget", f"u20261130{ANN}"))
        fake.push_callback(GROUP, CAROL, notice.message_id, stale, first_name="Carol")
        await r.until(lambda: any("from another day" in m.text for m in r.bot(GROUP)))
        await r.hub.d.watch.flush()
        kinds = [(e.kind, json.loads(e.detail).get("change")) for e in
                 await r.hub.d.store.audit() if e.kind == "budget"]
        await r.hub.idle()
    assert kinds == [("budget", "reached"), ("budget", "lifted")]
    assert model.violations == []
