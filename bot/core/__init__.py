"""The core's shared vocabulary: the values, settings and leaf helpers every layer uses.

* `events`: what goes in (`Inbound`: a message, a press, a cancel, a scheduled run, a
  command) and what comes out (`Event`), the only types adapters and the core exchange;
  `buttons` packs a button's data.
* `history`: the conversation as immutable values (`Msg`, `ToolCall`, `Media`) and how
  they look on the wire; `images` encodes a picture for the model.
* `config`, `sections`, `ops_config`: the configuration (`Config`), its sections and the
  operations' settings; `errors`: every error Tandem raises and what the user is told.
* `watch`: the facts the core reports (the audit log and the metrics listen);
  `redact`: secrets out of every text kept or sent; `file_modes`: private files.

Layer: the bottom one. It imports nothing else of Tandem: every other package of `bot`
may import it, and it imports none of them (the contracts in `pyproject.toml`,
`[tool.importlinter]`, check this).
"""
