"""Whole turns through the hub, the real litellm client and the strict fake model."""

from __future__ import annotations

import sqlite3
import time
from pathlib import Path
from typing import Any

from bot.core.events import (
    ApprovalRequested,
    ApprovalResolved,
    Cancel,
    Decision,
    Notice,
    Progress,
    Queued,
    User,
    Verdict,
)
from bot.run.app import default_tools
from tests.conftest import Core
from tests.fakes.model_server import FakeModelServer, Reply, ToolCallSpec
from tests.waiting import eventually, processes


def shell(cmd: str) -> Reply:
    return Reply(tool_calls=[ToolCallSpec("shell", {"command": cmd})])


async def decide(core: Core, verdict: Verdict, n: int = 1, user: User | None = None) -> Any:
    await core.sink.wait(lambda: len(core.sink.of(ApprovalRequested)) >= n)
    approval = core.sink.of(ApprovalRequested)[n - 1]
    return await core.hub.submit(Decision(core.key, user or core.user, approval.approval_id,
                                          verdict))


def contents(model: FakeModelServer, index: int = -1) -> list[tuple[str, str]]:
    return [(m["role"], m.get("content") or "") for m in model.requests[index]["messages"]]


async def test_a_plain_answer_and_the_hint_is_never_stored(model: FakeModelServer,
                                                           config_factory: Any) -> None:
    model.script(Reply(text="Hello Ann!"), Reply(text="Again."))
    async with Core(config_factory()) as core:
        await core.say("hi")
        [ended] = await core.sink.ended()
        assert (ended.text, ended.reason) == ("Hello Ann!", "completed")
        await core.say("and again")
        await core.sink.ended(2)
    first, second = contents(model, 0), contents(model, 1)
    assert first[0][0] == "system"
    assert first[1] == ("user", "[Ann] hi")
    assert first[-1][0] == "user" and first[-1][1].startswith("[Current state")
    assert second[1] == ("user", "[Ann] hi")  # the note was not stored
    assert second[-1][1].startswith("[Current state")
    assert sum("Current state" in c for _, c in second) == 1


async def test_shell_runs_after_approval_and_a_denial_is_answered(
        model: FakeModelServer, config_factory: Any, tmp_path: Path) -> None:
    model.script(shell("echo approved > a.txt"), Reply(text="Done."),
                 shell("echo denied > b.txt"), Reply(text="Understood, not running it."))
    async with Core(config_factory()) as core:
        await core.say("write a")
        await decide(core, Verdict.APPROVE)
        await core.sink.ended(1)  # it waited (suspended, not ended), then completed
        await core.say("write b")
        await decide(core, Verdict.DENY, 2)
        ended = await core.sink.ended(2)
    assert (tmp_path / "workspace" / "a.txt").read_text() == "approved\n"
    assert not (tmp_path / "workspace" / "b.txt").exists()
    assert ended[-1].text == "Understood, not running it."
    tool_results = [c for r, c in contents(model) if r == "tool"]
    assert tool_results[-1].startswith("denied")
    outcomes = [e.outcome for e in core.sink.of(ApprovalResolved)]
    assert outcomes == ["approved", "denied"]


async def test_only_the_requester_or_an_approver_may_decide(model: FakeModelServer,
                                                            config_factory: Any,
                                                            tmp_path: Path) -> None:
    model.script(shell("touch x"), Reply(text="ok"))
    config = config_factory(telegram__approvers=[777])
    async with Core(config) as core:
        await core.say("touch x")
        receipt = await decide(core, Verdict.APPROVE, user=User("u2", "Bob"))
        assert not receipt.accepted and "not yours" in receipt.note
        assert not (tmp_path / "workspace" / "x").exists()
        assert len(model.requests) == 1
        receipt = await decide(core, Verdict.APPROVE)
        assert receipt.accepted
        await core.sink.ended(1)
        again = await decide(core, Verdict.DENY)
        assert not again.accepted and "Already decided" in again.note
    assert (tmp_path / "workspace" / "x").exists()


