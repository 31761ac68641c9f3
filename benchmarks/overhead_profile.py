"""Where does the measured loop lose time against a bare loop? Both under torch.profiler, steps side by side.

One rank in this process, the same model, data, batch and loader settings as benchmarks/overhead.py (its
`train_config`, and the loader settings scalelab resolves for the device, unless given). Each side runs its
warm-up unprofiled, then `--active` steps profiled (CPU and, on CUDA, device activity); scalelab's loop is the real
one (`execute`), with the profiler's step marker hooked onto its step timer's `start_step`, the bare loop marks its
own steps. Per side it prints, over the profiled steps:
- the host's time per step and the device's busy share (the union of kernel and copy intervals over the span
  from the first step's start to the last one's end): a GPU that waits for its host shows up as a busy share
  below 1 on one side only;
- per step, the calls that make the host wait for the device (cudaStreamSynchronize, cudaEventSynchronize,
  cudaDeviceSynchronize, device-to-host copies) and the number of kernels launched;
- the top operators by self CPU time and by self device time, side by side;
- with `--cprofile`, scalelab's main thread's Python time per function over the same steps (where the host time
  between launches goes: the profiler's step spans hold it as self time, unattributed).
With `--trace DIR` each side's Chrome trace is written there (open in chrome://tracing or Perfetto).

    python benchmarks/overhead_profile.py --device cuda --models resnet18,bncnn
    python benchmarks/overhead_profile.py --models bncnn --active 10     # CPU: host activity only
"""
from __future__ import annotations

import argparse
import cProfile
import dataclasses
import io
import pstats
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import overhead  # noqa: E402  (this folder's benchmark: the shared configs and loader settings)

WAITS = ("cudaStreamSynchronize", "cudaEventSynchronize", "cudaDeviceSynchronize", "cudaMemcpy ", "cudaMemcpyAsync")


def profiler(device: str, warmup: int, active: int, on_ready):
    """Steps 1..warmup unprofiled (the last as the profiler's own warm-up), the next `active` profiled; the run has
    one step more, whose start closes the window, so no set-up or summary lands in a profiled step."""
    from torch.profiler import ProfilerActivity, profile, schedule

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device == "cuda" else [])
    return profile(activities=activities, on_trace_ready=on_ready, record_shapes=False, with_stack=False,
                   schedule=schedule(wait=max(0, warmup - 1), warmup=1, active=active, repeat=1))


def bare_side(cfg, prof) -> None:
    """The bare loop of benchmarks/overhead.py's bare_worker on one rank (no process group), marking its steps."""
    import torch
    from torch.utils.data import DataLoader, RandomSampler

    from scalelab.train.setup import build_inputs, build_optimizer

    dev = torch.device(cfg.device)
    bundle, model = build_inputs(cfg)
    model = model.to(dev)
    opt = build_optimizer(model, cfg)
    workers, pinned = cfg.num_workers or 0, bool(cfg.pin_memory)
    loader = DataLoader(bundle.train, batch_size=cfg.per_rank_batch, sampler=RandomSampler(bundle.train),
                        drop_last=True, num_workers=workers, pin_memory=pinned and dev.type == "cuda")
    with prof:
        prof.step()  # a profiler step starts with each loop step
        for _ in overhead.bare_steps(loader, model, opt, dev, pinned, cfg.steps):
            prof.step()
        if dev.type == "cuda":
            torch.cuda.synchronize()


def scalelab_side(cfg, prof, store, python: cProfile.Profile | None = None, first: int = 0) -> None:
    """scalelab's own loop (execute: one rank runs in this process), the profiler stepped at each step's start;
    `python`: also a Python profile of the main thread from step `first` + 1 to the profiler's last step."""
    from scalelab.measure.timer import StepTimer
    from scalelab.run.execute import execute

    original = StepTimer.start_step
    seen = [0]

    def start_step(self, *args, **kwargs):
        seen[0] += 1
        prof.step()  # the last one hands the trace over (compare's `ready` stops the Python profile first)
        if python is not None and seen[0] == first + 1:
            python.enable()
        return original(self, *args, **kwargs)

    StepTimer.start_step = start_step
    try:
        with prof:
            execute(cfg, store, say=lambda s: None)
    finally:
        StepTimer.start_step = original


def figures(prof) -> dict:
    """Per profiled step: host time, the device's busy share, waits and kernels; the operator tables."""
    from torch.autograd import DeviceType

    events = prof.events()
    steps = sorted((e for e in events if e.name.startswith("ProfilerStep")), key=lambda e: e.time_range.start)
    if not steps:
        return {}
    begin, end = steps[0].time_range.start, steps[-1].time_range.end
    device = sorted((e.time_range.start, e.time_range.end) for e in events
                    if e.device_type == DeviceType.CUDA and begin <= e.time_range.start < end)
    busy, last = 0.0, begin
    for s, t in device:  # the union of device intervals
        s = max(s, last)
        if t > s:
            busy += t - s
            last = t
    n = len(steps)
    waits = {w.strip(): sum(1 for e in events if e.name == w.strip() and begin <= e.time_range.start < end) / n
             for w in WAITS}
    kernels = sum(1 for e in events if e.name == "cudaLaunchKernel" and begin <= e.time_range.start < end) / n
    return {"steps": n, "host_ms": (end - begin) / 1e3 / n, "busy": busy / (end - begin) if device else None,
            "waits": {k: v for k, v in waits.items() if v}, "kernels": kernels}


