"""`# gpudiag: ignore` and `# gpudiag: ignore[GD101, GD301]` comments, per line."""

from __future__ import annotations

import io
import re
import tokenize

_IGNORE = re.compile(r"#\s*gpudiag:\s*ignore(?:\[([A-Za-z0-9_,\s]*)\])?", re.I)
ALL = frozenset({"*"})


def suppressions(source: str) -> dict[int, frozenset[str]]:
    """Line -> codes ignored on it (ALL for a bare ignore). Comments only, never strings."""
    result: dict[int, frozenset[str]] = {}
    if not _IGNORE.search(source):  # tokenizing costs more than the whole lint: only when needed
        return result
    try:
        tokens = list(tokenize.generate_tokens(io.StringIO(source).readline))
    except (tokenize.TokenError, SyntaxError):
        return result
    for token in tokens:
        if token.type != tokenize.COMMENT:
            continue
        match = _IGNORE.search(token.string)
        if not match:
            continue
        codes = match.group(1)
        if codes is None:
            result[token.start[0]] = ALL
        else:
            result[token.start[0]] = frozenset(
                c.strip().upper() for c in codes.split(",") if c.strip()
            )
    return result


def is_suppressed(ignored: dict[int, frozenset[str]], code: str, *lines: int) -> bool:
    for line in lines:
        codes = ignored.get(line)
        if codes is not None and (codes is ALL or code in codes):
            return True
    return False
