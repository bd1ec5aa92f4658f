"""Each node's clock offset to node 0, measured at start-up through the rendezvous.

Every time in a run directory is the epoch time of the host that observed it
(docs/run-format.md). Across hosts those clocks differ by whatever NTP leaves (often
milliseconds, sometimes far more), which is as large as the straggler lateness the
analysis measures. So, once torchrun's rendezvous is complete, the elastic agent of
each node (:mod:`gpudiag.capture.agent`) opens its own client connection to the
rendezvous's TCPStore and, in a background thread (the workers start without waiting):

- node 0 publishes a job id and answers time requests: it waits for ticket t, stamps
  its clock, and writes the stamp back;
- node K > 0 does :data:`ROUNDS` round trips: t0 (its clock), ticket and request, node
  0's stamp s, t3 (its clock). NTP's estimate ``offset = s - (t0 + t3) / 2`` is within
  half the round trip of the truth; the round with the smallest round trip is kept.

The result (``offset_ns``: add it to a node's times to get node 0's clock;
``uncertainty_ns``: half the best round trip) goes to ``node<K>/clock.json``; the
launcher copies it into the node's manifest and the reader applies it
(:func:`gpudiag.rundir.load_run`). Nothing here can fail the job: every error ends the
measurement and is recorded as ``error``.

``GPUDIAG_TEST_CLOCK_SHIFT_NS`` (tests only) shifts every clock reading of a node's
gpudiag processes (Python's ``time.time_ns``/``time.time``, the Flight Recorder's and
the profiler's stamps) by that many ns: a skewed host simulated on one machine.
"""

from __future__ import annotations

import os
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

from gpudiag.capture import threads

ENV_TEST_SHIFT = "GPUDIAG_TEST_CLOCK_SHIFT_NS"
ROUNDS = 16
TIMEOUT_S = 60.0  # how long node 0 answers, and node K waits for node 0's job id
KEY = "gpudiag/clock"
METHOD = "tcpstore_ntp"


# --------------------------------------------------------------------------- test shift


def test_shift_ns() -> int:
    try:
        return int(os.environ.get(ENV_TEST_SHIFT, "0") or 0)
    except ValueError:
        return 0


def install_test_shift() -> int:
    """Shift this process's ``time.time_ns``/``time.time`` by the test shift (once)."""
    shift = test_shift_ns()
    if not shift or getattr(time.time_ns, "_gpudiag_shift", None) is not None:
        return shift
    real_ns, real_s = time.time_ns, time.time

    def time_ns() -> int:
        return real_ns() + shift

    def time_s() -> float:
        return real_s() + shift / 1e9

    time_ns._gpudiag_shift = shift  # type: ignore[attr-defined]
    time.time_ns = time_ns
    time.time = time_s
    return shift


# --------------------------------------------------------------------------- exchange


def _tcp_address(store: Any) -> tuple[str, int] | None:
    """The host and port of the TCPStore under a rendezvous store (PrefixStores
    unwrapped), or None for another kind of store."""
    seen = 0
    while store is not None and seen < 8:
        host, port = getattr(store, "host", None), getattr(store, "port", None)
        if isinstance(host, str) and isinstance(port, int) and port > 0:
            return host, port
        store = getattr(store, "underlying_store", None)
        seen += 1
    return None


def _client(address: tuple[str, int], timeout_s: float) -> Any:
    from datetime import timedelta

    from torch.distributed import TCPStore

    return TCPStore(address[0], address[1], is_master=False, timeout=timedelta(seconds=timeout_s))


def serve(store: Any, job_id: str, requests: int, deadline: float) -> int:
    """Node 0: publish the job id, then answer ``requests`` time requests (tickets 1..)
    until ``deadline`` (monotonic). Returns the number answered."""
    store.set(f"{KEY}/job_id", job_id)
    answered = 0
    for ticket in range(1, requests + 1):
        if time.monotonic() > deadline:
            break
        store.wait([f"{KEY}/req/{ticket}"])
        store.set(f"{KEY}/resp/{ticket}", str(time.time_ns()))
        answered += 1
    return answered


def measure(store: Any, rounds: int = ROUNDS) -> dict[str, Any]:
    """Node K > 0: ``rounds`` round trips; the minimum-round-trip NTP estimate."""
    job_id = store.get(f"{KEY}/job_id").decode()
    best: tuple[int, int] | None = None  # (rtt, offset)
    rtts = []
    for _ in range(rounds):
        ticket = store.add(f"{KEY}/ticket", 1)
        t0 = time.time_ns()
        store.set(f"{KEY}/req/{ticket}", "1")
        stamp = int(store.get(f"{KEY}/resp/{ticket}").decode())
        t3 = time.time_ns()
        rtt = t3 - t0
        rtts.append(rtt)
        offset = stamp - (t0 + t3) // 2
        if best is None or rtt < best[0]:
            best = (rtt, offset)
    assert best is not None
    return {
        "job_id": job_id,
        "offset_ns": best[1],
        "uncertainty_ns": best[0] // 2,
        "rtt_ns_min": best[0],
        "rtt_ns_median": sorted(rtts)[len(rtts) // 2],
        "rounds": rounds,
    }


def exchange(
    rdzv_store: Any,
    node: int,
    nnodes: int,
    on_record: Callable[[dict[str, Any]], None],
    timeout_s: float = TIMEOUT_S,
) -> None:
    """Measure this node's clock record (see the module doc) and hand it to
    ``on_record``; node 0 hands it over twice (once its job id is published, once it
    has answered every request). Never raises."""
    record: dict[str, Any] = {
        "node_rank": node,
        "reference_node": 0,
        "method": METHOD,
        "offset_ns": 0 if node == 0 else None,
        "t_ns": time.time_ns(),
    }
    try:
        address = _tcp_address(rdzv_store)
        if address is None:
            raise RuntimeError("the rendezvous store is not a TCPStore")
        store = _client(address, timeout_s)
        if node == 0:
            record["job_id"] = uuid.uuid4().hex
            store.set(f"{KEY}/job_id", record["job_id"])
            _hand(on_record, record)
            requests = ROUNDS * max(nnodes - 1, 0)
            record["answered"] = serve(
                store, record["job_id"], requests, time.monotonic() + timeout_s
            )
        else:
            record.update(measure(store))
    except Exception as exc:  # noqa: BLE001 - the measurement must never reach the job
        text = str(exc).splitlines()[0][:200] if str(exc) else ""
        record["error"] = f"{type(exc).__name__}: {text}"
    _hand(on_record, record)


def _hand(on_record: Callable[[dict[str, Any]], None], record: dict[str, Any]) -> None:
    try:
        on_record(dict(record))
    except Exception:  # noqa: BLE001
        pass


def start(
    rdzv_store: Any,
    node: int,
    nnodes: int,
    on_record: Callable[[dict[str, Any]], None],
    timeout_s: float = TIMEOUT_S,
) -> threading.Thread:
    """Run :func:`exchange` in a daemon thread (the workers do not wait for it)."""
    return threads.start(
        exchange, "gpudiag-clock", args=(rdzv_store, node, nnodes, on_record, timeout_s)
    )
