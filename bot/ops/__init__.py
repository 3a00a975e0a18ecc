"""Operations: running Tandem for a team.

* `audit`: the audit log (who asked, who decided, what ran, who was turned away).
* `metrics`: Prometheus counters and histograms of the core's facts.
* `budget`: the daily budgets of a person and of a conversation.

The audit log and the metrics listen to the core's facts (`bot.core.watch`); the budgets
satisfy the turn's `bot.turn.budget.Budget`. `bot.run.app` wires them in: nothing below
this layer imports it.

Layer: below `bot.run`, above `bot.serve`. It may import every layer below (`bot.serve`,
`bot.turn`, `bot.tools`, `bot.media`, `bot.llm`, `bot.store`, `bot.core`).
"""
