"""Per-node sampler (runs in the launcher, background thread, never in training).

NVML (nvidia-ml-py) for every local GPU into ``gpu_samples.jsonl``; psutil host and
worker-process samples into ``host_samples.jsonl`` always. Each NVML counter goes
through :func:`nvml_or_none`, so a counter the GPU lacks (NVLink, power, clock-event
reasons) is null and never stops the sampler. Without NVML there is one notice and host
samples only. Rows are written (and flushed) as they are taken, so a crash keeps them.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from gpudiag import rundir

NO_GPU_NOTICE = "no NVIDIA GPU/NVML found: sampling host CPU and memory instead"
# nvmlDeviceGetFieldValues ids: NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX / _RX (KiB)
NVLINK_TX_FIELD = 138
NVLINK_RX_FIELD = 139
# c_nvmlValue_t is a union: the member to read depends on the field's valueType.
_NVML_VALUE_ATTR = {0: "dVal", 1: "uiVal", 2: "ulVal", 3: "ullVal", 4: "sllVal"}


def nvml_or_none(call: Callable[..., Any], *args: Any) -> Any:
    """The counter's value, or None when NVML says it is unsupported or fails."""
    import pynvml

    try:
        return call(*args)
    except pynvml.NVMLError:
        return None


def _init_nvml() -> tuple[list[Any], str | None]:
    """NVML device handles, or ([], notice) when there is no GPU/NVML."""
    try:
        import pynvml
    except ImportError:
        return [], NO_GPU_NOTICE
    try:
        pynvml.nvmlInit()
        count = pynvml.nvmlDeviceGetCount()
        handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(count)]
    except (pynvml.NVMLError, OSError):
        return [], NO_GPU_NOTICE
    if not handles:
        return [], NO_GPU_NOTICE
    return handles, None


def gpu_row(
    node: int, index: int, handle: Any, t_ns: int, nvlink_prev: dict[int, tuple] | None = None
) -> dict[str, Any]:
    """One GPU's counters (every unsupported one null). ``nvlink_prev`` keeps the last
    cumulative NVLink reading per GPU: the rate needs two."""
    import pynvml

    util = nvml_or_none(pynvml.nvmlDeviceGetUtilizationRates, handle)
    mem = nvml_or_none(pynvml.nvmlDeviceGetMemoryInfo, handle)
    power_mw = nvml_or_none(pynvml.nvmlDeviceGetPowerUsage, handle)
    fields = nvml_or_none(
        pynvml.nvmlDeviceGetFieldValues, handle, [NVLINK_TX_FIELD, NVLINK_RX_FIELD]
    )
    nvlink_tx, nvlink_rx = nvlink_rates(fields, index, nvlink_prev)
    return {
        "t_ns": t_ns,
        "gpu": index,
        "uuid": nvml_or_none(pynvml.nvmlDeviceGetUUID, handle),
        "util_gpu": None if util is None else util.gpu,
        "util_mem": None if util is None else util.memory,
        "mem_used": None if mem is None else mem.used,
        "mem_total": None if mem is None else mem.total,
        "power_w": None if power_mw is None else power_mw / 1000.0,
        "sm_clock_mhz": nvml_or_none(pynvml.nvmlDeviceGetClockInfo, handle, pynvml.NVML_CLOCK_SM),
        "throttle_reasons": nvml_or_none(pynvml.nvmlDeviceGetCurrentClocksEventReasons, handle),
        "pcie_tx_kbs": nvml_or_none(
            pynvml.nvmlDeviceGetPcieThroughput, handle, pynvml.NVML_PCIE_UTIL_TX_BYTES
        ),
        "pcie_rx_kbs": nvml_or_none(
            pynvml.nvmlDeviceGetPcieThroughput, handle, pynvml.NVML_PCIE_UTIL_RX_BYTES
        ),
        "nvlink_tx_kbs": nvlink_tx,
        "nvlink_rx_kbs": nvlink_rx,
        "temp_c": nvml_or_none(
            pynvml.nvmlDeviceGetTemperature, handle, pynvml.NVML_TEMPERATURE_GPU
        ),
    }


def nvlink_rates(
    fields: Any, index: int, prev: dict[int, tuple] | None
) -> tuple[float | None, float | None]:
    """KiB/s from NVML's cumulative NVLink data counters (KiB, µs timestamps): None on the
    first reading, on GPUs without NVLink, and when a counter went backwards."""
    found = [_field_reading(fields, i) for i in (0, 1)]
    readings = [r for r in found if r is not None]
    if prev is None or len(readings) < len(found):
        return None, None
    last = prev.get(index)
    prev[index] = tuple(readings)
    if last is None:
        return None, None
    rates = []
    for (t_us, value), (last_t_us, last_value) in zip(readings, last, strict=True):
        dt_s = (t_us - last_t_us) / 1e6
        rates.append((value - last_value) / dt_s if dt_s > 0 and value >= last_value else None)
    return rates[0], rates[1]


