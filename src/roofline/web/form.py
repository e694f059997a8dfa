"""The UI's input form (plain HTML, GET: the URL holds every input, so results can be shared)."""

from __future__ import annotations

import functools
from collections.abc import Mapping
from pathlib import Path

from roofline.web.documents import has_command, input_actions

TEMPLATE = Path(__file__).with_name("form.html.j2")
# examples offered for the system box (any system `roofline system` reads is accepted)
SYSTEM_EXAMPLES = (
    "tpu-v5p:16x20x28",
    "tpu-v5p:8x16x16",
    "tpu-v5e:16x16",
    "tpu-v6e:16x16",
    "h100:1024",
    "h100:64",
    "h200:256",
    "b200:512",
    "gb200-nvl72:72",
    "a100:512",
)
# the train inputs the form shows, in order (the rest keep their defaults; the URL may set them)
FIELDS = (
    "batch_tokens",
    "seq",
    "tokens",
    "objective",
    "optimizer",
    "chips",
    "plan",
    "top",
    "framework",
    "precision",
    "profile",
)
# the `roofline serve` inputs of the optional serving section (named serve.<input> in the URL)
SERVE_FIELDS = (
    "system",
    "prompt",
    "gen",
    "concurrency",
    "rate",
    "slo_ttft",
    "slo_tpot",
    "weight_dtype",
    "kv_dtype",
    "engine",
)

FORM_CSS = """
form#inputs { background: #fff; border-bottom: 1px solid #d9dde5; padding: 10px 28px 12px; display: grid;
  grid-template-columns: repeat(auto-fill, minmax(190px, 1fr)); gap: 8px 14px; align-items: end; }
form#inputs label { display: flex; flex-direction: column; font-size: 12px; color: #5b6474; gap: 2px; }
form#inputs input, form#inputs select, form#inputs textarea { font: 13px system-ui, sans-serif; padding: 4px 6px;
  border: 1px solid #c4cad4; border-radius: 4px; color: #1d2330; background: #fff; }
form#inputs label.wide { grid-column: span 2; }
form#inputs textarea { font-family: ui-monospace, monospace; font-size: 11px; height: 2.4em; resize: vertical; }
form#inputs button { padding: 6px 18px; font-weight: 600; background: #2f5d9b; color: #fff; border: 0; border-radius: 4px; cursor: pointer; }
form#inputs .brand { grid-column: 1 / -1; font-weight: 700; font-size: 15px; color: #1d2330; }
.error { color: #b3261e; background: #fff; border: 1px solid #e8b4b0; border-radius: 6px; padding: 10px 14px; margin: 16px 28px; }
"""


@functools.cache
def _template():
    import jinja2

    env = jinja2.Environment(
        autoescape=True, trim_blocks=True, lstrip_blocks=True, undefined=jinja2.StrictUndefined
    )
    return env.from_string(TEMPLATE.read_text(encoding="utf-8"))


def _catalog_choices(name: str) -> list[str]:
    """The catalog names the form offers for inputs that also take a file on the command line
    (the stacks, the efficiency profiles); the URL may still name a file."""
    if name == "framework":
        from roofline.specs.framework import framework_names

        return ["auto", *framework_names()]
    if name == "profile":
        from roofline.specs.efficiency import profile_names

        return list(profile_names())
    return []


def _field(command: str, name: str, query: Mapping[str, str], prefix: str = "") -> dict:
    a = input_actions(command)[name]
    key = prefix + name
    return {
        "name": key,
        "id": key.replace(".", "-"),
        "label": name.replace("_", " "),
        "value": query.get(key, query.get(key.replace("_", "-"), "")),
        "placeholder": "" if a.default is None else str(a.default),
        "choices": list(a.choices or []) or _catalog_choices(name),
        "help": (a.help or "").replace("%%", "%"),
    }


def form_html(query: Mapping[str, str], presets: list[str]) -> str:
    """The form, filled with the query's values (blank = the CLI's default)."""
    train = input_actions("train")
    serving = has_command("serve")
    return _template().render(
        presets=presets,
        model=query.get("model") or str(train["model"].default),
        system=query.get("system") or str(train["system"].default),
        systems=SYSTEM_EXAMPLES,
        config=query.get("config", ""),
        fields=[_field("train", n, query) for n in FIELDS if n in train],
        serving=serving,
        serve_on=str(query.get("serve", "")).lower() in ("1", "on", "true", "yes"),
        serve_fields=[
            _field("serve", n, query, "serve.")
            for n in SERVE_FIELDS
            if serving and n in input_actions("serve")
        ],
    )
