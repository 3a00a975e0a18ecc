"""Sequences the lifecycle state machines found under the deep Hypothesis profile, replayed
as plain tests (each keeps the machine's invariants between its steps)."""

from __future__ import annotations

from tests.bot.test_lifecycle_stateful import SteerMachine


def checked(state: SteerMachine) -> None:
    state.approvals_are_resolved_once()
    state.calls_are_answered_once()
    state.events_are_about_stored_turns()
    state.one_unfinished_turn_per_conversation()
    state.the_model_accepts_every_history()


def test_new_ends_the_waiting_card_and_answers_the_message_that_waited_for_it() -> None:
    """Found by the deep profile (seed 1156190044): a message sent while the model was
    still thinking waits for the card that turn shows; `/new` ends that turn and closes
    its card, and the message is answered then, in the new session (its card is live)."""
    state = SteerMachine()
    try:
        checked(state)
        state.step_then_say(calls=[("shell", 0, False)], text="hello")
        checked(state)
        state.step_then_say(calls=[("shell", 0, False)], text="hello")
        checked(state)
        state.say_while_thinking(calls=[("shell", 0, False)], text="hello")
        checked(state)
        state.new_session()
    finally:
        state.teardown()
