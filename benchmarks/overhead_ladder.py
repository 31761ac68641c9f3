"""The parts of scalelab's step that overhead_ablation.py keeps in both states, each added alone to a bare DDP
step, in alternating blocks within one launch.

The ablation switches scalelab's measurements off and on; what it cannot switch off is how scalelab's loop is
built: its data loader (ShardedBatchSampler), its loss (cross-entropy plus the count of correct predictions), its
DDP comm hook (scalelab's Python hook behind the CommMeter, and the metered buffer broadcast) and its learning-rate
update. Here one launch of 2 gloo ranks holds a bare DDP step (DataLoader with a DistributedSampler, plain DDP,
cross-entropy, SGD) and four variants that each swap in one of those parts. Blocks of `k` steps rotate through the
variants, the order shifted every round; a variant's cost in a round is its block's step time over the mean of the
bare blocks beside it, minus 1. The hook variant trains a second copy of the model under its own DDP (DDP accepts
one hook, and a hook cannot be removed), so both models take the same steps. Printed: the median cost per variant
over the rounds, with a 95 % bootstrap interval.

    python benchmarks/overhead_ladder.py [--model bncnn] [--rounds 12] [--block 20]
"""
from __future__ import annotations

import argparse
import copy
import json
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from overhead import launch, median_interval, train_config  # noqa: E402

VARIANTS = ("bare", "hook", "loader", "loss", "lr")


def ladder_worker(model_name: str, rounds: int, block: int, out: str) -> None:
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    from torch.nn.parallel import DistributedDataParallel as DDP
    from torch.utils.data import DataLoader, DistributedSampler

    from scalelab.config import default_threads
    from scalelab.distenv import dist_context
    from scalelab.sync.ddp import DDPSync
    from scalelab.sync.meter import CommMeter
    from scalelab.train.loop import loss_and_correct, make_loader
    from scalelab.train.lr import lr_at, set_lr
    from scalelab.train.setup import build_inputs, build_optimizer

    cfg = train_config(model_name)
    dist.init_process_group("gloo")
    ctx = dist_context("cpu")
    torch.set_num_threads(default_threads(ctx.world))
    bundle, model = build_inputs(cfg)
    twin = copy.deepcopy(model)
    bare_net, bare_opt = DDP(model), build_optimizer(model, cfg)
    meter = CommMeter(ctx.world)
    hooked = DDPSync(twin, ctx, meter, bucket_mb=cfg.bucket_mb)
    hook_net, hook_opt = hooked.wrap(), build_optimizer(twin, cfg)
    sampler = DistributedSampler(bundle.train, ctx.world, ctx.rank, seed=cfg.seed, drop_last=True)
    plain_loader = DataLoader(bundle.train, batch_size=cfg.per_rank_batch, sampler=sampler, drop_last=True)
    own_loader, own_sampler = make_loader(bundle.train, cfg, ctx)
    streams = {"plain": (plain_loader, sampler, iter(plain_loader)), "own": (own_loader, own_sampler, iter(own_loader))}
    step = 0

    def batch(kind: str):
        loader, smp, it = streams[kind]
        try:
            return next(it)
        except StopIteration:
            smp.set_epoch(step)
            it = iter(loader)
            streams[kind] = (loader, smp, it)
            return next(it)

    def run_step(variant: str) -> None:
        nonlocal step
        net, opt = (hook_net, hook_opt) if variant == "hook" else (bare_net, bare_opt)
        x, y = batch("own" if variant == "loader" else "plain")
        logits = net(x)
        loss = loss_and_correct(logits, y)[0] if variant == "loss" else F.cross_entropy(logits, y)
        loss.backward()
        if variant == "lr":
            set_lr(opt, lr_at(step, rule=cfg.lr_rule, base_lr=cfg.lr, base_batch=cfg.base_batch or cfg.global_batch,
                              batch=cfg.global_batch, warmup=cfg.lr_warmup_steps))
        opt.step()
        opt.zero_grad(set_to_none=True)
        if variant == "hook":
            meter.take_step()
        step += 1

    for variant in VARIANTS:  # warm-up: every path once, DDP's bucket rebuild included
        for _ in range(5):
            run_step(variant)
    blocks = []
    for r in range(rounds):
        order = VARIANTS[r % len(VARIANTS):] + VARIANTS[:r % len(VARIANTS)]
        for variant in order:
            dist.barrier()
            began = time.perf_counter()
            for _ in range(block):
                run_step(variant)
            blocks.append({"round": r, "variant": variant, "s_per_step": (time.perf_counter() - began) / block})
    if ctx.rank == 0:
        Path(out).write_text(json.dumps(blocks))
    dist.destroy_process_group()


def costs(blocks: list[dict], rounds: int) -> dict[str, list[float]]:
    """Per round, each variant's step time over the mean of that round's bare blocks, minus 1."""
    out: dict[str, list[float]] = {v: [] for v in VARIANTS if v != "bare"}
    for r in range(rounds):
        mine = {b["variant"]: b["s_per_step"] for b in blocks if b["round"] == r}
        for variant in out:
            out[variant].append(mine[variant] / mine["bare"] - 1)
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="bncnn", help="resnet18 or bncnn")
    p.add_argument("--rounds", type=int, default=12)
    p.add_argument("--block", type=int, default=20, help="steps per block")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--out", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.worker:
        ladder_worker(args.model, args.rounds, args.block, args.out)
        return
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "blocks.json"
        launch(__file__, ["--worker", "--model", args.model, "--rounds", str(args.rounds), "--block",
                          str(args.block), "--out", str(out)])
        blocks = json.loads(out.read_text())
    bare = sorted(b["s_per_step"] for b in blocks if b["variant"] == "bare")
    print(f"{args.model}: bare step {1e3 * bare[len(bare) // 2]:.1f} ms (median of {len(bare)} blocks of "
          f"{args.block} steps)")
    for variant, values in costs(blocks, args.rounds).items():
        med, low, high = median_interval(values)
        print(f"  {variant:7s} cost {100 * med:+6.2f} %  95 % interval [{100 * low:+.2f}, {100 * high:+.2f}] "
              f"over {len(values)} rounds")


if __name__ == "__main__":
    sys.exit(main())
