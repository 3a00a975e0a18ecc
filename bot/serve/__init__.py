"""Serving conversations: from an `Inbound` handed in by an adapter to a turn run on its
conversation's lane.

* `hub`: the one entry point (`Hub.submit`): the access check (`access`) first, then
  `intake` records the item (dedupe, exactly once) and receives its files.
* `worker`: the lanes (`lanes`; one conversation at a time, batching, out-of-band
  cancel) and what each item does: a turn (`bot.turn.runner`), a press (`approvals`:
  who may decide, the cards' timers), a chat command (`commands`).
* `recovery`: what a restart finds (open items, waiting turns, interrupted calls);
  `scheduler` and `schedule_spec`: scheduled runs; `cluster`: several workers on one
  PostgreSQL database.

Layer: below `bot.ops`, above `bot.turn`. It may import `bot.turn`, `bot.tools`,
`bot.media`, `bot.llm`, `bot.store` and `bot.core`; never `bot.ops`, `bot.run` or
`bot.cli` (budgets reach `/status` through `bot.turn.budget.Budget`).
"""
