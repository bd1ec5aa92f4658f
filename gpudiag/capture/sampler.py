"""Per-node sampler (runs in the launcher, background thread, never in training).

NVML (nvidia-ml-py) for every local GPU into ``gpu_samples.jsonl``; psutil host and
worker-process samples into ``host_samples.jsonl`` always. Each NVML counter goes
through :func:`nvml_or_none`, so a counter the GPU lacks (NVLink, power, clock-event
reasons) is null and never stops the sampler. Without NVML there is one notice and host
samples only. Rows are written (and flushed) as they are taken, so a crash keeps them.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from gpudiag import rundir
from gpudiag.capture import threads

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
        self._proc: _ProcStat | None = None
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
        try:
            self._proc = _ProcStat() if _ProcStat.usable() else None
        except OSError:
            self._proc = None
        self._thread = threads.start(self._run, "gpudiag-sampler")

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        for writer in (self._gpu_writer, self._host_writer):
            if writer is not None:
                writer.close()
        if self._proc is not None:
            self._proc.close()
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
        if self._proc is not None:
            try:
                return self._proc.host_row(t_ns, self._pids())
            except (OSError, ValueError, IndexError, KeyError):  # no usable /proc: psutil
                self._proc.close()
                self._proc = None
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

    def _pids(self) -> list[int]:
        try:
            return list(self.pids_provider())
        except Exception:  # noqa: BLE001 - a provider bug must not kill sampling
            return []

    def _process_totals(self) -> tuple[float | None, int | None]:
        """Summed cpu% and RSS of the workers (None when there are none to see)."""
        import psutil

        pids = self._pids()
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


class _ProcStat:
    """The host row from /proc directly (Linux): the same figures as psutil's
    ``cpu_percent``, ``virtual_memory`` and ``Process.cpu_percent``/``memory_info``, with
    the files kept open and re-read with one ``pread`` each (3 + one per worker). psutil
    opened, read and parsed ~8 files per sample: ~280 µs of CPU per sample, ten times a
    second, in the launcher, on the ranks' cores; this takes ~50 µs."""

    def __init__(self) -> None:
        self._tick = float(os.sysconf("SC_CLK_TCK"))
        self._page = os.sysconf("SC_PAGE_SIZE")
        self._stat = os.open("/proc/stat", os.O_RDONLY | os.O_CLOEXEC)
        self._meminfo = os.open("/proc/meminfo", os.O_RDONLY | os.O_CLOEXEC)
        self._host: tuple[int, int] | None = None  # (busy, total) jiffies at the last row
        self._procs: dict[int, tuple[int, float, float]] = {}  # pid -> (fd, monotonic, cpu s)

    @staticmethod
    def usable() -> bool:
        return os.path.exists("/proc/stat") and os.path.exists("/proc/meminfo")

    def close(self) -> None:
        for fd in [self._stat, self._meminfo] + [v[0] for v in self._procs.values()]:
            try:
                os.close(fd)
            except OSError:
                pass
        self._procs = {}

    def host_row(self, t_ns: int, pids: list[int]) -> dict[str, Any]:
        proc_cpu, proc_rss = self._process_totals(pids)
        total_mem, available = self._memory()
        return {
            "t_ns": t_ns,
            "cpu_percent": self._cpu_percent(),
            "mem_used": total_mem - available,
            "mem_total": total_mem,
            "proc_cpu_percent": proc_cpu,
            "proc_rss": proc_rss,
        }

    def _cpu_percent(self) -> float:
        """Busy share of all CPUs since the last row (psutil: guest time is inside
        user/nice; idle and iowait are not busy)."""
        line = os.pread(self._stat, 256, 0).split(b"\n", 1)[0]
        fields = [int(v) for v in line.split()[1:9]]
        total = sum(fields)
        busy = total - fields[3] - fields[4]
        before, self._host = self._host, (busy, total)
        if before is None or total <= before[1]:
            return 0.0
        return round(100.0 * max(busy - before[0], 0) / (total - before[1]), 1)

    def _memory(self) -> tuple[int, int]:
        values: dict[bytes, int] = {}
        for line in os.pread(self._meminfo, 512, 0).split(b"\n")[:6]:
            key, _, rest = line.partition(b":")
            if rest:
                values[key] = int(rest.split()[0]) * 1024
        available = values.get(b"MemAvailable")
        if available is None:
            available = sum(values.get(k, 0) for k in (b"MemFree", b"Buffers", b"Cached"))
        return values[b"MemTotal"], available

    def _process_totals(self, pids: list[int]) -> tuple[float | None, int | None]:
        """Summed cpu% (of one core, since the last row) and RSS of the workers; a
        worker seen for the first time counts its RSS and 0 % (psutil's first call)."""
        if not pids:
            return None, None
        cpu = 0.0
        rss = 0
        now = time.monotonic()
        seen: dict[int, tuple[int, float, float]] = {}
        for pid in pids:
            before = self._procs.pop(pid, None)
            fd = before[0] if before is not None else _open_stat(pid)
            if fd is None:
                continue
            try:
                fields = os.pread(fd, 1024, 0).rsplit(b")", 1)[1].split()
                cpu_s = (int(fields[11]) + int(fields[12])) / self._tick
                rss += int(fields[21]) * self._page
            except (OSError, IndexError, ValueError):  # gone
                os.close(fd)
                continue
            if before is not None and now > before[1]:
                cpu += 100.0 * max(cpu_s - before[2], 0.0) / (now - before[1])
            seen[pid] = (fd, now, cpu_s)
        for fd, _, _ in self._procs.values():  # workers no longer listed
            os.close(fd)
        self._procs = seen
        return round(cpu, 1), rss


def _open_stat(pid: int) -> int | None:
    try:
        return os.open(f"/proc/{pid}/stat", os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None
