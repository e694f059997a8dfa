"""The loaders' caches (issue 21 item 2-3): a file is parsed once while its text is unchanged,
parsed again as soon as it (or a base it names) changes, and the top-level help lists every
command without importing them."""

from __future__ import annotations

import sys

import pytest

from roofline.cli import COMMANDS, build_parser
from roofline.errors import SpecError
from roofline.specs import filecache
from roofline.specs.efficiency import load_efficiency, load_profile
from roofline.specs.engines import ENGINE_DIR, load_engine
from roofline.specs.framework import FRAMEWORK_DIR, load_framework


def _profile(matmul: float, base: str | None = None) -> str:
    head = f'base = "{base}"\n' if base else ""
    return head + f'name = "p"\nmatmul = {matmul}\nhbm = 0.9\nlink = 0.8\n'


def test_profile_parsed_once_while_unchanged(tmp_path):
    p = tmp_path / "p.toml"
    p.write_text(_profile(0.5))
    first = load_efficiency(p)
    assert load_efficiency(p) is first  # the same record: no second parse
    assert first.matmul == 0.5


def test_profile_rewritten_is_parsed_again(tmp_path):
    p = tmp_path / "p.toml"
    p.write_text(_profile(0.5))
    assert load_efficiency(p).matmul == 0.5
    p.write_text(_profile(0.6))  # same size, same timestamp tick: the text decides
    assert load_efficiency(p).matmul == 0.6


def test_base_rewritten_reparses_the_profile_on_top(tmp_path):
    base = tmp_path / "base.toml"
    base.write_text(_profile(0.5) + "step_overhead_s = 0.01\n")
    top = tmp_path / "top.toml"
    top.write_text('base = "base.toml"\nname = "top"\nmatmul = 0.7\n')
    assert load_efficiency(top).step_overhead_s == 0.01
    base.write_text(_profile(0.5) + "step_overhead_s = 0.02\n")
    assert load_efficiency(top).step_overhead_s == 0.02


def test_removed_file_raises_as_uncached(tmp_path):
    p = tmp_path / "p.toml"
    p.write_text(_profile(0.5))
    load_efficiency(p)
    p.unlink()
    with pytest.raises(SpecError):
        load_efficiency(p)


def test_bad_file_is_not_cached(tmp_path):
    p = tmp_path / "p.toml"
    p.write_text(_profile(1.5))  # out of (0, 1]
    with pytest.raises(SpecError):
        load_efficiency(p)
    p.write_text(_profile(0.5))
    assert load_efficiency(p).matmul == 0.5


def test_catalog_profile_is_one_record():
    assert load_profile("fitted") is load_profile("fitted")
    assert load_profile("fitted").for_framework("megatron") is load_profile("fitted").for_framework(
        "megatron"
    )


def test_framework_and_engine_files_cached_by_text(tmp_path):
    fw = tmp_path / "fw.toml"
    fw.write_text((FRAMEWORK_DIR / "megatron.toml").read_text())
    assert load_framework(fw) is load_framework(fw)
    eng = tmp_path / "eng.toml"
    text = (ENGINE_DIR / "vllm.toml").read_text()
    eng.write_text(text)
    first = load_engine(str(eng))
    assert load_engine(str(eng)) is first
    eng.write_text(text + "\n# edited\n")
    assert load_engine(str(eng)) is not first


def test_clear_forgets(tmp_path):
    p = tmp_path / "p.toml"
    p.write_text(_profile(0.5))
    first = load_efficiency(p)
    filecache.clear()
    assert load_efficiency(p) is not first


def test_listing_matches_the_full_parser():
    """The top-level help read from the modules' sources is the one the imported modules give."""
    listed = build_parser(listing=True).format_help()
    assert listed == build_parser().format_help()
    for name in COMMANDS:
        assert name in listed


def test_listing_imports_no_command(monkeypatch):
    for name in COMMANDS:
        monkeypatch.delitem(sys.modules, f"roofline.cli.{name}_cmd", raising=False)
    build_parser(listing=True)
    assert not [n for n in COMMANDS if f"roofline.cli.{n}_cmd" in sys.modules]


def test_vega_bundle_kept_on_disk(tmp_path, monkeypatch):
    vl_convert = pytest.importorskip("vl_convert")
    from roofline.report import page_html

    monkeypatch.setenv("ROOFLINE_CACHE_DIR", str(tmp_path))
    calls = []
    monkeypatch.setattr(vl_convert, "javascript_bundle", lambda: calls.append(1) or "JS")
    build = page_html.vega_bundle.__wrapped__  # the per-process cache aside
    assert build() == "JS" and calls == [1]
    path = page_html.bundle_cache_path(getattr(vl_convert, "__version__", "unknown"))
    assert path.parent == tmp_path and path.read_text() == "JS"
    assert build() == "JS" and calls == [1]  # read back, not rebuilt


def test_vega_bundle_unwritable_cache_rebuilds(tmp_path, monkeypatch):
    vl_convert = pytest.importorskip("vl_convert")
    from roofline.report import page_html

    blocker = tmp_path / "file"
    blocker.write_text("")
    monkeypatch.setenv("ROOFLINE_CACHE_DIR", str(blocker / "sub"))  # under a file: unwritable
    monkeypatch.setattr(vl_convert, "javascript_bundle", lambda: "JS")
    assert page_html.vega_bundle.__wrapped__() == "JS"
