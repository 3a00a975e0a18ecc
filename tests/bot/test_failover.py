"""Failover: the chain of models, each reached with its own endpoint and key; a model that
keeps failing is skipped for a cool-down by every call, then tried again; a hung or
refusing model hands over at once; no switch once text is on screen unless marked.

Two strict fake endpoints (`tests.fakes.failing_model`), a primary and a backup, both
spoken to by the real litellm; time is a clock the test moves (no sleeps).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from bot import llm
from bot.core.config import LLMConfig, load_config
from bot.core.errors import ModelStreamCut, ModelUnreachable
from bot.llm.failover import Health, choosing, find, targets
from tests.fakes.failing_model import Clock, FailingModel
from tests.fakes.model_server import Reply


def client(primary: FailingModel, backup: FailingModel, clock: Clock | None = None,
           **overrides: Any) -> llm.LiteLLMClient:
    data: dict[str, Any] = {
        "model": "openai/fake", "api_base": primary.api_base, "api_key": "sk-primary",
        "timeout_s": 5, "retries": 0,
        "fallbacks": [{"model": "openai/backup", "api_base": backup.api_base,
                       "api_key": "sk-backup"}]}
    config = LLMConfig.model_validate({**data, **overrides})
    return llm.LiteLLMClient(config, Health.of(config, clock or Clock()))


async def ask(c: llm.LiteLLMClient, text: str = "hi") -> list[llm.StreamItem]:
    return [item async for item in c.stream([{"role": "user", "content": text}], [])]


def answer(items: list[llm.StreamItem]) -> llm.Completion:
    last = items[-1]
    assert isinstance(last, llm.Completion)
    return last


# -- each model with its own endpoint and key ---------------------------------------------

async def test_a_named_fallback_never_borrows_the_primarys_endpoint_or_key(
        primary: FailingModel, backup: FailingModel, monkeypatch: pytest.MonkeyPatch) -> None:
    # a name alone is reached as its provider is: through that provider's environment
    monkeypatch.setenv("OPENAI_API_BASE", backup.api_base)
    monkeypatch.setenv("OPENAI_API_KEY", "sk-from-the-environment")
    primary.down = "500"
    backup.script(Reply(text="from the backup"))
    c = client(primary, backup, fallbacks=["openai/backup"])
    done = answer(await ask(c))
    assert done.text == "from the backup" and done.model == "openai/backup"
    assert [r["model"] for r in primary.requests] == ["fake"]  # never "backup"
    assert primary.keys == ["sk-primary"]
    assert backup.keys == ["sk-from-the-environment"]


async def test_a_full_entry_has_its_own_endpoint_key_and_options(
        primary: FailingModel, backup: FailingModel, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("BACKUP_KEY", "sk-backup-from-env")
    path = tmp_path / "config.yaml"
    path.write_text(f"""
llm:
  model: openai/fake
  api_base: {primary.api_base}
  api_key: sk-primary
  retries: 0
  fallbacks:
    - model: openai/backup
      api_base: {backup.api_base}
      api_key: ${{BACKUP_KEY}}
      max_output_tokens: 77
      temperature: 0.25
