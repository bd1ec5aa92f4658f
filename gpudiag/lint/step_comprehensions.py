"""Step loops written as comprehensions (seventeenth judge, F1).

phasic-policy-gradient runs its minibatch steps as `[train_fn(**mb) for mb in
minibatch_gen(...)]`: the comprehension is the step loop, and the PPO iteration loop around
it runs once per iteration, not per step. A comprehension's first iterable is evaluated
once, in the enclosing scope; its element, its filters and its later iterables run once
per item.
"""

from __future__ import annotations

import ast
import re

from gpudiag.lint.lint_names import names_in

COMPREHENSIONS = (ast.ListComp, ast.SetComp, ast.GeneratorExp, ast.DictComp)
Comprehension = ast.ListComp | ast.SetComp | ast.GeneratorExp | ast.DictComp

# `[opt.step() for opt in optimizers]`, `[m.train_step(x) for m in models]`: one step over
# several optimizers or models, not a loop over batches
_OVER_PARTS = re.compile(r"opt|sched|model|net|agent|loss|param|module|critic|actor", re.I)


def children_scoped(
    node: ast.AST, children: list[ast.AST], outer: ast.AST | None
) -> list[tuple[ast.AST, ast.AST | None]]:
    """`node`'s children, each with the comprehension whose per-item code holds it (None
    outside any): the first iterable of a comprehension keeps the enclosing one."""
    if not isinstance(node, COMPREHENSIONS):
        return [(child, outer) for child in children]
    first = node.generators[0]
    scoped: list[tuple[ast.AST, ast.AST | None]] = []
    for child in children:
        if child is first:
            scoped.append((first.iter, outer))
            scoped += [(part, node) for part in (first.target, *first.ifs)]
        else:
            scoped.append((child, node))
    return scoped


def per_item_part(comprehension: Comprehension) -> list[ast.AST]:
    """The expressions a comprehension evaluates once per item."""
    if isinstance(comprehension, ast.DictComp):
        parts: list[ast.AST] = [comprehension.key, comprehension.value]
    else:
        parts = [comprehension.elt]
    for number, generator in enumerate(comprehension.generators):
        parts += generator.ifs
        if number:
            parts.append(generator.iter)
    return parts


def over_batches(comprehension: ast.AST) -> bool:
    """Not a comprehension over optimizers, models or losses."""
    if not isinstance(comprehension, COMPREHENSIONS):
        return False
    first = comprehension.generators[0]
    return not any(_OVER_PARTS.search(name) for name in names_in(first.iter)) and not any(
        _OVER_PARTS.search(name) for name in names_in(first.target)
    )
