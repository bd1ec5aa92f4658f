"""Clocks of a multi-node run: each node's offset to node 0, and shifting a rank's
instants by it."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from gpudiag.rundir.files import _Listing, bad_input, read_json
from gpudiag.rundir.layout import CLOCK, RANK_INFO, manifest_node, node_dir, rank_dir
from gpudiag.rundir.schema import _is_int

# --------------------------------------------------------------------------- clocks
# Instants (epoch ns) of the run tables; the other *_ns columns are durations.
INSTANT_COLUMNS = frozenset({"start_ns", "end_ns", "enqueue_ns", "t_ns", "call_ns", "returned_ns"})
# Larger than any plausible clock error, smaller than nonsense: an offset beyond it is
# ignored with a warning.
MAX_CLOCK_OFFSET_NS = 7 * 24 * 3600 * 10**9


def clock_offsets(
    run: Path,
    manifest: Mapping[str, Any],
    nodes: Iterable[int],
    warnings: list[str],
    listing: _Listing | None = None,
) -> dict[int, int]:
    """node -> ns to add to that node's times to put them on node 0's clock, from each
    node's manifest ``clock`` (else its ``node<K>/clock.json``). Node 0 and nodes
    without a measurement: none (their times are read as written)."""
    manifests: dict[int, Any] = {manifest_node(manifest): manifest}
    nested = manifest.get("nodes")
    if isinstance(nested, dict):
        manifests.update({int(k): v for k, v in nested.items() if str(k).isdigit()})
    out: dict[int, int] = {}
    for n in sorted(set(nodes) | set(manifests)):
        if n == 0:
            continue
        record = manifests.get(n, {}).get("clock") if isinstance(manifests.get(n), dict) else None
        source: Path | str = f"manifest of node {n}"
        if not isinstance(record, dict):
            source = node_dir(run, n) / CLOCK
            found = (listing or _Listing(warnings)).has(source)
            record = read_json(source, warnings) if found else None
        offset = record.get("offset_ns") if isinstance(record, dict) else None
        if not _is_int(offset) or not offset:
            continue
        if abs(offset) > MAX_CLOCK_OFFSET_NS:
            bad_input(warnings, f"{source}: clock offset_ns {offset} is implausible; ignored")
            continue
        out[n] = int(offset)
    return out


def _rank_offsets(run: Path, ranks: Iterable[int], offsets: dict[int, int]) -> dict[int, int]:
    """rank -> clock offset of its node (rank_info.json's node_rank)."""
    if not offsets:
        return {}
    out = {}
    for r in ranks:
        info = read_json(rank_dir(run, r) / RANK_INFO)
        node = info.get("node_rank") if isinstance(info, dict) else None
        if isinstance(node, int) and node in offsets:
            out[r] = offsets[node]
    return out


def _shift_rows(rows: list[dict], key: str | None, offsets: Mapping[int, int]) -> None:
    """Add the row's offset (by ``key``, or by its ``rank`` field) to its instants."""
    for row in rows:
        offset = offsets.get(row.get(key or "rank"))  # type: ignore[arg-type]
        if offset:
            _shift_instants([row], offset)


def _shift_instants(rows: list[dict], offset: int) -> None:
    if not offset:
        return
    for row in rows:
        for col in INSTANT_COLUMNS:
            value = row.get(col)
            if isinstance(value, int) and _is_int(value):
                row[col] = value + offset
