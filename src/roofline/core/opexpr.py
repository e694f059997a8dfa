"""Op expressions: `"bf16[B,D] @ int8[D,F]"` plus sizes -> one ledger `Op`.

The book writes a matmul as `X bf16[B,D] · Y bf16[D,F] -> Z bf16[B,F]` (roofline.md);
this module reads that notation (and einsum-like versions with more dims, e.g.
`bf16[B,T,D] @ bf16[D,N,H]`) into an `Op` of kind MATMUL so the roofline functions can
price it. Grammar::

    expr    := operand OP operand [ ("->" | "→") operand ]
    operand := [ NAME ":" ] DTYPE "[" [ DIM { "," DIM } ] "]"
    OP      := "@" | "·" | "*" | "×"

Rules (book transformers.md, "general contraction"): dims shared by both operands and
absent from the output are contracted; shared dims kept in the output are batch dims.
The default output is the lhs's non-contracted dims then the rhs's, in the lhs
(activation) dtype. The rhs is the weight (`is_param`), so critical-batch arithmetic
treats the lhs's free dims as the token batch.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType

from roofline.core.ledger import Op, OpKind, Tensor
from roofline.errors import SpecError
from roofline.units import DTYPE_BYTES, parse_dtype, parse_quantity

_EXAMPLE = '"bf16[B,D] @ int8[D,F]" with --dims B=256,D=8192,F=32768'
_GRAMMAR = (
    "an op is `dtype[dims] @ dtype[dims]` with an optional `-> dtype[dims]`; dims are names "
    "(letters, digits, _) separated by commas; an operand may be named as `X:bf16[B,D]`"
)
_OPERATORS = ("@", "·", "×", "*")
_ARROWS = ("->", "→")
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_WS = re.compile(r"\s*")


@dataclass(frozen=True)
class OpExpr:
    """A parsed expression, before sizes: operands, output and the dims' roles."""

    text: str
    lhs: Tensor
    rhs: Tensor
    out: Tensor
    contracting: tuple[str, ...]  # shared, absent from the output
    batch: tuple[str, ...]  # shared, kept in the output

    @property
    def dims(self) -> tuple[str, ...]:
        seen: list[str] = []
        for t in (self.lhs, self.rhs, self.out):
            seen += [d for d in t.dims if d not in seen]
        return tuple(seen)

    def __str__(self) -> str:
        return f"{_operand(self.lhs)} · {_operand(self.rhs)} -> {_operand(self.out)}"


def _operand(t: Tensor) -> str:
    return f"{t.name} {t.dtype}[{','.join(t.dims)}]"


def _malformed(text: str, pos: int, detail: str) -> SpecError:
    return SpecError(
        f"cannot read op expression {text!r} at character {pos + 1} ({detail})",
        rule=_GRAMMAR,
        fix=f"write e.g. {_EXAMPLE}",
    )


class _Scanner:
    def __init__(self, text: str) -> None:
        self.text, self.pos = text, 0

    def ws(self) -> None:
        self.pos = _WS.match(self.text, self.pos).end()  # type: ignore[union-attr]

    def name(self, what: str) -> str:
        self.ws()
        m = _NAME.match(self.text, self.pos)
        if not m:
            got = self.text[self.pos : self.pos + 1] or "end of text"
            raise _malformed(self.text, self.pos, f"expected {what}, found {got!r}")
        self.pos = m.end()
        return m.group(0)

    def take(self, *tokens: str) -> str | None:
        self.ws()
        for tok in tokens:
            if self.text.startswith(tok, self.pos):
                self.pos += len(tok)
                return tok
        return None

    def expect(self, token: str, what: str) -> None:
        if self.take(token) is None:
            got = self.text[self.pos : self.pos + 1] or "end of text"
            raise _malformed(self.text, self.pos, f"expected {what}, found {got!r}")

    def operand(self, default_name: str, is_param: bool) -> Tensor:
        first = self.name("a dtype such as bf16")
        name = default_name
        if self.take(":"):
            name, dtype_text = first, self.name("a dtype such as bf16")
        else:
            dtype_text = first
        dtype = _dtype(dtype_text, self.text)
        self.expect("[", "'[' opening the dims")
        dims: list[str] = []
        if not self.take("]"):
            while True:
                start = self.pos
                self.ws()
                if re.match(r"\d", self.text[self.pos : self.pos + 1]):
                    raise SpecError(
                        f"op expression {self.text!r} uses a number as a dim name at character {self.pos + 1}",
                        rule="dims are names so that shared dims can be matched; sizes come separately",
                        fix="name the dim (e.g. D) and give its size with --dims D=4096",
                    )
                self.pos = start
                d = self.name("a dim name")
                if d in dims:
                    raise SpecError(
                        f"dim {d!r} appears twice in operand {name} of op expression {self.text!r}",
                        rule="each dim names one axis of an operand",
                        fix="rename one of the axes",
                    )
                dims.append(d)
                if self.take("]"):
                    break
                self.expect(",", "',' or ']'")
        return Tensor(name, tuple(dims), dtype, is_param)


