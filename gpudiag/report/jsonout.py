"""The --json output: AnalysisResult.to_json() serialised (schema in docs/json-schema.md)."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import TYPE_CHECKING, Any, TextIO

if TYPE_CHECKING:
    from gpudiag.analysis.result import AnalysisResult

# Encoded pieces written at a time by `write` (a few hundred kB of text).
_BATCH = 16384
_INDENT = 2


def _encoder() -> json.JSONEncoder:
    # with an indent: json's Python encoder, which writes a jsonable.Rows as it iterates
    return json.JSONEncoder(indent=_INDENT, allow_nan=False, default=str)


def dumps(payload: Any) -> str:
    """JSON text; NaN/inf never appear (to_json maps them to null)."""
    return _encoder().encode(payload)


def write(payload: Any, stream: TextIO) -> None:
    """``dumps(payload)`` and a newline, written to ``stream`` as it is encoded: the
    whole text of a many-rank run is never held, nor the list of its pieces that
    ``dumps`` joins (at 8192 ranks, 10 MB of text cost 60 MB while it was joined)."""
    _write_pieces(_encoder().iterencode(payload), stream)


def write_results(results: Sequence[AnalysisResult], stream: TextIO) -> None:
    """``write`` of one result's ``to_json()`` (of the list of them, for several), with
    each top-level value built only when it is written and dropped once it is: the JSON
    of a many-rank run (its ``ranks``, ``stragglers``, ``dataloader``, ``gpu`` lists) is
    never held whole, only its largest section."""
    if len(results) == 1:
        pieces: Iterable[str] = _object(results[0].json_sections(), level=0)
    else:
        pieces = _results_list(results)
    _write_pieces(pieces, stream)


def _results_list(results: Sequence[AnalysisResult]) -> Iterator[str]:
    if not results:
        yield "[]"
        return
    for i, result in enumerate(results):
        yield ("," if i else "[") + _newline(1)
        yield from _object(result.json_sections(), level=1)
    yield _newline(0) + "]"


def _object(sections: Sequence[tuple[str, Callable[[], Any]]], level: int) -> Iterator[str]:
    """An object's text at nesting ``level``, as the encoder indents it, each value
    built when reached."""
    if not sections:
        yield "{}"
        return
    for i, (key, build) in enumerate(sections):
        yield ("," if i else "{") + _newline(level + 1) + _encoder().encode(key) + ": "
        yield from _nested(build(), level + 1)
    yield _newline(level) + "}"


def _nested(value: Any, level: int) -> Iterator[str]:
    """``value``'s text as nested at ``level``: its own lines indented by ``level`` steps
    more (a newline never occurs inside an encoded string, so every one starts a line).
    A jsonable.Rows in it is encoded an item at a time as the encoder reaches it."""
    newline = _newline(level)
    for piece in _encoder().iterencode(value):
        yield piece.replace("\n", newline)


def _newline(level: int) -> str:
    return "\n" + " " * (_INDENT * level)


def _write_pieces(pieces: Iterable[str], stream: TextIO) -> None:
    batch: list[str] = []
    for piece in pieces:
        batch.append(piece)
        if len(batch) >= _BATCH:
            stream.write("".join(batch))
            batch.clear()
    batch.append("\n")
    stream.write("".join(batch))
