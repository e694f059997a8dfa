"""Hypothesis strategies over the inputs people type: names, numbers with suffixes, system
specs, op expressions and einsums, plans, and generated spec files (model/chip/system TOML,
efficiency TOML, HF config.json). Each mixes valid values (so the deep paths run) with near
misses and garbage (so the edges are tried)."""

from __future__ import annotations

import functools
import json
import re
from pathlib import Path

from hypothesis import strategies as st

from roofline.specs.chip import load_chip
from roofline.specs.model_catalog import load_model, model_names
from roofline.units import DTYPE_BYTES

HF_DIR = Path(__file__).parents[1] / "data" / "hf"

CHIPS = ["h100", "a100", "tpu-v5e", "tpu-v5p", "v100", "b200", "gb200", "gb300", "mi300x", "h20"]
CHIP_ALIASES = ["v5e", "H100 SXM", "ironwood", "a100-40gb", "b300", "mi355x", "h800", "tpu-v4p"]
GPU_CHIPS = ["h100", "a100", "b200", "gb200", "gb300", "mi300x", "h800", "v100", "b300"]
TPU_CHIPS = ["tpu-v5e", "tpu-v5p", "tpu-v4p", "tpu-v6e", "tpu-7x", "tpu-v3"]
SMALL_MODELS = ["tiny-llama", "book-tf-q1", "llama-3-8b", "mixtral-8x7b", "gemma-2-9b"]
DTYPES = sorted(DTYPE_BYTES) + ["bfloat16", "e4m3", "NVFP4"]

_garbage = st.text(
    alphabet=st.characters(codec="utf-8", exclude_categories=("Cs",)), min_size=0, max_size=12
)
_ascii = st.text(alphabet="abcdefghijklmnopqrstuvwxyz0123456789-_.:+x/ ", min_size=0, max_size=16)

# numbers as typed on a command line: plain, suffixed, scientific, and the classic bad ones
_SPECIAL_NUMBERS = [
    "0", "-1", "-0", "1", "2", "nan", "NaN", "inf", "-inf", "1e308", "1e-308", "1e30", "1e9",
    "0.5", "1.5", "1_000", "4k", "16Mi", "15T", "2.5e6", "1e", "abc", "", " ", "1,024", "0x10",
    "9" * 40, "1e-9", "7.999999", "65536",
]  # fmt: skip


def mostly(good: st.SearchStrategy, bad: st.SearchStrategy, bad_in: int = 5):
    """`good` most of the time, `bad` about once in `bad_in` draws."""
    # sampled_from draws near-uniformly (st.integers favours its bounds, so 0 would be frequent)
    return st.sampled_from(range(bad_in)).flatmap(lambda i: bad if i == bad_in - 1 else good)


def number_text(lo: int = 0, hi: int = 10**7) -> st.SearchStrategy[str]:
    """A numeric flag value: mostly sensible integers, sometimes floats, suffixes or garbage."""
    good = st.one_of(
        st.integers(min_value=max(lo, 1), max_value=max(min(hi, 4096), 1)).map(str),
        st.integers(min_value=max(lo, 1), max_value=max(hi, 1)).map(str),
        st.integers(min_value=1, max_value=64).map(lambda n: f"{n}{'k' if n % 2 else 'Mi'}"),
    )
    bad = st.one_of(
        st.floats(allow_nan=True, allow_infinity=True, width=64).map(repr),
        st.sampled_from(_SPECIAL_NUMBERS),
    )
    return mostly(good, bad, 4)


def name_of(valid: list[str]) -> st.SearchStrategy[str]:
    """A catalog name, an alias-like variant, a near miss or garbage (rarely over-long)."""
    bad = st.one_of(
        st.sampled_from(valid).map(lambda s: s[:-1]),
        _ascii,
        _garbage,
        st.just("x" * 300),
    )
    good = st.one_of(st.sampled_from(valid), st.sampled_from(valid).map(str.upper))
    return mostly(good, bad, 5)


def good_system() -> st.SearchStrategy[str]:
    gpu = st.builds(
        lambda c, n: f"{c}:{n}",
        st.sampled_from(GPU_CHIPS),
        st.sampled_from([1, 2, 4, 8, 16, 64, 72, 128, 144, 256, 1024]),
    )
    tpu = st.sampled_from(
        ["tpu-v5e:4x4", "tpu-v5e:16x16", "tpu-v5p:4x4x4", "2xtpu-v5p:4x4x8", "tpu-v4p:8x8x8"]
    )
    return st.one_of(gpu, tpu)


