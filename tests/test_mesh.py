"""Meshes: parsing, auto-placement (last axis innermost), explicit placement, segments, errors."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from roofline.core.mesh import Segment, make_mesh
from roofline.errors import PlanError
from roofline.specs.system import parse_system


def placed(mesh, axis: str) -> list[tuple[str, int, int]]:
    return [(s.dim.name, s.size, s.stride) for s in mesh.placement[axis]]


def test_parse_forms_agree() -> None:
    a = make_mesh("tpu-v5e:16x16", {"X": 16, "Y": 16})
    b = make_mesh("tpu-v5e:16x16", "X=16,Y=16")
    c = make_mesh(parse_system("tpu-v5e:16x16"), [("X", 16), ("Y", 16)])
    assert a == b == c
    assert a.axis_names == ("X", "Y") and a.shape == {"X": 16, "Y": 16} and a.n_chips == 256
    assert placed(a, "Y") == [("y", 16, 1)] and placed(a, "X") == [("x", 16, 1)]


def test_last_axis_gets_nvlink() -> None:
    m = make_mesh("h100:1024", {"data": 64, "tensor": 16})
    assert placed(m, "tensor") == [("nvlink", 8, 1), ("leaf", 2, 1)]
    assert placed(m, "data") == [("leaf", 16, 2), ("spine", 4, 1)]
    m = make_mesh("h100:1024", {"data": 128, "tensor": 8})
    assert placed(m, "tensor") == [("nvlink", 8, 1)]
    assert placed(m, "data") == [("leaf", 32, 1), ("spine", 4, 1)]


def test_axis_spans_several_dims_and_split_dims() -> None:
    m = make_mesh("tpu-v5e:16x16", {"X": 8, "Y": 32})
    assert placed(m, "Y") == [("y", 16, 1), ("x", 2, 1)]
    assert placed(m, "X") == [("x", 8, 2)]
    x_seg = m.placement["X"][0]
    assert not x_seg.full and x_seg.ring  # outermost strided factor closes through the wraparound
    assert not m.placement["Y"][1].ring  # the contiguous part of a split ring is an open line
    # a group over both axes sees the whole x ring again
    segs = m.segments(("X", "Y"))
    assert [(s.dim.name, s.size, s.stride, s.full) for s in segs] == [
        ("y", 16, 1, True),
        ("x", 16, 1, True),
    ]
    assert all(s.ring for s in segs)


def test_gcd_split_on_non_dividing_dims() -> None:
    m = make_mesh("tpu-v5p:16x20x28", {"fsdp": 1120, "tensor": 8})
    assert placed(m, "tensor") == [("z", 4, 1), ("y", 2, 1)]
    assert m.size("fsdp") * m.size("tensor") == 8960
    assert math.prod(s.size for s in m.placement["fsdp"]) == 1120


def test_size_one_axes_and_helpers() -> None:
    m = make_mesh("h100:8", {"data": 1, "tensor": 8})
    assert m.placement["data"] == ()
    assert m.size(()) == 1 and m.size("tensor") == 8 and m.size(["data", "tensor"]) == 8
    assert m.axis_size("tensor") == 8
    m2 = make_mesh("tpu-v4p:4x4x4", "X=4,Y=4,Z=4")
    assert m2.resolve_axes("XY") == ("X", "Y") and m2.resolve_axes("X,Z") == ("X", "Z")
    assert m2.size("XYZ") == 64
    assert "X=4@x" in m2.describe()
    assert m2.to_dict()["axes"] == {"X": 4, "Y": 4, "Z": 4}


def test_explicit_placement() -> None:
    m = make_mesh("tpu-v4p:4x4x4", "X=4@z,Y=16@x*y")
    assert placed(m, "X") == [("z", 4, 1)]
    assert placed(m, "Y") == [("y", 4, 1), ("x", 4, 1)]
    m2 = make_mesh("tpu-v4p:4x4x4", {"X": 4, "Y": 16}, placement={"X": "z", "Y": ("x", "y")})
    assert m2 == m
    m3 = make_mesh("tpu-v4p:4x4x4", {"X": 4, "Y": 16}, placement="X@x")
    assert placed(m3, "X") == [("x", 4, 1)] and placed(m3, "Y") == [("z", 4, 1), ("y", 4, 1)]


@pytest.mark.parametrize(
    ("args", "match"),
    [
        (
            ("tpu-v5e:16x16", "X=16,Y=8"),
            r"has 128 devices.*256 chips.*X=32,Y=8",
        ),  # sizes do not multiply
        (("h100:64", {"X": 7, "Y": 8}), r"X=8,Y=8"),
        (("tpu-v5e:16x16", "X=16,Y=16,X=1"), "appears twice"),
        (("tpu-v5e:16x16", "X=0,Y=16"), "positive"),
        (("tpu-v5e:16x16", "X16"), "cannot read mesh axis"),
        (("tpu-v5e:16x16", {"1X": 256}), "identifiers"),
        (("tpu-v4p:4x4x4", "X=8@z,Y=8"), "cannot be placed"),
        (("tpu-v4p:4x4x4", "X=4@w,Y=16"), "does not have"),
        (("tpu-v4p:4x4x4", {"X": 64}, {"Q": "x"}), "does not have"),
    ],
)
def test_errors(args, match) -> None:
    with pytest.raises(PlanError, match=match):
        make_mesh(*args)


def test_unknown_axis() -> None:
    m = make_mesh("h100:8", "X=8")
    with pytest.raises(PlanError, match="not in the mesh"):
        m.size("Q")
    with pytest.raises(PlanError, match="not in the mesh"):
        m.segments(("X", "Q"))
    with pytest.raises(PlanError, match="repeat"):
        m.resolve_axes(("X", "X"))


SPECS = [
    "tpu-v5e:16x16",
    "tpu-v5e:8x16",
    "tpu-v4p:4x4x8",
    "tpu-v5p:8x12x16",
    "h100:1024",
    "h100:96",
    "2xtpu-v5e:16x16",
    "gb200-nvl72:576",
]


@st.composite
def meshes(draw):
    system = parse_system(draw(st.sampled_from(SPECS)))
    n = system.n_chips
    sizes = []
    for _ in range(draw(st.integers(1, 3)) - 1):
        divs = [d for d in range(1, n + 1) if n % d == 0]
        d = draw(st.sampled_from(divs))
        sizes.append(d)
        n //= d
    sizes.append(n)
    return make_mesh(system, {f"a{i}": s for i, s in enumerate(sizes)})


@settings(max_examples=60, deadline=None)
@given(meshes())
def test_auto_placement_covers_every_chip_exactly(mesh) -> None:
    used: dict[str, list[Segment]] = {}
    for name, size in mesh.axes:
        segs = mesh.placement[name]
        assert math.prod(s.size for s in segs) == size
        for s in segs:
            used.setdefault(s.dim.name, []).append(s)
    for d in mesh.system.dims:
        segs = sorted(used.get(d.name, []), key=lambda s: s.stride)
        assert math.prod(s.size for s in segs) == d.size
        stride = 1
        for s in segs:  # factors of a dim are consumed as a mixed-radix sequence
            assert s.stride == stride
            stride *= s.size
    whole = mesh.segments(mesh.axis_names)
    assert [(s.dim.name, s.size) for s in whole] == [
        (d.name, d.size) for d in reversed(mesh.system.dims)
    ]
