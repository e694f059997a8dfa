"""Plain aligned text tables (no dependency): `table(rows, headers)`."""

from __future__ import annotations

from collections.abc import Sequence


def table(
    rows: Sequence[Sequence[object]], headers: Sequence[str], align: str | None = None
) -> str:
    """Render rows as an aligned table. `align` is a string of 'l'/'r' per column (default: text left, numbers right)."""
    cells = [[str(h) for h in headers]] + [[("" if c is None else str(c)) for c in r] for r in rows]
    n = len(headers)
    widths = [max(len(r[i]) for r in cells) for i in range(n)]
    if align is None:
        align = "".join("l" if i == 0 else "r" for i in range(n))

    def fmt(r: list[str]) -> str:
        return "  ".join(
            c.ljust(w) if a == "l" else c.rjust(w)
            for c, w, a in zip(r, widths, align, strict=False)
        ).rstrip()

    lines = [fmt(cells[0]), "  ".join("-" * w for w in widths)]
    lines += [fmt(r) for r in cells[1:]]
    return "\n".join(lines)


def kv(pairs: Sequence[tuple[str, object]]) -> str:
    """Key: value lines, keys aligned."""
    w = max((len(k) for k, _ in pairs), default=0)
    return "\n".join(f"{k.ljust(w)}  {v}" for k, v in pairs)