""")
    config = load_config(str(path))
    assert "sk-backup-from-env" in config.secrets()  # redacted like the primary's key
    primary.down = "refuse"
    c = llm.LiteLLMClient(config.llm, Health.of(config.llm, Clock()))
    assert answer(await ask(c)).model == "openai/backup"
    assert backup.keys == ["sk-backup-from-env"]
    assert backup.requests[0]["max_tokens"] == 77
    assert backup.requests[0]["temperature"] == 0.25
    assert "temperature" not in primary.requests[0]


def test_fallbacks_and_models_take_names_or_entries() -> None:
    config = LLMConfig.model_validate({
        "model": "openai/a", "fallbacks": ["anthropic/b", {"model": "openai/c",
                                                            "api_base": "http://c"}],
        "models": "openai/a, anthropic/d"})
    assert [t.model for t in targets(config)] == ["openai/a", "anthropic/b", "openai/c"]
    assert [t.api_base for t in targets(config)] == [None, None, "http://c"]
    assert [m.model for m in config.choices()] == ["openai/a", "anthropic/d"]
    chosen = targets(config, "d")  # a choice heads the chain, the fallbacks follow
    assert [t.model for t in chosen] == ["anthropic/d", "anthropic/b", "openai/c"]
    both = LLMConfig.model_validate({"model": "openai/x", "models": ["azure/x"]})
    assert find(both, "x") is None  # two providers' x: only a full name says which
    assert find(both, "AZURE/X") is not None and find(both, "openai/x") is not None


# -- skipped after N failures, tried again after the cool-down -----------------------------

async def test_a_failing_model_is_skipped_after_n_failures_then_tried_again(
        primary: FailingModel, backup: FailingModel) -> None:
    clock = Clock()
    c = client(primary, backup, clock, failover={"failures": 3, "cooldown_s": 60})
    primary.down = "500"
    for _ in range(3):
        done = answer(await ask(c))
        assert done.model == "openai/backup"
    assert primary.failed == 3
    outage = done.unavailable[0].outage
    for _ in range(2):  # skipped: not called at all, for every conversation
        done = answer(await ask(c))
        assert done.model == "openai/backup"
        assert [(u.model, u.outage) for u in done.unavailable] == [("openai/fake", outage)]
    assert len(primary.requests) == 3
    clock.now += 59
    await ask(c)
    assert len(primary.requests) == 3  # still cooling down
    clock.now += 2
    await ask(c)  # half-open: one call tries it, it fails, it is skipped again at once
    assert len(primary.requests) == 4
    await ask(c)
    assert len(primary.requests) == 4
    primary.down = None
    primary.script(Reply(text="back"))
    clock.now += 61
    done = answer(await ask(c))
    assert (done.text, done.model, done.unavailable) == ("back", "openai/fake", ())
    primary.down = "500"  # a new outage has a new number (the chat is told again)
    assert answer(await ask(c)).unavailable[0].outage != outage


async def test_retries_of_one_call_count_as_failures_in_a_row(
        primary: FailingModel, backup: FailingModel) -> None:
    c = client(primary, backup, retries=2)
    primary.down = "500"
    assert answer(await ask(c)).model == "openai/backup"
    assert primary.failed == 3
    await ask(c)
    assert primary.failed == 3  # three in a row: skipped from the next call on


async def test_a_success_resets_the_count(primary: FailingModel, backup: FailingModel) -> None:
    c = client(primary, backup)
    for down in ("500", "500", None, "500", "500"):
        primary.down = down
        await ask(c)
    primary.down = None
    assert answer(await ask(c)).model == "openai/fake"  # 2 in a row, never 3


async def test_a_hung_primary_is_cut_by_its_timeout_and_not_waited_for_twice(
        primary: FailingModel, backup: FailingModel) -> None:
    primary.down = "hang"
    c = client(primary, backup, timeout_s=0.5, retries=2, failover={"failures": 2})
    for _ in range(2):
        assert answer(await ask(c)).model == "openai/backup"
    assert len(primary.requests) == 2  # one per call despite two retries
    await ask(c)
    assert len(primary.requests) == 2  # two hangs in a row: skipped


async def test_a_refusing_model_hands_over_at_once_and_counts(
        primary: FailingModel, backup: FailingModel) -> None:
    primary.down = "refuse"
    c = client(primary, backup, retries=2)
    for _ in range(3):
        assert answer(await ask(c)).model == "openai/backup"
    assert len(primary.requests) == 3  # no retry of a refusal
    await ask(c)
    assert len(primary.requests) == 3


async def test_when_every_model_is_skipped_the_call_fails_at_once(
        primary: FailingModel, backup: FailingModel) -> None:
    primary.down = backup.down = "500"
    c = client(primary, backup, failover={"failures": 1})
    with pytest.raises(ModelUnreachable):
        await ask(c)
    asked = len(primary.requests) + len(backup.requests)
    with pytest.raises(ModelUnreachable) as caught:
        await ask(c)
    assert "paused" in caught.value.cause
    assert len(primary.requests) + len(backup.requests) == asked


async def test_a_trial_call_that_is_cancelled_leaves_the_model_to_the_next_call(
        primary: FailingModel, backup: FailingModel) -> None:
    clock = Clock()
    c = client(primary, backup, clock, failover={"failures": 1})
    primary.down = "500"
    await ask(c)
    clock.now += 61
    primary.down = None
    primary.script(Reply(text="a long answer " * 10, chunk_size=2))
    stream = c.stream([{"role": "user", "content": "hi"}], [])
    async for item in stream:
        if isinstance(item, llm.Delta) and item.text:
            break  # the caller went away mid-trial (a cancel)
    await stream.aclose()
    primary.script(Reply(text="tried"))
    assert answer(await ask(c)).model == "openai/fake"


async def test_the_chosen_model_heads_the_chain(primary: FailingModel,
                                                backup: FailingModel) -> None:
    c = client(primary, backup, models=[{"model": "openai/other", "api_base": backup.api_base,
                                         "api_key": "sk-other"}])
    with choosing("other"):
        done = answer(await ask(c))
    assert done.model == "openai/other"
    assert backup.keys == ["sk-other"] and primary.requests == []


# -- no switch once text is on screen, unless the cut is marked ----------------------------

async def test_no_switch_after_visible_text(primary: FailingModel,
                                            backup: FailingModel) -> None:
    primary.script(Reply(text="The first half of an answer that", fault="drop"))
    c = client(primary, backup)
    items: list[llm.StreamItem] = []
    with pytest.raises(ModelStreamCut):
        async for item in c.stream([{"role": "user", "content": "hi"}], []):
            items.append(item)
    assert any(isinstance(i, llm.Delta) and i.text for i in items)
    assert backup.requests == []  # the text on screen is not followed by another model's


async def test_a_switch_after_visible_text_is_marked(primary: FailingModel,
                                                     backup: FailingModel) -> None:
    primary.script(Reply(text="The first half of an answer that", fault="drop"))
    backup.script(Reply(text="A whole answer."))
    c = client(primary, backup, failover={"after_cut": True})
    items = await ask(c)
    restart = next(n for n, i in enumerate(items) if isinstance(i, llm.Restart))
    assert any(isinstance(i, llm.Delta) and i.text for i in items[:restart])
    done = answer(items)
    assert done.text == "A whole answer." and done.model == "openai/backup"
    assert [(u.model, u.cut) for u in done.unavailable] == [("openai/fake", True)]
