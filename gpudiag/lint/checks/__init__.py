"""Rule checks, one module per theme. Each `check(ctx)` yields `Hit`s for one module."""

from __future__ import annotations

import ast
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from gpudiag.lint.context import ModuleContext


@dataclass(frozen=True)
class Hit:
    code: str
    node: ast.AST
    detail: str = ""  # appended to the rule's message, e.g. which call
    fix: str = ""  # the fix for this case, when the rule's own does not fit (an assert)


Check = Callable[[ModuleContext], Iterator[Hit]]


def all_checks() -> list[Check]:
    from gpudiag.lint.checks import (
        data_loading,
        dataparallel,
        ddp_setup,
        host_sync,
        precision,
        process_group,
        rank_zero,
        replicate,
    )

    modules = (
        dataparallel,
        replicate,
        data_loading,
        host_sync,
        ddp_setup,
        process_group,
        precision,
        rank_zero,
    )
    return [module.check for module in modules]