@st.composite
def system_spec(draw) -> str:
    """`chip:N`, `tpu:AxBxC`, `Kxtpu:...`, `+sharp`, or broken versions of them."""
    kind = draw(st.integers(0, 6))
    if kind == 0:
        return f"{draw(st.sampled_from(GPU_CHIPS))}:{draw(number_text(0, 300_000))}"
    if kind == 1:
        c = draw(st.sampled_from(GPU_CHIPS))
        n = draw(st.sampled_from([1, 2, 4, 8, 16, 64, 72, 100, 144, 256, 576, 1000, 1024, 4096]))
        return f"{c}:{n}" + draw(st.sampled_from(["", "+sharp", "+turbo", " + sharp"]))
    if kind in (2, 3):
        axes = draw(st.lists(st.integers(0, 40), min_size=1, max_size=4))
        topo = "x".join(map(str, axes))
        prefix = draw(st.sampled_from(["", "", "2x", "0x", "4096x", "99999x"]))
        return f"{prefix}{draw(st.sampled_from(TPU_CHIPS))}:{topo}"
    if kind == 4:
        return draw(st.sampled_from(TPU_CHIPS + GPU_CHIPS + ["gb200-nvl72", "h100-nvl16"]))
    if kind == 5:
        return draw(st.sampled_from(GPU_CHIPS + TPU_CHIPS)) + ":" + draw(_ascii)
    return draw(st.one_of(_ascii, _garbage))


_DIMS = list("BDFTNHKSE") + ["X", "Y", "batch", "d_1"]


@st.composite
def op_expr(draw) -> tuple[str, str]:
    """(expression, --dims) for `roofline op`, sometimes malformed."""
    if draw(st.integers(0, 9)) == 0:
        return draw(_garbage), draw(_ascii)
    lhs = draw(st.lists(st.sampled_from(_DIMS), min_size=0, max_size=3))
    rhs = draw(st.lists(st.sampled_from(_DIMS), min_size=0, max_size=3))
    dt = mostly(st.sampled_from(DTYPES), st.sampled_from(["bf17", "", "int3"]), 8)
    op = draw(mostly(st.sampled_from(["@", "·", "*"]), st.just("+"), 10))
    expr = f"{draw(dt)}[{','.join(lhs)}] {op} {draw(dt)}[{','.join(rhs)}]"
    if draw(st.booleans()):
        out = draw(st.lists(st.sampled_from(_DIMS), max_size=3))
        expr += f" -> {draw(dt)}[{','.join(out)}]"
    dims = sorted(set(lhs + rhs))
    size = mostly(st.integers(1, 1 << 16).map(str), number_text(0, 1 << 20), 10)
    sizes = ",".join(f"{d}={draw(size)}" for d in dims)
    if draw(st.integers(0, 5)) == 0:
        sizes += "," + draw(_ascii)
    return expr, sizes


@st.composite
def einsum_case(draw) -> list[str]:
    """`roofline matmul` arguments: book notation with mesh subscripts, dims, mesh, system."""
    legal = st.sampled_from(
        [("_X", "", "_Y"), ("", "_X", "_Y"), ("_X", "_Y", ""), ("", "", "_X"), ("_XY", "", ""),
         ("", "_XY", ""), ("_X", "", ""), ("", "", ""), ("_Y", "_X", "")]
    )  # fmt: skip
    anything = st.tuples(*[st.sampled_from(["", "_X", "_Y", "_XY"])] * 3)
    b, d, f = draw(mostly(legal, anything, 4))
    expr = draw(
        mostly(
            st.sampled_from(
                [
                    f"In[B{b}, D{d}] * W[D{d}, F{f}] -> Out[B{b}, F{f}]",
                    f"In[B{b}, D{d}] * W[D{d}, F{f}]",
                ]
            ),
            st.one_of(_ascii, _garbage),
            6,
        )
    )
    size = mostly(
        st.sampled_from([256, 1024, 4096, 8192, 16384]).map(str), number_text(0, 1 << 16), 6
    )
    dims = f"B={draw(size)},D={draw(size)},F={draw(size)}"
    good = st.sampled_from(
        [
            ("tpu-v5e:4x2", "X=4,Y=2"),
            ("h100:8", "X=8"),
            ("h100:8", "X=2,Y=4"),
            ("tpu-v5e:2x2", "X=2,Y=2"),
            ("tpu-v5e:16x16", "X=16,Y=16"),
            ("h100:64", "X=8,Y=8"),
        ]
    )
    bad = st.sampled_from(
        [("h100:8", "X=0"), ("tpu-v5e:2x2", "X=3,Y=3"), ("h100:8", ""), ("h100:8", "Y=8")]
    )
    system, mesh = draw(mostly(good, bad, 5))
    return [expr, "--dims", dims, "--mesh", mesh, "--system", system]


