"""What the launcher records about the job: command, environment, versions, hosts, GPUs,
and how it ended. The launcher never imports torch (it would add seconds to every
start); torch/CUDA/NCCL versions come from the workers' rank_info.json."""

from __future__ import annotations

import os
import platform
import socket
import sys
import time
from importlib import metadata
from typing import Any

from gpudiag import rundir
from gpudiag._version import __version__

ENV_PREFIXES = ("NCCL_", "TORCH_", "CUDA_", "GLOO_", "MASTER_", "OMP_", "MKL_", "PYTORCH_")
ENV_NAMES = ("WORLD_SIZE", "LOCAL_WORLD_SIZE", "NODE_RANK", "RANK", "LOCAL_RANK")


def selected_env(environ: dict[str, str] | None = None) -> dict[str, str]:
    environ = dict(os.environ if environ is None else environ)
    return {
        k: v for k, v in sorted(environ.items()) if k.startswith(ENV_PREFIXES) or k in ENV_NAMES
    }


def _package_version(name: str) -> str | None:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def launcher_versions() -> dict[str, Any]:
    return {
        "python": platform.python_version(),
        "torch": _package_version("torch"),
        "nvidia_ml_py": _package_version("nvidia-ml-py"),
        "gpudiag": __version__,
    }


def nvml_inventory() -> tuple[str | None, list[dict[str, Any]]]:
    """(driver version, GPUs) from NVML, or (None, []) without a GPU or NVML."""
    try:
        import pynvml

        pynvml.nvmlInit()
    except Exception:
        return None, []
    try:
        driver = _text(pynvml.nvmlSystemGetDriverVersion())
        gpus = []
        for i in range(pynvml.nvmlDeviceGetCount()):
            handle = pynvml.nvmlDeviceGetHandleByIndex(i)
            gpu: dict[str, Any] = {"index": i}
            for key, call in (
                ("name", lambda h: _text(pynvml.nvmlDeviceGetName(h))),
                ("uuid", lambda h: _text(pynvml.nvmlDeviceGetUUID(h))),
                ("memory_total", lambda h: int(pynvml.nvmlDeviceGetMemoryInfo(h).total)),
                (
                    "compute_capability",
                    lambda h: ".".join(map(str, pynvml.nvmlDeviceGetCudaComputeCapability(h))),
                ),
                ("pci_bus_id", lambda h: _text(pynvml.nvmlDeviceGetPciInfo(h).busId)),
            ):
                try:
                    gpu[key] = call(handle)
                except Exception:
                    gpu[key] = None
            gpus.append(gpu)
        return driver, gpus
    except Exception:
        return None, []
    finally:
        try:
            pynvml.nvmlShutdown()
        except Exception:
            pass


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def host_info(node_rank: int) -> dict[str, Any]:
    info: dict[str, Any] = {
        "hostname": socket.gethostname(),
        "node_rank": node_rank,
        "cpu_count": os.cpu_count(),
        "platform": platform.platform(),
    }
    try:
        import psutil

        info["memory_total"] = int(psutil.virtual_memory().total)
    except Exception:
        info["memory_total"] = None
    driver, gpus = nvml_inventory()
    info["driver_version"] = driver
    info["gpus"] = gpus
    return info


def launcher_identity(heartbeat_s: float) -> dict[str, Any]:
    """What readers need to tell a running launcher from a vanished one: pid, host and
    process start time (a reused pid has another), and the heartbeat period."""
    start_time = None
    try:
        import psutil

        start_time = float(psutil.Process().create_time())
    except Exception:
        pass
    pid = os.getpid()
    return {
        "pid": pid,
        "hostname": socket.gethostname(),
        "start_time": start_time,
        # what same-host readers tell this process by: no change of the wall clock moves
        # them (start_time does: a VM resumed with its clock stepped, issue 28 NEW-2)
        "start_ticks": rundir.process_start_ticks(pid),
        "boot_id": rundir.boot_id(),
        "heartbeat_s": heartbeat_s,
    }


def initial_manifest(
    *,
    env: dict[str, str],
    argv: list[str],
    target: dict[str, Any],
    script_args: list[str],
    launch: dict[str, Any],
    node_rank: int,
    profile: dict[str, Any],
) -> dict[str, Any]:
    host = host_info(node_rank)
    versions = launcher_versions()
    versions["driver"] = host.get("driver_version")
    command = ["gpudiag", "trace", *argv]
    manifest: dict[str, Any] = {
        "format_version": rundir.FORMAT_VERSION,
        "gpudiag_version": __version__,
        "command": command,
        "script": target.get("script"),
        "module": target.get("module"),
        "argv": script_args,
        "cwd": os.getcwd(),
        "python_executable": sys.executable,
        "env": selected_env(env),
        "versions": versions,
        "hosts": [host],
        "node_rank": node_rank,
        "launch": launch,
        "nproc_per_node": launch.get("nproc_per_node"),
        "nnodes": launch.get("nnodes"),
        "world_size": launch.get("expected_world_size"),
        "backend": None,
        "profile": profile,
        "sampler": None,
        "start_ns": time.time_ns(),
        "end_ns": None,
        "launcher": launcher_identity(rundir.LAUNCHER_HEARTBEAT_S),
        "status": "running",
        "exit_code": None,
        "failed_ranks": [],
        "failure": None,
        "incomplete": None,
    }
    if any(rundir.fs_text(a) != a for a in command):
        # The run files hold each byte that is not UTF-8 as \xNN (rundir.fs_text); the
        # command's exact bytes, one hex string per argument, for who must rerun it.
        try:
            manifest["command_hex"] = [os.fsencode(a).hex() for a in command]
        except UnicodeError:
            pass
    return manifest