async def test_always_covers_exactly_that_command_in_that_conversation(
        model: FakeModelServer, config_factory: Any) -> None:
    model.script(shell("echo one"), Reply(text="1"), shell("echo one"), Reply(text="2"),
                 shell("echo two"))
    async with Core(config_factory()) as core:
        await core.say("first")
        await decide(core, Verdict.ALWAYS)
        await core.sink.ended(1)
        await core.say("again")
        await core.sink.ended(2)
        assert len(core.sink.of(ApprovalRequested)) == 1  # the same command ran unasked
        await core.say("other")
        await core.sink.wait(lambda: len(core.sink.of(ApprovalRequested)) == 2)


async def test_an_approval_survives_a_restart(model: FakeModelServer, config_factory: Any,
                                              tmp_path: Path) -> None:
    config = config_factory()
    model.script(shell("echo after-restart > r.txt"), Reply(text="It ran."))
    async with Core(config) as core:
        await core.say("please run it")
        [asked] = await core.sink.wait(lambda: core.sink.of(ApprovalRequested))
    async with Core(config) as fresh:
        receipt = await fresh.hub.submit(Decision(fresh.key, fresh.user, asked.approval_id,
                                                  Verdict.APPROVE))
        assert receipt.accepted
        [ended] = await fresh.sink.ended()
    assert ended.text == "It ran."
    assert (tmp_path / "workspace" / "r.txt").read_text() == "after-restart\n"


async def test_an_unanswered_approval_expires_as_a_denial(model: FakeModelServer,
                                                          config_factory: Any,
                                                          tmp_path: Path) -> None:
    model.script(shell("touch late"), Reply(text="It was not approved in time."))
    async with Core(config_factory(approvals__expire_after_s=1)) as core:
        await core.say("touch late")
        ended = await core.sink.ended(1, timeout=10)
        assert ended[-1].text == "It was not approved in time."
        assert [e.outcome for e in core.sink.of(ApprovalResolved)] == ["expired"]
        assert any("expired" in n.text for n in core.sink.of(Notice))
    assert not (tmp_path / "workspace" / "late").exists()
    assert [c for r, c in contents(model) if r == "tool"][0].startswith("denied")


async def test_a_persona_edit_reaches_the_next_request_and_an_unchanged_one_is_identical(
        model: FakeModelServer, config_factory: Any, tmp_path: Path) -> None:
    model.script(Reply(text="a"), Reply(text="b"), Reply(text="c"))
    async with Core(config_factory()) as core:
        await core.say("one")
        await core.sink.ended(1)
        await core.say("two")
        await core.sink.ended(2)
        (tmp_path / "persona" / "USER.md").write_text("Call the user Xiaoniu.")
        await core.say("three")
        await core.sink.ended(3)
    systems = [r["messages"][0]["content"] for r in model.requests]
    assert systems[0] == systems[1]
    assert "Xiaoniu" not in systems[1] and "Call the user Xiaoniu." in systems[2]


async def test_cancel_mid_stream_keeps_only_plain_text(model: FakeModelServer,
                                                       config_factory: Any) -> None:
    long = "word " * 400
    model.script(Reply(text=long, chunk_size=5, chunk_delay=0.01,
                       tool_calls=[ToolCallSpec("shell", {"command": "echo never"})]),
                 Reply(text="fresh"))
    async with Core(config_factory()) as core:
        await core.say("talk")
        await core.sink.wait(lambda: any(p.text for p in core.sink.of(Progress)))
        await core.hub.cancel(Cancel(core.key, core.user))
        [ended] = await core.sink.ended()
        assert ended.reason == "cancelled" and ended.text.endswith("⏹ Cancelled.")
        assert 0 < len(ended.text) < len(long)
        await core.say("next")
        await core.sink.ended(2)
    history = model.requests[-1]["messages"]
    partial = [m for m in history if m["role"] == "assistant"]
    assert len(partial) == 1 and "tool_calls" not in partial[0]
    assert long.startswith(partial[0]["content"])
    assert core.sink.of(ApprovalRequested) == []