# -- generated files ---------------------------------------------------------------------------

_WRONG_VALUES = st.one_of(
    st.integers(min_value=-(10**15), max_value=10**15),
    st.sampled_from([0, -1, 1, 10**12, 2**63 - 1]),
    st.floats(allow_nan=True, allow_infinity=True),
    st.booleans(),
    st.text(max_size=8),
    st.lists(st.integers(0, 4), max_size=3),
    st.just({}),
)


def _toml_value(v) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, float):
        return {"nan": "nan", "inf": "inf", "-inf": "-inf"}.get(repr(v), repr(v))
    if isinstance(v, str):
        return json.dumps(v)
    if isinstance(v, dict):
        return "{}"
    if isinstance(v, list):
        return "[" + ", ".join(_toml_value(x) for x in v) + "]"
    return str(v)


def _toml(table: dict, subtables: dict[str, dict]) -> str:
    lines = [f"{k} = {_toml_value(v)}" for k, v in table.items()]
    for name, sub in subtables.items():
        lines.append(f"[{name}]")
        lines += [f"{k} = {_toml_value(v)}" for k, v in sub.items()]
    return "\n".join(lines) + "\n"


def _model_table(name: str) -> tuple[dict, dict[str, dict]]:
    m = load_model(name).to_dict()
    skip = {"attention", "moe", "mla", "aliases", "published_params", "published_active_params"}
    top = {k: v for k, v in m.items() if k not in skip and v is not None}
    subs = {
        k: {kk: vv for kk, vv in m[k].items() if vv is not None} for k in ("moe", "mla") if m[k]
    }
    return top, subs


@st.composite
def model_toml(draw) -> str:
    """A model TOML: a preset's fields with a few keys mutated, dropped or added."""
    top, subs = _model_table(
        draw(st.sampled_from(["tiny-llama", "mixtral-8x7b", "deepseek-v3", "gemma-2-9b"]))
    )
    for _ in range(draw(st.integers(0, 3))):
        where = draw(st.sampled_from(["top"] + list(subs)))
        table = top if where == "top" else subs[where]
        key = draw(st.sampled_from(sorted(table) + ["moe", "mla", "bogus_key"]))
        action = draw(st.integers(0, 3))
        if action == 0:
            table.pop(key, None)
        elif key in ("moe", "mla") and where == "top":
            top[key] = draw(_WRONG_VALUES)
        else:
            table[key] = draw(_WRONG_VALUES)
    subs = {k: v for k, v in subs.items() if k not in top}
    return _toml(top, subs)


@st.composite
def hf_json(draw) -> str:
    """A config.json fixture with fields mutated, dropped or replaced by odd JSON values."""
    files = sorted(p.name for p in HF_DIR.glob("*.json"))
    d = json.loads((HF_DIR / draw(st.sampled_from(files))).read_text())
    for _ in range(draw(st.integers(0, 3))):
        key = draw(
            st.sampled_from(sorted(d) + ["model_type", "num_hidden_layers", "num_attention_heads"])
        )
        action = draw(st.integers(0, 3))
        if action == 0:
            d.pop(key, None)
        else:
            v = draw(_WRONG_VALUES)
            d[key] = None if isinstance(v, float) and v != v else v
    if draw(st.integers(0, 20)) == 0:
        return draw(
            st.sampled_from(["[]", "{", "null", '"x"', "1", json.dumps({"model_type": []})])
        )
    return json.dumps(d, allow_nan=True)


_CHIP_TOML = """\
name = "fuzz-chip"
vendor = "nvidia"
generation = "test"
hbm_bytes = 80e9
hbm_bw_bytes_per_s = 3e12
nvlink_bw_bytes_per_s = 4.5e11
nvlink_domain = 8
node_egress_bytes_per_s = 4e11
usd_per_hour = 2.0
"""


@st.composite
def chip_toml(draw) -> str:
    top = {}
    for line in _CHIP_TOML.splitlines():
        k, v = (s.strip() for s in line.split("=", 1))
        top[k] = (
            json.loads(v) if v.startswith('"') else float(v) if "e" in v or "." in v else int(v)
        )
    peaks: dict = {"bf16": 1e15, "fp8": 2e15}
    for _ in range(draw(st.integers(0, 3))):
        key = draw(
            st.sampled_from(
                sorted(top) + ["aliases", "ici_axes", "pod_topology", "gpus_per_tray", "base"]
            )
        )
        if draw(st.integers(0, 4)) == 0:
            top.pop(key, None)
        else:
            top[key] = draw(_WRONG_VALUES)
    if draw(st.booleans()):
        peaks[draw(st.sampled_from(["bf16", "fp8", "nvfp4", "int8", "bogus"]))] = draw(
            _WRONG_VALUES
        )
    return _toml(top, {"peak_flops_per_s": peaks})


