"""The local web UI (`roofline ui`) and the CLI documents it and `roofline report` are built from.

`documents` runs a subcommand with `--json` in-process and returns its document, so the
page, the JSON API and the CLI cannot disagree; `app` serves them on 127.0.0.1.
"""
