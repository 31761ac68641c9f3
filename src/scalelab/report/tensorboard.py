"""TensorBoard scalars of a run, written from its stored records when tensorboard is installed (optional)."""
from __future__ import annotations

from pathlib import Path

from scalelab.store import read_json, read_jsonl

STAGES = ("data", "h2d", "forward", "backward", "comm", "optimizer", "eval", "other")


def write_scalars(run_dir: Path) -> Path | None:
    """Rank 0's per-step loss, accuracy, lr, step and stage times (ms), bytes, and the evaluations, into
    `run_dir/tensorboard`. Returns None (and writes nothing) when tensorboard is not installed."""
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError:  # tensorboard is optional: pip install 'scalelab[tensorboard]'
        return None
    steps = run_dir / "steps.rank0.jsonl"
    if not steps.is_file():
        return None
    out = run_dir / "tensorboard"
    writer = SummaryWriter(log_dir=str(out))
    try:
        for rec in read_jsonl(steps):
            s = rec["step"]
            for key in ("loss", "acc", "lr"):
                if key in rec:
                    writer.add_scalar(f"train/{key}", rec[key], s)
            writer.add_scalar("time/step(ms)", 1e3 * rec["wall(s)"], s)
            for stage in STAGES:
                if f"{stage}(s)" in rec:
                    writer.add_scalar(f"stage/{stage}(ms)", 1e3 * rec[f"{stage}(s)"], s)
            if "comm_bytes" in rec:
                writer.add_scalar("comm/bytes", rec["comm_bytes"], s)
        result = run_dir / "result.rank0.json"
        for ev in read_json(result)["evals"] if result.is_file() else []:
            writer.add_scalar("eval/loss", ev["loss"], ev["step"])
            writer.add_scalar("eval/acc", ev["acc"], ev["step"])
    finally:
        writer.close()
    return out