@st.composite
def system_toml(draw) -> str:
    if draw(st.booleans()):
        top = {"name": "fuzz", "base": draw(system_spec())}
        if draw(st.booleans()):
            top[
                draw(
                    st.sampled_from(["usd_per_chip_hour", "sharp", "nodes_per_leaf", "wraparound"])
                )
            ] = draw(_WRONG_VALUES)
        tier = (
            {draw(st.sampled_from(["spine", "leaf", "nvlink", "x"])): draw(_WRONG_VALUES)}
            if draw(st.booleans())
            else {}
        )
        return _toml(top, {"tier_bw": tier} if tier else {})
    dims = []
    for name, kind in (("leaf", "scaleout"), ("nvlink", "nvlink")):
        dim = {
            "name": name,
            "kind": kind,
            "size": draw(st.sampled_from([1, 2, 8])),
            "bw_bytes_per_s": 5e10,
        }
        if draw(st.booleans()):
            dim[
                draw(
                    st.sampled_from(
                        ["size", "bw_bytes_per_s", "kind", "hop_latency_s", "wraparound", "extra"]
                    )
                )
            ] = draw(_WRONG_VALUES)
        dims.append(dim)
    head = _toml({"name": "fuzz", "chip": draw(st.sampled_from(["h100", "mi300x", "nope"]))}, {})
    body = "".join(
        "\n[[dims]]\n" + "\n".join(f"{k} = {_toml_value(v)}" for k, v in d.items()) + "\n"
        for d in dims
    )
    return head + body


@st.composite
def efficiency_toml(draw) -> str:
    table = {"name": "fuzz", "matmul": 0.5, "hbm": 0.8, "link": 0.7}
    for _ in range(draw(st.integers(0, 2))):
        table[draw(st.sampled_from(sorted(table) + ["bogus"]))] = draw(_WRONG_VALUES)
    return _toml(table, {})


def raw_bytes() -> st.SearchStrategy[bytes]:
    """Not-a-spec files: UTF-16, binary, empty."""
    return st.one_of(
        st.just(b"\xff\xfe"),
        st.just("name = 'x'".encode("utf-16")),
        st.binary(max_size=64),
        st.just(b""),
    )


def all_model_names() -> list[str]:
    return model_names()


def chip_alias_list() -> list[str]:
    out = []
    for c in CHIPS:
        out += [c, *load_chip(c).aliases[:1]]
    return out


# -- measured-run files (validate) -------------------------------------------------------------

_RUNS_DIR = Path(__file__).parents[2] / "src" / "roofline" / "validate"


@functools.cache
def _runs(name: str) -> list:
    import yaml

    return yaml.safe_load((_RUNS_DIR / name).read_text())


def _mutate_nested(draw, node, depth: int = 0):
    """Replace, drop or keep values anywhere in a run record."""
    if isinstance(node, dict) and node:
        out = dict(node)
        for _ in range(draw(st.integers(0, 2))):
            if not out:
                break
            key = draw(st.sampled_from(sorted(out, key=str)))
            action = draw(st.integers(0, 3))
            if action == 0:
                out.pop(key)
            elif action == 1 and depth < 3:
                out[key] = _mutate_nested(draw, out[key], depth + 1)
            else:
                out[key] = draw(_WRONG_VALUES)
        return out
    return draw(_WRONG_VALUES) if draw(st.booleans()) else node


@st.composite
def runs_yaml(draw) -> str:
    import yaml

    name = draw(st.sampled_from(["measured_training.yaml", "measured_inference.yaml"]))
    runs = _runs(name)
    picked = [
        runs[i] for i in draw(st.lists(st.integers(0, len(runs) - 1), min_size=1, max_size=2))
    ]
    picked = [_mutate_nested(draw, r) for r in picked]
    if draw(st.integers(0, 9)) == 0:
        return draw(st.sampled_from(["", "{", "- 1\n- 2\n", "a: [", "runs: 5\n", "\t\tx"]))
    return yaml.safe_dump(picked, allow_unicode=True)


# -- file kinds: huge, special, non-UTF-8, deep nesting, numbers of thousands of digits ---------

