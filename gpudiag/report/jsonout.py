"""The --json output: AnalysisResult.to_json() serialised (schema in docs/json-schema.md)."""

from __future__ import annotations

import json
from typing import Any, TextIO

# Encoded pieces written at a time by `write` (a few hundred kB of text).
_BATCH = 16384


def _encoder() -> json.JSONEncoder:
    return json.JSONEncoder(indent=2, allow_nan=False, default=str)


def dumps(payload: Any) -> str:
    """JSON text; NaN/inf never appear (to_json maps them to null)."""
    return _encoder().encode(payload)


def write(payload: Any, stream: TextIO) -> None:
    """``dumps(payload)`` and a newline, written to ``stream`` as it is encoded: the
    whole text of a many-rank run is never held, nor the list of its pieces that
    ``dumps`` joins (at 8192 ranks, 10 MB of text cost 60 MB while it was joined)."""
    batch: list[str] = []
    for piece in _encoder().iterencode(payload):
        batch.append(piece)
        if len(batch) >= _BATCH:
            stream.write("".join(batch))
            batch.clear()
    batch.append("\n")
    stream.write("".join(batch))
