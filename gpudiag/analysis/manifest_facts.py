"""What a run's manifest says of the job: its hosts' cores, its threads per rank, the
script and arguments it ran (the run facts of RunInfo)."""

from __future__ import annotations

from typing import Any


def hosts(manifest: dict[str, Any]) -> list[dict[str, Any]]:
    return [h for h in manifest.get("hosts") or [] if isinstance(h, dict)]


def cores_per_node(manifest: dict[str, Any]) -> int | None:
    """The smallest host's os.cpu_count() from the manifest (None when it does not say)."""
    cores = [h.get("cpu_count") for h in hosts(manifest)]
    counts = [int(c) for c in cores if isinstance(c, int) and c > 0]
    return min(counts) if counts else None


def threads_per_rank(manifest: dict[str, Any]) -> int | None:
    """OMP_NUM_THREADS of the run's environment, when it set one."""
    env = manifest.get("env")
    threads = str(env.get("OMP_NUM_THREADS", "")).strip() if isinstance(env, dict) else ""
    return int(threads) if threads.isdigit() and int(threads) > 0 else None


def script_and_arguments(manifest: dict[str, Any]) -> str | list[str] | None:
    """The traced script and its arguments as the manifest names them: the script alone
    said nothing of the arguments, so two runs of `train.py` with other batch sizes read as
    the same job (issue 31 probe: Compare paired them, no warning)."""
    script, argv = manifest.get("script"), manifest.get("argv")
    args = [str(a) for a in argv] if isinstance(argv, list) else []
    if isinstance(script, str) and script:
        return [script, *args] if args else script
    module = manifest.get("module")  # `-m gpudiag.reference`: named as python's -m is
    return ["-m", module, *args] if isinstance(module, str) and module else args or None
