"""The stacks' own launch files: read them into the plan vocabulary, write plans back out.

`roofline import` and `roofline export` are thin shells over `read_launch` / `write_launch`;
the record, the protocols and the registry are in `roofline.launch.base` (docs/launch.md).
"""

from __future__ import annotations

from roofline.launch.base import (
    READERS,
    STACK_MODULES,
    WRITERS,
    Default,
    LaunchConfig,
    LaunchError,
    LaunchKind,
    LaunchWorkload,
    Problem,
    Unsupported,
    detect_stack,
    read_launch,
    write_launch,
)

__all__ = [
    "Default",
    "LaunchConfig",
    "LaunchError",
    "LaunchKind",
    "LaunchWorkload",
    "Problem",
    "READERS",
    "STACK_MODULES",
    "Unsupported",
    "WRITERS",
    "detect_stack",
    "read_launch",
    "write_launch",
]
