"""Typed errors for users: each names the input, the rule it broke, the values, and a fix.

`RooflineError` is the single base; the CLI catches it and prints one paragraph (never a
traceback). Infeasible *plans* are not errors: they are data with a reason (see planner).
"""

from __future__ import annotations


class RooflineError(Exception):
    """Base for every user-facing error. str() is one paragraph: what, rule, fix."""

    def __init__(self, what: str, *, rule: str = "", fix: str = "") -> None:
        self.what, self.rule, self.fix = what, rule, fix
        super().__init__(self.render())

    def render(self) -> str:
        parts = [self.what.rstrip(".") + "."]
        if self.rule:
            parts.append("Rule: " + self.rule.rstrip(".") + ".")
        if self.fix:
            parts.append("Fix: " + self.fix.rstrip(".") + ".")
        return " ".join(parts)


class SpecError(RooflineError):
    """Bad chip, model, system, dtype or quantity input."""


class UnknownNameError(SpecError):
    """A catalog name that matches nothing; the message lists the closest names."""


class ShardingError(RooflineError):
    """An illegal or impossible sharding (axis used twice, indivisible dimension, ...)."""


class PlanError(RooflineError):
    """An impossible parallelism plan or mesh (sizes do not multiply, does not fit the system)."""


class VerifyError(RooflineError):
    """The compiler check could not run (JAX missing, device count, unreadable HLO)."""