async def test_cancel_stops_a_running_tool_and_kills_its_process(
        model: FakeModelServer, config_factory: Any, tmp_path: Path) -> None:
    marker = tmp_path / "workspace" / "survived"
    model.script(shell(f"sleep 5 && touch {marker}"), Reply(text="after"))
    config = config_factory(approvals__tools={"shell": "allow"})
    async with Core(config) as core:
        await core.say("sleep")
        await core.sink.wait(lambda: any(p.tool == "shell" for p in core.sink.of(Progress)))
        started = time.monotonic()
        await core.hub.cancel(Cancel(core.key, core.user))
        [ended] = await core.sink.ended()
        assert time.monotonic() - started < 2
        assert ended.reason == "cancelled"
    # the shell that would touch the marker after its `sleep 5` is gone (killed with its
    # group), so the marker can never appear
    await eventually(lambda: not processes(str(marker)), 3, what="the tool's processes gone")
    assert not marker.exists()
    assert len(model.requests) == 1


async def test_malformed_tool_arguments_are_reported_to_the_model(
        model: FakeModelServer, config_factory: Any) -> None:
    model.script(Reply(tool_calls=[ToolCallSpec("read_file", '{"path": ')]),
                 Reply(text="Sorry, fixed."))
    async with Core(config_factory()) as core:
        await core.say("read")
        [ended] = await core.sink.ended()
    assert ended.text == "Sorry, fixed."
    tool = [c for r, c in contents(model) if r == "tool"]
    assert "not valid JSON" in tool[0]


async def test_bad_input_gets_a_clear_answer_and_loses_nothing(
        model: FakeModelServer, config_factory: Any, tmp_path: Path) -> None:
    model.script(Reply(text="got the big one"), Reply(text="clean"))
    async with Core(config_factory()) as core:
        await core.say("   \x00\x07  ")
        await core.sink.wait(lambda: core.sink.of(Notice))
        assert "empty" in core.sink.of(Notice)[0].text
        big = "x" * 1_000_000
        await core.say(big)
        await core.sink.ended(1)
        await core.say("a\x00b\x1bc")
        await core.sink.ended(2)
    saved = list((tmp_path / "workspace" / "inbox").glob("*/*.txt"))
    assert len(saved) == 1 and saved[0].read_text() == big
    assert len(model.requests) == 2
    assert any("1,000,000" in n.text for n in core.sink.of(Notice))
    assert contents(model)[-2][1].startswith("[Ann] abc")


async def test_a_duplicate_inbound_is_answered_once(model: FakeModelServer,
                                                    config_factory: Any) -> None:
    model.script(Reply(text="once"))
    config = config_factory()
    async with Core(config) as core:
        await core.say("hello", ref="tg:1")
        await core.say("hello", ref="tg:1")
        await core.sink.ended()
        await core.hub.idle()
    async with Core(config) as again:
        await again.say("hello", ref="tg:1")
        await again.hub.idle()
        assert again.sink.events == []
    assert len(model.requests) == 1


async def test_messages_sent_during_a_turn_are_acknowledged_and_answered_together(
        model: FakeModelServer, config_factory: Any) -> None:
    model.script(Reply(text="slow " * 50, chunk_size=5, chunk_delay=0.01), Reply(text="both"))
    async with Core(config_factory()) as core:
        await core.say("first")
        await core.sink.wait(lambda: core.sink.of(Progress))
        await core.say("second")
        await core.say("third")
        ended = await core.sink.ended(2)
        assert len(core.sink.of(Queued)) == 2
    assert ended[-1].text == "both"
    users = [c for r, c in contents(model) if r == "user"]
    assert users[-3].startswith("[Ann] second") and users[-2].startswith("[Ann] third")