def _dtype(text: str, expr: str) -> str:
    try:
        return parse_dtype(text)
    except SpecError:
        raise SpecError(
            f"unknown dtype {text!r} in op expression {expr!r}",
            rule="dtypes are one of " + ", ".join(DTYPE_BYTES),
            fix="write e.g. bf16[B,D] @ int8[D,F]",
        ) from None


def parse_expr(text: str) -> OpExpr:
    """Read the expression's structure (operands, dtypes, dims); sizes come later."""
    s = _Scanner(str(text))
    lhs = s.operand("X", False)
    if s.take(*_OPERATORS) is None:
        s.ws()
        raise _malformed(s.text, s.pos, "expected '@' between the two operands")
    rhs = s.operand("W", True)
    explicit: Tensor | None = None
    if s.take(*_ARROWS):
        explicit = s.operand("Z", False)
    s.ws()
    if s.pos != len(s.text):
        raise _malformed(s.text, s.pos, f"unexpected {s.text[s.pos :]!r} after the expression")
    if lhs.name == rhs.name:
        rhs = Tensor("W" if lhs.name != "W" else "Y", rhs.dims, rhs.dtype, True)

    shared = tuple(d for d in lhs.dims if d in rhs.dims)
    if not shared:
        raise SpecError(
            f"operands {_operand(lhs)} and {_operand(rhs)} of {text!r} share no dim",
            rule="a matmul contracts the dims its two operands share (and that the output lacks)",
            fix="use the same name for the contracted axis on both sides, e.g. bf16[B,D] @ bf16[D,F]",
        )
    if explicit is None:
        out_dims = tuple(d for d in lhs.dims if d not in shared) + tuple(
            d for d in rhs.dims if d not in shared
        )
        out = Tensor("Z", out_dims, lhs.dtype)
    else:
        out = Tensor(
            explicit.name if explicit.name not in (lhs.name, rhs.name) else "Z",
            explicit.dims,
            explicit.dtype,
        )
        stray = [d for d in out.dims if d not in lhs.dims and d not in rhs.dims]
        if stray:
            raise SpecError(
                f"output dim {stray[0]!r} of {text!r} is in neither operand",
                rule="every output dim comes from an input",
                fix=f"drop {stray[0]} from the output or add it to an operand",
            )
        dangling = [
            (t, d) for t in (lhs, rhs) for d in t.dims if d not in shared and d not in out.dims
        ]
        if dangling:
            t, d = dangling[0]
            raise SpecError(
                f"dim {d!r} of operand {_operand(t)} in {text!r} is neither shared nor in the output",
                rule="a dim of one operand alone is kept in the output (contractions need both operands)",
                fix=f"add {d} to the output or remove it from {t.name}",
            )
    contracting = tuple(d for d in shared if d not in out.dims)
    if not contracting:
        raise SpecError(
            f"{text!r} contracts no dim: every shared dim ({', '.join(shared)}) is kept in the output",
            rule="a matmul contracts at least one dim shared by both operands and absent from the output",
            fix=f"drop one of {', '.join(shared)} from the output",
        )
    return OpExpr(str(text), lhs, rhs, out, contracting, tuple(d for d in shared if d in out.dims))


def parse_dims(text: str) -> dict[str, float]:
    """'B=256,D=8k' -> {'B': 256.0, 'D': 8000.0} (suffixes as in units.parse_quantity)."""
    out: dict[str, float] = {}
    for part in str(text).split(","):
        part = part.strip()
        if not part:
            continue
        if "=" not in part:
            raise SpecError(
                f"cannot read dims item {part!r}",
                rule="dims are a comma-separated list of NAME=SIZE",
                fix="write e.g. B=256,D=8192,F=32768",
            )
        k, v = (x.strip() for x in part.split("=", 1))
        out[k] = parse_quantity(v, what=k)
    return out


def is_elementwise(text: str) -> bool:
    """True for `fp32[N] + fp32[N]`: the elementwise form (operator `+`)."""
    return "+" in str(text)


def parse_elementwise(text: str, dims: Mapping[str, float] | str, *, name: str = "op") -> Op:
    """`fp32[N] + fp32[N] [-> fp32[N]]`: an ELEMENTWISE op, one FLOP per output element (book
    gpus.md: an fp32 vector add of N elements is N FLOPs over 12N bytes)."""
    s = _Scanner(str(text))
    lhs = s.operand("X", False)
    if s.take("+") is None:
        s.ws()
        raise _malformed(s.text, s.pos, "expected '+' between the two operands")
    rhs = s.operand("Y", False)
    out = s.operand("Z", False) if s.take(*_ARROWS) else Tensor("Z", lhs.dims, lhs.dtype)
    s.ws()
    if s.pos != len(s.text):
        raise _malformed(s.text, s.pos, f"unexpected {s.text[s.pos :]!r} after the expression")
    if rhs.name == lhs.name:
        rhs = Tensor("Y", rhs.dims, rhs.dtype)
    if not (set(lhs.dims) == set(rhs.dims) == set(out.dims)):
        raise SpecError(
            f"operands of {text!r} have different dims",
            rule="an elementwise op (`+`) takes operands and output over the same dims",
            fix="give both operands and the output the same dims, e.g. fp32[N] + fp32[N]",
        )
    sizes = _sizes(text, lhs.dims, dims)
    return Op(name, OpKind.ELEMENTWISE, (lhs, rhs), out, sizes, flops_per_element=1.0)


