"""`roofline models`: the model presets with their sizes."""

from __future__ import annotations

import argparse

from roofline.cli._common import add_json, emit
from roofline.core.ledger import count_params
from roofline.specs.model import ModelSpec
from roofline.specs.model_catalog import load_model, model_names
from roofline.units import fmt_count

NAME = "models"
HELP = "List the model presets: parameters (total, active), layers, d_model, attention kind, MoE."


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_json(p)


def moe_summary(m: ModelSpec) -> str:
    if m.moe is None:
        return "-"
    s = f"{m.moe.n_experts}x top-{m.moe.top_k}"
    if m.moe.n_shared_experts:
        s += f" +{m.moe.n_shared_experts} shared"
    return s


def rows() -> list[dict]:
    out = []
    for name in model_names():
        m = load_model(name)
        pc = count_params(m)
        out.append(
            {
                "name": m.name,
                "params": pc.total,
                "active_params": pc.active,
                "n_layers": m.n_layers,
                "d_model": m.d_model,
                "attention": m.attention.value,
                "n_heads": m.n_heads,
                "n_kv_heads": m.n_kv_heads,
                "moe": None
                if m.moe is None
                else {
                    "n_experts": m.moe.n_experts,
                    "top_k": m.moe.top_k,
                    "n_shared_experts": m.moe.n_shared_experts,
                },
                "published_params": m.published_params,
                "aliases": list(m.aliases),
                "source": m.source,
            }
        )
    return out


def run(args: argparse.Namespace) -> int:
    from roofline.report.table import table

    data = rows()
    text = table(
        [
            [
                r["name"],
                fmt_count(r["params"]),
                fmt_count(r["active_params"]),
                r["n_layers"],
                r["d_model"],
                f"{r['attention']} ({r['n_heads']}q/{r['n_kv_heads']}kv)",
                moe_summary(load_model(r["name"])),
            ]
            for r in data
        ],
        ["name", "params", "active", "layers", "d_model", "attention", "MoE"],
        align="lrrrrll",
    )
    return emit(args, NAME, {}, {"models": data}, text)