async def test_the_loop_breaker_ends_a_turn_of_failing_calls(model: FakeModelServer,
                                                             config_factory: Any) -> None:
    count = iter(range(100))
    model.responder = lambda _m: shell(f"exit 1 # {next(count)}")
    async with Core(config_factory(approvals__tools={"shell": "allow"})) as core:
        await core.say("loop")
        [ended] = await core.sink.ended(timeout=30)
    assert ended.reason == "breaker" and "another way" in ended.text
    results = [c for r, c in contents(model) if r == "tool"]
    # 8 failures end it: the 7th call was skipped with the warning, the 9th never sent back
    assert sum(1 for c in results if c.startswith("error: exit status 1")) == 7
    assert sum(1 for c in results if "failed 6 times" in c) == 1


async def test_the_step_budget_is_its_own_exit(model: FakeModelServer,
                                               config_factory: Any) -> None:
    model.responder = lambda _m: Reply(tool_calls=[ToolCallSpec("list_dir", {"path": "."})])
    async with Core(config_factory(limits__max_steps=3)) as core:
        await core.say("list forever")
        [ended] = await core.sink.ended()
    assert ended.reason == "max_steps" and "3 steps" in ended.text
    assert len(model.requests) == 3


async def test_model_faults_are_retried_or_explained(model: FakeModelServer,
                                                     config_factory: Any) -> None:
    model.script(Reply(fault="429", retry_after=0), Reply(text="after a retry"),
                 Reply(fault="context"), Reply(text="after a trim"),
                 Reply(fault="500"), Reply(fault="500"))
    async with Core(config_factory()) as core:
        for n, text in enumerate("abc", 1):
            await core.say(text)
            ended = await core.sink.ended(n, timeout=20)
    assert [e.text for e in ended[:2]] == ["after a retry", "after a trim"]
    assert ended[2].reason == "error"
    assert "The model call failed: the server answered 500 (http://127.0.0.1:" in ended[2].text


async def test_a_system_prompt_larger_than_the_window_is_a_clear_error(
        model: FakeModelServer, config_factory: Any) -> None:
    async with Core(config_factory(llm__context_window=600)) as core:
        await core.say("hi")
        [ended] = await core.sink.ended()  # the turn is stored, and ends as an error
    assert "larger than the model's context window" in ended.text
    assert ended.reason == "error"
    assert model.requests == []


async def test_old_turns_are_trimmed_whole(model: FakeModelServer, config_factory: Any) -> None:
    model.responder = lambda _m: Reply(text=" ".join(f"w{i}" for i in range(500)))
    async with Core(config_factory(llm__context_window=6000, llm__max_output_tokens=500)) as core:
        for i in range(8):
            await core.say(f"question {i} " + "x" * 2000)
            await core.sink.ended(i + 1)
    last = model.requests[-1]["messages"]
    assert last[1]["role"] == "user"
    assert "question 7" in last[-2]["content"]
    assert not any("question 0" in (m.get("content") or "") for m in last)


async def test_arguments_changed_after_the_card_was_shown_are_refused(
        model: FakeModelServer, config_factory: Any, tmp_path: Path) -> None:
    import sqlite3

    config = config_factory()
    model.script(shell("echo shown"), Reply(text="It was refused."))
    async with Core(config) as core:
        await core.say("run it")
        [asked] = await core.sink.wait(lambda: core.sink.of(ApprovalRequested))
    db = sqlite3.connect(tmp_path / "tandem.db")
    db.execute("""UPDATE tool_calls SET arguments='{"command": "touch swapped"}'""")
    db.commit()
    db.close()
    async with Core(config) as fresh:
        await fresh.hub.submit(Decision(fresh.key, fresh.user, asked.approval_id,
                                        Verdict.APPROVE))
        [ended] = await fresh.sink.ended()
    assert ended.text == "It was refused."
    assert not (tmp_path / "workspace" / "swapped").exists()
    tool = [m for m in model.last_messages() if m["role"] == "tool"]
    assert "differs from the one that was approved" in tool[0]["content"]


