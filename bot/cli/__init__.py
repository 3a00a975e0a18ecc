"""The `tandem` command line (`cli.main`, also `python -m bot`).

* `cli`: the argument parser and the commands (`run`, `chat`, `doctor`, `init`,
  `migrate`, `audit`, `slack-manifest`); heavy imports happen inside the commands, so
  `tandem --help` stays instant.
* `init_wizard` and `init_files`: `tandem init` (the questions, then `config.yaml` and
  `.env`); `doctor`: `tandem doctor`; `audit_cli`: `tandem audit`.

Layer: the top one. It may import every other package of `bot`; none imports it.
"""
