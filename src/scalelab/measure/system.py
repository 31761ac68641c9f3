"""System sampler: CPU, memory, network bytes and (with NVML) GPU, sampled on a thread during every run.

With `machine` (one rank per host) each sample also holds what the whole machine did: cumulative busy, steal and
total CPU seconds, the run's own processes' CPU seconds and the load average (scalelab.measure.machine), from
which analysis.noise tells how much CPU was taken outside the run."""
from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path

import psutil

from scalelab.measure.machine import RunCpu, machine_sample
from scalelab.store.files import write_jsonl_atomic


def _nvml_reader(device_index: int) -> Callable[[], dict] | None:
    """A function returning GPU utilisation and memory, or None when NVML is not there."""
    try:
        import pynvml  # optional: nvidia-ml-py

        pynvml.nvmlInit()
        handle = pynvml.nvmlDeviceGetHandleByIndex(device_index)
    except Exception:  # no library, no driver, no GPU: GPU columns are simply absent
        return None

    def read() -> dict:
        util = pynvml.nvmlDeviceGetUtilizationRates(handle)
        mem = pynvml.nvmlDeviceGetMemoryInfo(handle)
        return {"gpu_util(%)": float(util.gpu), "gpu_mem_used(bytes)": int(mem.used)}

    return read


class SystemSampler:
    """Samples every `interval_s` seconds until stopped; `flush` writes what it has to `path` atomically."""

    def __init__(self, path: Path, interval_s: float = 0.5, *, rank: int = 0, gpu_index: int | None = None,
                 machine: RunCpu | None = None):
        self.path = path
        self.interval_s = interval_s
        self.rank = rank
        self.samples: list[dict] = []
        self._proc = psutil.Process()
        self._gpu = _nvml_reader(gpu_index) if gpu_index is not None else None
        self._machine = machine
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._loop, name="scalelab-sampler", daemon=True)
        self._t0 = time.time()
        self.cpu_s = 0.0  # CPU seconds of the sampling thread: what this measurement costs (benchmarks/overhead*)

    def sample(self) -> dict:
        # the machine's counters first, stamped with their own reading time (scalelab.measure.machine); the rest
        # of the record is cumulative too, but is compared over whole runs, where milliseconds do not matter
        machine = machine_sample(self._machine) if self._machine is not None else {}
        net = psutil.net_io_counters()
        lo = psutil.net_io_counters(pernic=True).get("lo")
        record = {
            "t(s)": time.time() - self._t0,
            "time": time.time(),
            "rank": self.rank,
            "cpu_process(%)": self._proc.cpu_percent(None),
            "cpu_system(%)": psutil.cpu_percent(None),
            "rss(bytes)": self._proc.memory_info().rss,
            "net_sent(bytes)": net.bytes_sent,
            "net_recv(bytes)": net.bytes_recv,
        }
        if lo is not None:
            record["lo_sent(bytes)"] = lo.bytes_sent
            record["lo_recv(bytes)"] = lo.bytes_recv
        if self._gpu:
            record.update(self._gpu())
        if machine:
            record.update(machine, **{"t(s)": machine["time"] - self._t0})
        return record

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            began = time.thread_time()
            rec = self.sample()
            with self._lock:
                self.samples.append(rec)
            self.cpu_s += time.thread_time() - began

    def start(self) -> "SystemSampler":
        self._proc.cpu_percent(None)  # the first call only primes psutil's counters
        psutil.cpu_percent(None)
        with self._lock:
            self.samples.append(self.sample())
        self._thread.start()
        return self

    def flush(self) -> None:
        with self._lock:
            snapshot = list(self.samples)
        write_jsonl_atomic(self.path, snapshot)

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=5)
        with self._lock:
            self.samples.append(self.sample())
        self.flush()