async def test_an_approval_older_than_the_expiry_at_restart_is_denied_with_a_notice(
        model: FakeModelServer, config_factory: Any, tmp_path: Path) -> None:
    config = config_factory(approvals__expire_after_s=1)
    model.script(shell("touch never"), Reply(text="Not approved in time."))
    async with Core(config) as core:
        await core.say("run it")
        [asked] = await core.sink.wait(lambda: core.sink.of(ApprovalRequested))
        core.hub.lanes.closing = True  # stop before the expiry timer fires, like a crash
    db = sqlite3.connect(tmp_path / "tandem.db")  # 1.2 s go by while Tandem is down
    db.execute("UPDATE approvals SET created_at = created_at - 1.2, "
               "expires_at = expires_at - 1.2")
    db.commit()
    db.close()
    async with Core(config) as fresh:
        [ended] = await fresh.sink.ended()
        notices = [n.text for n in fresh.sink.of(Notice)]
        late = await fresh.hub.submit(Decision(fresh.key, fresh.user, asked.approval_id,
                                               Verdict.APPROVE))
    assert ended.text == "Not approved in time."
    assert any("expired" in n for n in notices)
    assert not late.accepted and "expired" in (late.note or "")
    assert not (tmp_path / "workspace" / "never").exists()


async def test_a_failing_model_falls_back_to_the_next_one(model: FakeModelServer,
                                                          config_factory: Any) -> None:
    model.script(Reply(fault="500"), Reply(text="from the backup"))
    backup = {"model": "openai/backup", "api_base": model.api_base, "api_key": "sk-test"}
    config = config_factory(llm__retries=0, llm__fallbacks=[backup])
    async with Core(config) as core:
        await core.say("hello")
        [ended] = await core.sink.ended()
    assert ended.text == ("from the backup\n\n"
                          "↪ answered by openai/backup: openai/fake is unavailable")
    assert [r["model"] for r in model.requests] == ["fake", "backup"]


def _cancelling_tool(core_ref: list[Core]) -> Any:
    """A tool that presses Cancel while it runs, then returns normally."""
    from bot.tools import Tool

    async def press_cancel(_ctx: Any, _args: dict[str, Any]) -> str:
        core = core_ref[0]
        await core.hub.cancel(Cancel(core.key, core.user))
        return "done"

    return Tool("press", "test tool", {"type": "object", "properties": {}}, press_cancel,
                policy="allow")


async def test_cancel_is_honoured_at_the_next_step_start(model: FakeModelServer,
                                                         config_factory: Any) -> None:
    ref: list[Core] = []
    model.script(Reply(tool_calls=[ToolCallSpec("press", {})]), Reply(text="never asked"))
    async with Core(config_factory(), tools=[_cancelling_tool(ref)]) as core:
        ref.append(core)
        await core.say("go")
        [ended] = await core.sink.ended()
    assert ended.reason == "cancelled"
    assert len(model.requests) == 1  # the next step never started


async def test_cancel_is_honoured_between_tool_calls(model: FakeModelServer,
                                                     config_factory: Any,
                                                     tmp_path: Path) -> None:
    ref: list[Core] = []
    model.script(Reply(tool_calls=[ToolCallSpec("press", {}), ToolCallSpec(
        "write_file", {"path": "second.txt", "content": "x"})]), Reply(text="after"))
    config = config_factory(approvals__tools={"write_file": "allow"})
    async with Core(config, tools=[_cancelling_tool(ref), *default_tools()]) as core:
        ref.append(core)
        await core.say("go")
        [ended] = await core.sink.ended()
        await core.say("and now?")
        await core.sink.ended(2)
    assert ended.reason == "cancelled"
    assert not (tmp_path / "workspace" / "second.txt").exists()
    results = [m["content"] for m in model.last_messages() if m["role"] == "tool"]
    assert results[0] == "done" and results[1].startswith("interrupted")
