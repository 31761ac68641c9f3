"""Does scalelab attribute a known, injected truth to the right figure? The scenarios of tests/dist/test_sense_dist.py
and test_blocking_hides_nothing_dist.py, printed with their figures instead of asserted:

- straggler: rank 1's forward sleeps 40 ms more per step (allreduce, 2 ranks): waiting for peers should be ~40 ms,
  communication on the critical path a few ms;
- data wait: every sample sleeps 2 ms in the loader (8 per rank): the data stage should be ~16 ms, nobody waiting
  for a peer;
- blocking: gather/scatter and allreduce beside DDP on the zoo's mlp: a blocking sync's overlap interval should
  reach 0, DDP's may not;
- learning: the MNIST-1D CNN beside a model blind to its input (one learnable score per class), 3 seeds each:
  only the first learned (analysis.learning), the blind one at chance at best;
- link: two namespaced nodes joined by 0.2 Gbit/s tbf links: busbw should stay under 0.025 GB/s.
Each scenario is run `--repeats` times (default 3) and every run is printed (n and spread, never one run).

    python benchmarks/sense.py [--repeats 3] [--only straggler,data,blocking,learning,link]
About 4 minutes at 3 repeats; the link scenario needs root.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "dist"))

import sense_scenarios as sense  # noqa: E402

from scalelab.analysis import keys  # noqa: E402
from scalelab.config import TrainConfig  # noqa: E402
from scalelab.run.execute import execute  # noqa: E402
from scalelab.store import Store  # noqa: E402

SCENARIOS = ("straggler", "data", "blocking", "learning", "link")


def spread(values: list[float]) -> str:
    values = [v for v in values if v is not None]
    if not values:
        return "n/a"
    return (f"median {statistics.median(values):.3g} (min {min(values):.3g}, max {max(values):.3g}, "
            f"n = {len(values)})")


def summaries(cfg: TrainConfig, folder: Path, repeats: int) -> list[dict]:
    store = Store(folder / "store")
    return [execute(cfg, store, say=lambda _: None).summary for _ in range(repeats)]


def straggler(folder: Path, repeats: int) -> None:
    runs = summaries(sense.straggler(folder), folder, repeats)
    print(f"straggler (rank 1 sleeps {1e3 * sense.STRAGGLER_S:.0f} ms more per step, allreduce, 2 ranks)")
    for name, key in (("inside collectives", keys.COMM_TIME_MS), ("waiting for peers", keys.COMM_PEERS_WAIT_MS),
                      ("critical communication", keys.COMM_CRITICAL_MS), ("step", keys.STEP_MEDIAN_MS)):
        print(f"  {name:24s} ms: {spread([r.get(key) for r in runs])}")


def data_wait(folder: Path, repeats: int) -> None:
    runs = summaries(sense.data_wait(folder), folder, repeats)
    injected = 1e3 * sense.DATA_SLEEP_S * sense.PER_RANK_BATCH
    print(f"data wait ({injected:.0f} ms of loading per rank and step, no loader workers, 2 ranks)")
    for name, key in (("data stage", keys.stage_ms("data")), ("waiting for peers", keys.COMM_PEERS_WAIT_MS),
                      ("step", keys.STEP_MEDIAN_MS)):
        print(f"  {name:24s} ms: {spread([r.get(key) for r in runs])}")


def blocking(folder: Path, repeats: int) -> None:
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
    from conftest import run_experiment

    base = TrainConfig(model="mlp", dataset="synthetic", samples=256, eval_samples=16, global_batch=32, steps=14,
                       warmup_steps=2, ranks=2, sample_interval_s=0.5)
    result = run_experiment("strategies", base, Store(folder / "store"), "sense", folder / "out",
                            strategies=["gather_scatter", "allreduce", "ddp"], launches=repeats)
    table = result.tables["compare_strategies"]
    print(f"blocking (zoo mlp, 2 ranks, {repeats} launches each, interleaved)")
    for row in table.to_dict("records"):
        print(f"  {row['sync']:15s} step {row['step(ms)']:.3g} ms, compute {row['compute(ms)']:.3g}, inside "
              f"collectives {row['comm(ms)']:.3g}, critical {row['comm_critical(ms)']:.3g}, waiting for peers "
              f"{row['waiting_for_peers(ms)']:.3g}, exposed {row['exposed_comm(ms)']:.3g} "
              f"({row['exposed_ci_low(ms)']:.3g}–{row['exposed_ci_high(ms)']:.3g}), overlap "
              f"{100 * row['overlap']:.0f} % ({100 * row['overlap_ci_low']:.0f}–{100 * row['overlap_ci_high']:.0f} %)"
              f", blocks {row['blocks']}, quality {row['quality']}")


def learning(folder: Path, repeats: int) -> None:
    from scalelab.analysis.learning import chance_over, over_seeds
    from scalelab.zoo.data import build_data

    seeds = max(2, repeats)
    chance, _ = chance_over(build_data("mnist1d", seed=seed) for seed in range(seeds))
    print(f"learning (MNIST-1D, 1 rank, {sense.LEARN_STEPS} steps of batch 32, {seeds} seeds each; chance "
          f"{100 * chance:.1f} %)")
    for blind in (False, True):
        accs = [summaries(sense.learner(folder, seed, blind=blind), folder, 1)[0][keys.EVAL_ACC]
                for seed in range(seeds)]
        name = "input-blind model" if blind else "CNN"
        print(f"  {name:17s} accuracy {spread(accs)}: {over_seeds(accs, chance).verdict()}")


def link(folder: Path, repeats: int) -> None:
    runs = summaries(sense.shaped_link(folder), folder, repeats)
    print(f"link (2 namespaced nodes, tbf at {sense.LINK_GBPS} Gbit/s = {sense.LINK_GBPS / 8:.3g} GB/s, allreduce)")
    print(f"  busbw GB/s: {spread([r.get(keys.COMM_BUSBW) for r in runs])}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--only", default=",".join(SCENARIOS))
    args = parser.parse_args()
    chosen = [s.strip() for s in args.only.split(",") if s.strip()]
    unknown = set(chosen) - set(SCENARIOS)
    if unknown:
        parser.error(f"--only: {', '.join(sorted(unknown))}; allowed: {', '.join(SCENARIOS)}")
    run = {"straggler": straggler, "data": data_wait, "blocking": blocking, "learning": learning, "link": link}
    with tempfile.TemporaryDirectory(prefix="scalelab-sense-") as tmp:
        for name in chosen:
            folder = Path(tmp) / name
            folder.mkdir()
            run[name](folder, args.repeats)


if __name__ == "__main__":
    main()