def _field_reading(fields: Any, index: int) -> tuple[int, int] | None:
    """(timestamp µs, integer value) of one field, None when absent or an NVML error."""
    if fields is None or len(fields) <= index:
        return None
    field = fields[index]
    if getattr(field, "nvmlReturn", 1) != 0:
        return None
    attr = _NVML_VALUE_ATTR.get(getattr(field, "valueType", 3), "ullVal")
    try:
        return int(field.timestamp), int(getattr(field.value, attr))
    except (AttributeError, TypeError, ValueError):
        return None


class Sampler:
    """Samples this node's GPUs (NVML) and host every interval_s in a daemon thread."""

    def __init__(
        self,
        run_dir: Path,
        node: int = 0,
        interval_s: float = 0.1,
        pids_provider: Callable[[], list[int]] | None = None,
    ) -> None:
        self.run_dir = Path(run_dir)
        self.node = node
        self.interval_s = interval_s
        self.pids_provider = pids_provider or (lambda: [])
        self.kind: str = "host"
        self.notice: str | None = None
        self.samples = 0
        self._handles: list[Any] = []
        self._nvlink_prev: dict[int, tuple] = {}
        self.errors: list[str] = []
        self._procs: dict[int, Any] = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._gpu_writer: rundir.JsonlWriter | None = None
        self._host_writer: rundir.JsonlWriter | None = None

    def start(self) -> None:
        self._handles, self.notice = _init_nvml()
        self.kind = "nvml" if self._handles else "host"
        if self._handles:
            self._gpu_writer = rundir.open_node_table(self.run_dir, self.node, rundir.GPU_SAMPLES)
        self._host_writer = rundir.open_node_table(self.run_dir, self.node, rundir.HOST_SAMPLES)
        import psutil

        psutil.cpu_percent(None)  # first call only sets the baseline
        self._thread = threading.Thread(target=self._run, name="gpudiag-sampler", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        for writer in (self._gpu_writer, self._host_writer):
            if writer is not None:
                writer.close()
        if self._handles:
            import pynvml

            nvml_or_none(pynvml.nvmlShutdown)

    def _run(self) -> None:
        next_t = time.monotonic()
        while not self._stop.is_set():
            try:
                self.sample_once()
            except Exception as exc:  # noqa: BLE001 - sampling must outlive any one failure
                if len(self.errors) < 10:
                    self.errors.append(f"{type(exc).__name__}: {exc}")
            next_t += self.interval_s
            delay = next_t - time.monotonic()
            if delay < 0:  # fell behind (loaded machine): skip, do not burst
                next_t = time.monotonic()
                delay = 0
            self._stop.wait(delay)

    def sample_once(self) -> None:
        t_ns = time.time_ns()
        if self._gpu_writer is not None:
            self._gpu_writer.write_many(
                gpu_row(self.node, i, h, t_ns, self._nvlink_prev)
                for i, h in enumerate(self._handles)
            )
        if self._host_writer is not None:
            self._host_writer.write(self._host_row(t_ns))
        self.samples += 1

    def _host_row(self, t_ns: int) -> dict[str, Any]:
        import psutil

        vm = psutil.virtual_memory()
        proc_cpu, proc_rss = self._process_totals()
        return {
            "t_ns": t_ns,
            "cpu_percent": psutil.cpu_percent(None),
            "mem_used": vm.total - vm.available,
            "mem_total": vm.total,
            "proc_cpu_percent": proc_cpu,
            "proc_rss": proc_rss,
        }

    def _process_totals(self) -> tuple[float | None, int | None]:
        """Summed cpu% and RSS of the workers (None when there are none to see)."""
        import psutil

        try:
            pids = list(self.pids_provider())
        except Exception:  # noqa: BLE001 - a provider bug must not kill sampling
            pids = []
        if not pids:
            return None, None
        cpu = 0.0
        rss = 0
        for pid in pids:
            proc = self._procs.get(pid)
            try:
                if proc is None:
                    proc = self._procs[pid] = psutil.Process(pid)
                    proc.cpu_percent(None)
                cpu += proc.cpu_percent(None)
                rss += proc.memory_info().rss
            except (psutil.NoSuchProcess, psutil.AccessDenied):
                self._procs.pop(pid, None)
        return cpu, rss
