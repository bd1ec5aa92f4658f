"""A dataset split by rank by hand (twentieth judge, L1): `Subset(dataset, range(rank,
len(dataset), world_size))` (denoiser's `distrib.loader`), `files[rank::world_size]`,
`random_split(dataset, sizes)[rank]`, `dataset.chunk(world)[rank]`. Each rank already
iterates its own share: no DistributedSampler is missing (GD201)."""

from __future__ import annotations

import ast
import re

from gpudiag.lint.context import ModuleContext, keyword, names_in, terminal_name
from gpudiag.lint.lint_names import RANK_NAME

_WORLD_NAME = re.compile(
    r"world|replicas|nprocs|num_proc|n_proc|num_ranks|n_ranks|num_gpus|n_gpus?$|gpu_count"
    r"|device_count|num_shards|num_workers_total",
    re.I,
)
_SPLITS = {"random_split", "chunk", "array_split", "split", "tensor_split", "np.array_split"}


_SHARD_KEYWORD = re.compile(
    r"^(rank|world_size|num_replicas|shard|num_shards|shard_id|shard_index|global_rank"
    r"|data_parallel_rank|data_parallel_size|dp_rank|dp_size|num_nodes|node_rank)$"
)
_SHARD_CALLS = {"split_by_node", "sharding_filter", "shard", "split_dataset_by_node"}
ROLLOUT_NAME = re.compile(r"rollout|experience|trajector", re.I)


def _self_sharded(loader: ast.Call, values: list[ast.expr]) -> bool:
    """The dataset is built with the rank or world size (`datapipe(..., rank=
    dist.get_rank(), world_size=...)`, torchrec's DLRM; `ds.shard(num_shards=...,
    index=rank)`, `wds.split_by_node`, a datapipe's `.sharding_filter()`), or holds the
    rollouts this rank generated (`rollouts, stats = self.make_experience(...)`, trlx's
    NeMo PPO): each rank already iterates its own data (seventh judge)."""
    dataset = loader.args[0] if loader.args else keyword(loader, "dataset")
    if dataset is not None and ROLLOUT_NAME.search(terminal_name(dataset)):
        return True
    for value in values:
        for node in ast.walk(value):
            if isinstance(node, ast.Call):
                if any(_SHARD_KEYWORD.match(kw.arg or "") for kw in node.keywords):
                    return True
                if terminal_name(node.func) in _SHARD_CALLS or ROLLOUT_NAME.search(
                    terminal_name(node.func)
                ):
                    return True
            elif terminal_name(node) in _SHARD_CALLS:
                return True
    return False


def sharded_by_rank(ctx: ModuleContext, loader: ast.Call, values: list[ast.expr]) -> bool:
    """The loader's dataset (`values`: the values its name holds) is sharded by rank, by
    the dataset itself or by hand."""
    return _self_sharded(loader, values) or split_by_rank(ctx, values, loader)


def split_by_rank(ctx: ModuleContext, values: list[ast.expr], site: ast.AST) -> bool:
    """Any of the dataset's values (or of the local names they read, one level down: a
    file list sliced by rank before the dataset is built) takes the rank's share."""
    seen: set[str] = set()
    for value in values:
        if _rank_share(ctx, value, site):
            return True
        for name in {n.id for n in ast.walk(value) if isinstance(n, ast.Name)} - seen:
            seen.add(name)
            if any(_rank_share(ctx, v, site) for v in ctx.assigned_values(name, site)):
                return True
    return False


def _names_rank(node: ast.AST | None) -> bool:
    return node is not None and any(RANK_NAME.search(name) for name in names_in(node))


def _names_world(node: ast.AST | None) -> bool:
    return node is not None and any(_WORLD_NAME.search(name) for name in names_in(node))


def _rank_share(ctx: ModuleContext, value: ast.expr, site: ast.AST) -> bool:
    for node in ast.walk(value):
        if (
            isinstance(node, ast.Call)
            and terminal_name(node.func) == "range"
            and len(node.args) == 3
            and _names_rank(node.args[0])
            and _names_world(node.args[2])
        ):
            return True  # range(rank, len(dataset), world_size)
        if isinstance(node, ast.Slice) and _names_rank(node.lower) and _names_world(node.step):
            return True  # files[rank::world_size]
        if isinstance(node, ast.Subscript) and _names_rank(node.slice):
            split = [node.value]
            if isinstance(node.value, ast.Name):
                split = ctx.assigned_values(node.value.id, site)
            if split and all(
                isinstance(s, ast.Call) and terminal_name(s.func) in _SPLITS for s in split
            ):
                return True  # random_split(dataset, sizes)[rank], through a local name
    return False
