"""The --json output: AnalysisResult.to_json() serialised (schema in docs/json-schema.md)."""

from __future__ import annotations

import json
from typing import Any


def dumps(payload: Any) -> str:
    """JSON text; NaN/inf never appear (to_json maps them to null)."""
    return json.dumps(payload, indent=2, allow_nan=False, default=str)
