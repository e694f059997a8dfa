"""`roofline validate` prints the held-out (cross-validated) error the README calls the honest
number, read from the profile's [provenance] (issue 22 item 11); a profile without one prints
none and its JSON says null."""

from __future__ import annotations

import json
import tomllib

from roofline.cli import main
from roofline.cli.validate_cmd import held_out
from roofline.specs.efficiency import PROFILE_DIR, load_profile


def _provenance() -> dict:
    with open(PROFILE_DIR / "fitted.toml", "rb") as f:
        return tomllib.load(f)["provenance"]


def test_training_held_out_is_the_shipped_provenance():
    prov = _provenance()
    h = held_out(load_profile("fitted"), "training")
    assert h["runs"] == prov["runs"] and h["runs_file"] == prov["runs_file"]
    assert h["folds"]["by source"] == prov["cv_source_after"]
    assert h["folds"]["by chip family"] == prov["cv_chip_family_after"]


def test_serving_held_out_is_the_shipped_provenance():
    prov = _provenance()["serving"]
    h = held_out(load_profile("fitted"), "serving")
    # the pair-held-out number first (the honest one for a deployment not seen)
    assert list(h["folds"].values()) == [
        prov["all_ttft_held_out_by_model_system_pair"],
        prov["all_ttft_held_out_by_chip_family"],
        prov["all_ttft_held_out_by_engine"],
    ]
    assert h["runs"] == prov["runs"] + prov["latency_runs"]


def test_profiles_without_provenance_and_other_schemas_have_none():
    assert held_out(load_profile("datasheet"), "training") is None
    assert held_out(load_profile("fitted"), "inference") is None


def test_validate_prints_the_held_out_error(capsys):
    cv = _provenance()["cv_source_after"]
    assert main(["validate", "--runs", "training"]) == 0
    out = capsys.readouterr().out
    (line,) = [x for x in out.splitlines() if x.startswith("Held out (the honest number)")]
    assert f"{cv['median_abs']:.1%} by source (bias {cv['bias']:+.1%})" in line
    assert "disaggregated hand-off" not in out  # training output: no serving-only parameter


def test_validate_json_carries_it_and_datasheet_has_none(capsys):
    assert main(["validate", "--runs", "training", "--profile", "datasheet", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["held_out"] is None
