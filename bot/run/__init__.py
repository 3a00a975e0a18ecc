"""The process: the composition root and its lifecycle.

* `app`: builds the object graph (store, model, tools, prompt, runner, hub) and injects
  the operations (audit log, metrics, budgets) into the core.
* `main`: `tandem run | chat | migrate`: opens the store, starts the hub and the
  platforms' adapters (loaded by name: `bot` has no import of `adapters`), stops on a
  signal.
* `workers`: `tandem run --workers N` supervises N worker processes; `logs`: logging
  setup (text or JSON lines, secrets redacted).

Layer: below `bot.cli`, above every other: it may import all of `bot` but `bot.cli`.
"""
