"""The who-may table (`bot.serve.permissions`): owners, approvers, DMs and groups."""

from __future__ import annotations

import pytest

from bot.core.events import ConvKey, User
from bot.serve.access import Access
from bot.serve.permissions import GROUP_WIDE, OWNED, Action, may, shared

ANN, BOB, DANA = User("42", "Ann"), User("43", "Bob"), User("44", "Dana")
GROUP, DM = ConvKey("telegram", "-100555"), ConvKey("telegram", "42")
CHANNEL, SLACK_DM = ConvKey("slack", "C1", "1.0"), ConvKey("slack", "D1")
ACCESS = Access(allowed={"telegram": [42, 43], "slack": ["U1"]},
                approvers={"telegram": [44]})


def test_which_conversations_are_shared() -> None:
    assert shared(GROUP) and shared(CHANNEL)
    assert not shared(DM) and not shared(SLACK_DM) and not shared(ConvKey("console", "x"))


@pytest.mark.parametrize("action", sorted(Action))
def test_approvers_may_do_everything_everywhere(action: Action) -> None:
    for conv in (GROUP, DM):
        assert may(ACCESS, DANA, action, conv, owner=ANN.id)


@pytest.mark.parametrize("action", sorted(OWNED))
def test_what_is_ones_own_is_ones_own(action: Action) -> None:
    assert may(ACCESS, ANN, action, GROUP, owner=ANN.id)
    assert not may(ACCESS, BOB, action, GROUP, owner=ANN.id)
    assert not may(ACCESS, BOB, action, GROUP, owner=None)


@pytest.mark.parametrize("action", sorted(GROUP_WIDE))
def test_a_groups_conversation_is_for_approvers_a_dm_for_its_person(action: Action) -> None:
    assert may(ACCESS, ANN, action, DM)
    assert not may(ACCESS, ANN, action, GROUP)
    no_approvers = Access(allowed={"telegram": [42, 43]})
    assert may(no_approvers, ANN, action, GROUP)  # nobody to ask: anyone allowed


@pytest.mark.parametrize("action", [Action.LIFT_BUDGET, Action.AUDIT])
def test_budgets_and_the_audit_log_are_for_approvers_only(action: Action) -> None:
    assert not may(ACCESS, ANN, action, DM, owner=ANN.id)
    assert not may(Access(allowed={"telegram": [42]}), ANN, action, DM)