def top(prof, device: str, k: int) -> tuple[list[str], list[str]]:
    table = prof.key_averages()
    by_cpu = sorted(table, key=lambda e: e.self_cpu_time_total, reverse=True)[:k]
    cpu = [f"{e.key[:44]:44s} {e.self_cpu_time_total / 1e3:9.1f} ms {e.count:6d}x" for e in by_cpu]
    if device != "cuda":
        return cpu, []
    by_dev = sorted(table, key=lambda e: getattr(e, "self_device_time_total", 0.0), reverse=True)[:k]
    dev = [f"{e.key[:44]:44s} {e.self_device_time_total / 1e3:9.1f} ms {e.count:6d}x" for e in by_dev]
    return cpu, dev


def compare(model: str, device: str, active: int, store, trace: Path | None, k: int, loader,
            cprofile: bool = False) -> None:
    workers, pinned = loader
    batch, _, warmup = overhead.SHAPES[model, device]
    cfg = overhead.train_config(model, device, workers, pinned)
    steps = warmup + active + 1
    python = cProfile.Profile() if cprofile else None
    cfg = dataclasses.replace(cfg, steps=steps, samples=batch * steps, ranks=1)
    out = {}
    for side in ("bare", "scalelab"):
        def ready(prof, side=side):
            if python is not None:
                python.disable()  # the profile's own parsing is no step's work
            out[side] = (figures(prof), *top(prof, device, k))
            if trace:
                trace.mkdir(parents=True, exist_ok=True)
                prof.export_chrome_trace(str(trace / f"{model}-{side}.json"))

        prof = profiler(device, warmup, active, ready)
        began = time.perf_counter()
        if side == "bare":
            bare_side(cfg.resolved(), prof)
        else:
            scalelab_side(cfg, prof, store, python, warmup)
        print(f"  ({side}: {time.perf_counter() - began:.1f} s with set-up)", flush=True)
    print(f"\n== {model} on {device}, batch {batch}, {workers} loader workers, {'pinned' if pinned else 'not pinned'}:"
          f" {active} profiled steps after {warmup}")
    for side, (f, _, _) in out.items():
        busy = f"device busy {100 * f['busy']:.1f} %" if f.get("busy") is not None else "no device activity"
        print(f"{side:9s} host {f.get('host_ms', float('nan')):7.2f} ms/step, {busy}, kernels/step "
              f"{f.get('kernels', 0):.0f}, waits/step {f.get('waits', {})}")
    if python is not None:  # the loop's Python, function by function (cProfile inflates Python-heavy code alike)
        text = io.StringIO()
        pstats.Stats(python, stream=text).sort_stats("tottime").print_stats(k)
        print(f"scalelab's main thread, Python time over the {active} profiled steps (tottime; / {active} per step):")
        print("\n".join(line for line in text.getvalue().splitlines() if line.strip())[-3000:])
    for i, title in ((1, "self CPU"), (2, "self device")):
        if not out["bare"][i]:
            continue
        print(f"top {k} by {title} time (whole profiled stretch):  bare | scalelab")
        for a, b in zip(out["bare"][i], out["scalelab"][i]):
            print(f"  {a}  |  {b}")
    sys.stdout.flush()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", default="resnet18,bncnn")
    p.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    p.add_argument("--active", type=int, default=20, help="profiled steps per side")
    p.add_argument("--top", type=int, default=12)
    p.add_argument("--loaders", default="resolved", choices=("resolved", "both"))
    p.add_argument("--loader", action="append", metavar="WORKERS,pinned|plain",
                   help="profile at these loader settings instead (repeatable), as in benchmarks/overhead.py")
    p.add_argument("--trace", type=Path, help="write each side's Chrome trace here")
    p.add_argument("--cprofile", action="store_true",
                   help="also the Python time of scalelab's main thread per function over the profiled steps")
    args = p.parse_args()
    from scalelab.store import Store

    with tempfile.TemporaryDirectory() as tmp:
        store = Store(Path(tmp) / "store")
        settings = ([(int(w), p == "pinned") for w, p in (x.split(",") for x in args.loader)] if args.loader
                    else overhead.loader_settings(args.device, args.loaders))
        for loader in settings:
            for model in args.models.split(","):
                compare(model, args.device, args.active, store, args.trace, args.top, loader, args.cprofile)


if __name__ == "__main__":
    main()