def parse_op(text: str, dims: Mapping[str, float] | str, *, name: str = "op") -> Op:
    """A ledger `Op` (kind MATMUL, count 1) for `text` with dim sizes `dims`."""
    ex = parse_expr(text)
    return Op(name, OpKind.MATMUL, (ex.lhs, ex.rhs), ex.out, _sizes(text, ex.dims, dims))


def _sizes(
    text: str, expr_dims: tuple[str, ...], dims: Mapping[str, float] | str
) -> MappingProxyType:
    """The checked size of every dim of an expression."""

    sizes = parse_dims(dims) if isinstance(dims, str) else dict(dims)
    missing = [d for d in expr_dims if d not in sizes]
    if missing:
        given = ", ".join(sizes) or "none"
        near = {k.lower(): k for k in sizes}
        hint = "".join(
            f" (did you mean {near[d.lower()]}?)" for d in missing[:1] if d.lower() in near
        )
        raise SpecError(
            f"dim {missing[0]!r} of op {text!r} has no size{hint}; given: {given}",
            rule="every dim of the expression needs a size (names are case-sensitive)",
            fix=f"add {', '.join(f'{d}=...' for d in missing)} to --dims",
        )
    extra = [d for d in sizes if d not in expr_dims]
    if extra:
        raise SpecError(
            f"size given for {extra[0]!r}, which is not a dim of op {text!r} (dims: {', '.join(expr_dims)})",
            rule="every size names a dim of the expression (names are case-sensitive)",
            fix=f"remove {extra[0]} from --dims or correct its name",
        )
    clean: dict[str, float] = {}
    for d in expr_dims:
        v = sizes[d]
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v <= 0:
            raise SpecError(
                f"dim {d} = {v!r} in op {text!r}",
                rule="dim sizes are positive finite numbers",
                fix=f"give {d} a positive size, e.g. {d}=1024",
            )
        clean[d] = float(v)
    return MappingProxyType(clean)


# --------------------------------------------------------------------------------------
# Reading an op back: matmul shape and the arithmetic, for reports
# --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class MatmulShape:
    """X[tokens, contract] · W[contract, features]: products of the dims in each role."""

    tokens: float  # lhs dims not contracted (the token batch B)
    contract: float  # contracted dims (D)
    features: float  # rhs dims not contracted (F)
    weight_dtype: str
    activation_dtype: str


def matmul_shape(op: Op) -> MatmulShape | None:
    """The (B, D, F) view of a weight matmul, or None when the rhs shares a batch dim with the output.

    Book roofline.md: critical batch applies to X[B,D]·W[D,F], where the weight has no
    token dims; per-example weights (`int8[B,D,F]`) are not matmul-shaped.
    """
    if op.kind != OpKind.MATMUL or len(op.inputs) != 2:
        return None
    x, w = op.inputs
    k = op.contracting
    if not k or any(d in x.dims and d not in k for d in w.dims):
        return None
    s = op.sizes
    return MatmulShape(
        tokens=math.prod(s[d] for d in x.dims if d not in k),
        contract=math.prod(s[d] for d in k),
        features=math.prod(s[d] for d in w.dims if d not in k),
        weight_dtype=w.dtype,
        activation_dtype=x.dtype,
    )


def _num(x: float) -> str:
    return f"{x:g}" if x != int(x) or abs(x) >= 1e7 else str(int(x))


def flops_formula(op: Op) -> tuple[str, str]:
    """('2·B·D·F', '2·256·8192·32768') for a contraction (book: 2 × every dim once)."""
    keep = set(op.out.dims) | set(op.contracting)
    dims = tuple(d for d in op.all_dims if d in keep)  # order of appearance: B·D·F
    sym = "·".join(["2", *dims])
    num = "·".join(["2", *(_num(op.sizes[d]) for d in dims)])
    if op.flop_factor != 1:
        sym += f"·{op.flop_factor:g}"
        num += f"·{op.flop_factor:g}"
    return sym, num


def bytes_formula(op: Op) -> tuple[str, str]:
    """('2·B·D + 1·D·F + 2·B·F', '2·256·8192 + ...'): every operand read, the output written."""
    sym, num = [], []
    for t in (*op.inputs, op.out):
        b = _num(DTYPE_BYTES[t.dtype])
        sym.append("·".join([b, *t.dims]))
        num.append("·".join([b, *(_num(op.sizes[d]) for d in t.dims)]))
    return " + ".join(sym), " + ".join(num)


__all__ = [
    "OpExpr",
    "MatmulShape",
    "parse_expr",
    "parse_op",
    "parse_elementwise",
    "is_elementwise",
    "parse_dims",
    "matmul_shape",
    "flops_formula",
    "bytes_formula",
]