HUGE_DIGITS = "9" * 5000  # past Python's 4,300-digit int-conversion limit


def nasty_content() -> st.SearchStrategy[str | bytes]:
    """What a file given as any input may hold: not text, nested past any parser's stack,
    numbers no int() converts, or lengths/CSV rows with absurd values."""
    deep = st.sampled_from(
        ["[" * 5000, "{" * 5000, "- " * 5000 + "1", "a = " + "[" * 5000, '{"a":' * 5000 + "1"]
    )
    huge = st.sampled_from(
        [
            f"hidden_size = {HUGE_DIGITS}\n",
            f'{{"hidden_size": {HUGE_DIGITS}, "model_type": "llama"}}',
            f"- id: x\n  hardware:\n    chips: {HUGE_DIGITS}\n",
            "- id: x\n  parallelism:\n    microbatch: 1e308\n",
            f"1024,{HUGE_DIGITS}\n",
            f"{HUGE_DIGITS},1\n",
            "1e308,1e308\n",
            "nan,nan\n",
            "-1,5\n0,0\n",
        ]
    )
    not_text = st.sampled_from([b"1024,256\n\xc3\x28\n", b"\x00" * 64, b"\xef\xbb\xbf1024,256\n"])
    return st.one_of(deep, huge, not_text, raw_bytes(), lengths_csv())


@st.composite
def lengths_csv(draw) -> str:
    """A `serve --lengths` file: a header sometimes, rows of prompt,output, some of them bad."""
    row = mostly(
        st.tuples(st.integers(1, 1 << 15), st.integers(1, 1 << 12)).map(lambda t: f"{t[0]},{t[1]}"),
        st.one_of(_ascii, st.tuples(number_text(), number_text()).map(",".join)),
        8,
    )
    rows = draw(st.lists(row, min_size=0, max_size=6))
    head = draw(st.sampled_from(["", "prompt,output\n", "# comment\n"]))
    return head + "\n".join(rows) + "\n"


# -- launch files (import): every stack's files, mutated, and malformed ones ---------------------

LAUNCH_DIR = Path(__file__).parents[1] / "data" / "launch"
_NUMBER = re.compile(r"(?<![\w.])-?\d+(\.\d+)?(e[+-]?\d+)?(?![\w.])", re.I)
_VALUE = re.compile(r"(=|:)\s*([^\s,#]+)")


@functools.cache
def launch_files() -> list[Path]:
    """tests/data/launch/ and its serving/ folders: every stack's launch files."""
    keep = {".toml", ".yaml", ".json", ".sh", ".slurm"}
    files = [p for p in LAUNCH_DIR.rglob("*") if p.suffix in keep and p.stem != "MANIFEST"]
    return sorted(files)


def _mutate_line(draw, text: str) -> str:
    """One edit: a number or a value replaced, a line dropped or doubled, the file cut."""
    lines = text.splitlines()
    if not lines:
        return text
    i = draw(st.integers(0, len(lines) - 1))
    action = draw(st.integers(0, 5))
    line = lines[i]
    numbers = list(_NUMBER.finditer(line))
    values = list(_VALUE.finditer(line))
    wrong = st.one_of(st.sampled_from(_SPECIAL_NUMBERS + [HUGE_DIGITS]), _ascii)
    if action <= 1 and numbers:
        m = draw(st.sampled_from(numbers))
        lines[i] = line[: m.start()] + draw(wrong) + line[m.end() :]
    elif action == 2 and values:
        m = draw(st.sampled_from(values))
        lines[i] = line[: m.start(2)] + draw(st.one_of(wrong, _garbage)) + line[m.end(2) :]
    elif action == 3:
        del lines[i]
    elif action == 4:
        lines.insert(i, line)
    else:
        return text[: draw(st.integers(0, len(text)))]
    return "\n".join(lines) + "\n"


@st.composite
def launch_file(draw) -> tuple[str, str]:
    """(content, suffix): a launch file of any stack with 0-3 edits, or a malformed one."""
    training = [p for p in launch_files() if "serving" not in p.parts]
    path = draw(mostly(st.sampled_from(training), st.sampled_from(launch_files()), 3))
    if draw(st.integers(0, 7)) == 7:
        bad = st.sampled_from(["", "[parallelism]\n", "{}", "-1", "vllm serve\n", "python\n"])
        return draw(st.one_of(bad, nasty_content())), path.suffix
    text = path.read_text()
    for _ in range(draw(st.sampled_from([0, 0, 1, 1, 2, 3]))):
        text = _mutate_line(draw, text)
    return text, path.suffix
