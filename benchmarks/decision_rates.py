"""The decision rule's own error rates (scalelab.lab.decision), measured: each repetition runs the whole sequential
procedure the study uses (first look at `--launches` launches per side; while undecided, a top-up to
decision.next_launches: the launches the card asks for and a fifth more, at most 3x and MAX_LAUNCHES; at most
MAX_LOOKS looks), and its final answer is counted.

- A/A: two identical configurations: how often "beats" or "worse" is said (a false decision);
- A/B: B's step `--effect` (10 %) longer than A's: how often A is decided better (right direction) and how often
  worse (wrong direction), within the quick (`--looks 1`-like budgets: first look only) and the full procedure.

Simulated (`--sims`, default 2000 each): launches drawn from the noise model the study fitted (ln launch median ~
N(mu, sigma^2), `--sigma`; round-to-round drift common to both sides, `--drift`), the pool made of `--pool-cells`
other cells of 2 launches each, as the quick study has; the real rule code decides (`decide` under `pooled`).
Real (`--real N`, optional): N repetitions of real 2-rank cells launched through the study's cell engine in
interleaved rounds, each cell a fresh seed. The effect is known by construction: the cells sync with the blocking
`allreduce` strategy (one collective per parameter tensor after backward, 8 for the CNN: nothing hides them), and
every collective is held to a floor (`net_latency_ms`: the meter waits until that much has passed since launch);
A's floor `--latency-ms`, B's `--latency-b-ms`, both above what a small tensor's allreduce takes on loopback, so
B's step is longer by 8 x the difference (2.4 ms, about 10 % of a 23 ms step). A/A runs A twice.
Rates come with Clopper-Pearson 95 % intervals (scipy.stats.beta).

    python benchmarks/decision_rates.py --sigma 0.10 --sims 2000
    python benchmarks/decision_rates.py --real 5 --sims 0          # real repetitions only (minutes on 2 cores)
    python benchmarks/decision_rates.py --real 20 --real-aa 0 --sims 2000  # real A/B, then simulated at its noise
"""
from __future__ import annotations

import argparse
import math
import os
import sys
import tempfile

import numpy as np
from scipy.stats import beta

from scalelab.analysis.noise import fit
from scalelab.lab.decision import BETTER, MAX_LOOKS, UNDECIDED, WORSE, Side, decide, next_launches, pooled


def clopper_pearson(k: int, n: int, level: float = 0.95) -> tuple[float, float]:
    a = (1 - level) / 2
    return (0.0 if k == 0 else float(beta.ppf(a, k, n - k + 1)),
            1.0 if k == n else float(beta.ppf(1 - a, k + 1, n - k)))


def side(label: str, launches: list[float]) -> Side:
    """A side as a table row gives it: the headline (median of launch medians), its interval reaching every
    launch median (analysis.repeats), n launches, and the launch medians themselves."""
    values = np.asarray(launches)
    return Side(label, float(np.median(values)), (float(values.min()), float(values.max())), len(values),
                None, "ok", 6 * len(values), tuple(float(v) for v in values))


def procedure(draw, pool_cells: list, n0: int, looks: int, tell: bool = False):
    """The sequential procedure on one pair: `draw(k)` gives k more launches of (A, B) in rounds; its verdict
    (with `tell`, and the launches each side had)."""
    a, b = draw(n0)
    for look in range(1, looks + 1):
        model = fit([*pool_cells, ("A", a, math.nan, 0), ("B", b, math.nan, 0)])
        with pooled(model):
            d = decide(side("A", a), side("B", b), question="x")
        target = next_launches(d.more, len(a)) if d.more else len(a)
        if d.verdict != UNDECIDED or look == looks or target <= len(a):
            break
        more_a, more_b = draw(target - len(a))
        a, b = a + more_a, b + more_b
    return (d.verdict, len(a)) if tell else d.verdict


def simulate(args, effect: float, looks: int, rng) -> dict:
    counts = {BETTER: 0, WORSE: 0, "equivalent": 0, UNDECIDED: 0}
    for _ in range(args.sims):
        pool_cells = [(f"c{i}", list(np.exp(rng.normal(3.0, args.sigma, 2))), math.nan, 0)
                      for i in range(args.pool_cells)]

        def draw(k):
            drift = rng.normal(0.0, args.drift, k)
            a = np.exp(4.0 + drift + rng.normal(0, args.sigma, k))
            b = np.exp(4.0 + math.log(1 + effect) + drift + rng.normal(0, args.sigma, k))
            return list(a), list(b)
        counts[procedure(draw, pool_cells, args.launches, looks)] += 1
    return counts


def fitted_noise(reps: list[tuple[list[float], list[float]]]) -> tuple[float, float, int]:
    """(sigma, drift, dof) of the simulation's model fitted to real repetitions, each the launch medians of A and B
    in rounds: var(ln a - ln b) = 2 sigma^2 within a round (the drift cancels), var(ln a) = sigma^2 + drift^2;
    each pooled over the repetitions on n - 1 degrees of freedom."""
    dof = sum(len(a) - 1 for a, _ in reps)
    diff = sum(np.var(np.log(a) - np.log(b), ddof=1) * (len(a) - 1) for a, b in reps) / dof / 2
    side = sum((np.var(np.log(a), ddof=1) + np.var(np.log(b), ddof=1)) / 2 * (len(a) - 1) for a, b in reps) / dof
    return math.sqrt(diff), math.sqrt(max(0.0, side - diff)), dof


def real(args, effect: float, looks: int, repetitions: int | None = None, seen: list | None = None) -> dict:
    """Real launches through the cell engine (a fresh store): A and B interleaved in rounds, each repetition its
    own seeds (so no cell is reused)."""
    from scalelab.analysis.summary import timed_step_ms
    from scalelab.config import TrainConfig
    from scalelab.lab.cells import Cell, Cells
    from scalelab.lab.progress import PlainProgress
    from scalelab.store import Store

    from scalelab.run import warm

    counts = {BETTER: 0, WORSE: 0, "equivalent": 0, UNDECIDED: 0}
    # warm ranks, as the study runs its cells: a launch costs its steps, not a process start
    with tempfile.TemporaryDirectory(prefix="scalelab-decision-rates-") as tmp, warm.ranks() as pools:
        pools.start_zygote()
        pools.zygote_ready()
        cells = Cells(Store(tmp), "rates", progress=PlainProgress(lambda line: None))
        repetitions = args.real if repetitions is None else repetitions
        for rep in range(repetitions):
            base = dict(model=args.model, dataset="synthetic", samples=4096, global_batch=args.batch,
                        steps=args.steps, warmup_steps=2, ranks=2, sync="allreduce", net_latency_ms=args.latency_ms)
            cfg_a = TrainConfig.from_dict({**base, "seed": 1000 + 2 * rep})
            cfg_b = TrainConfig.from_dict({**base, "seed": 1001 + 2 * rep,
                                           **({"net_latency_ms": args.latency_b_ms} if effect else {})})
            have = {"n": 0, "a": [], "b": []}

            def draw(k):
                have["n"] += k
                res = cells.run([Cell("A", cfg_a, repeats=have["n"]), Cell("B", cfg_b, repeats=have["n"])],
                                group=f"rep{rep}", interleave=True)
                runs = cells.runs(res, all_repeats=True)
                medians = {}
                for r in runs:
                    medians.setdefault(r["config"]["seed"], []).append(float(np.median(
                        timed_step_ms(r["files"].read_steps()))))
                a, b = medians[cfg_a.seed], medians[cfg_b.seed]
                have["a"], have["b"] = a, b
                return a[-k:], b[-k:]
            verdict, n = procedure(draw, [], args.launches, looks, tell=True)
            counts[verdict] += 1
            if seen is not None:
                seen.append((list(have["a"]), list(have["b"])))
            ratio = math.exp(np.mean(np.log(have["b"])) - np.mean(np.log(have["a"])))
            print(f"  real {'A/B' if effect else 'A/A'} repetition {rep + 1}/{repetitions}: {verdict} after {n} "
                  f"launches each; B/A step {ratio:.3f} (geometric means, A {np.median(have['a']):.1f} ms); "
                  f"load {os.getloadavg()[0]:.1f}",
                  file=sys.stderr, flush=True)
    return counts


def table(title: str, rows: list[tuple[str, dict]], right: str | None) -> None:
    print(f"\n{title}")
    print("| procedure | n | beats | worse | equivalent | undecided | rate (95 % Clopper-Pearson) |")
    print("|---|---|---|---|---|---|---|")
    for name, c in rows:
        n = sum(c.values())
        k = c[BETTER] + c[WORSE] if right is None else c[right]
        lo, hi = clopper_pearson(k, n) if n else (math.nan, math.nan)
        what = "false decisions" if right is None else "right direction"
        print(f"| {name} | {n} | {c[BETTER]} | {c[WORSE]} | {c['equivalent']} | {c[UNDECIDED]} | "
              f"{what} {k}/{n} = {100 * k / max(n, 1):.1f} % ({100 * lo:.1f}–{100 * hi:.1f} %) |")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sigma", type=float, default=0.10, help="launch-to-launch sd of ln step (the fitted model)")
    p.add_argument("--drift", type=float, default=0.0, help="round-to-round drift sd common to both sides")
    p.add_argument("--pool-cells", type=int, default=20, help="other cells of 2 launches in the pool")
    p.add_argument("--launches", type=int, default=2, help="launches per side at the first look")
    p.add_argument("--effect", type=float, default=0.10, help="A/B: B's step this much longer")
    p.add_argument("--sims", type=int, default=2000)
    p.add_argument("--real", type=int, default=0, help="real repetitions of each of A/A and A/B")
    p.add_argument("--real-aa", type=int, default=None, help="real A/A repetitions (default: --real; 0: none)")
    p.add_argument("--latency-ms", type=float, default=1.0, help="real: A's floor on each collective (ms)")
    p.add_argument("--latency-b-ms", type=float, default=1.3,
                   help="real A/B: B's floor (1.3 ms: 8 collectives x 0.3 ms = 2.4 ms, ~10 %% of a 23 ms step)")
    p.add_argument("--model", default="cnn", help="real: the cells' model (the CNN: 8 parameter tensors)")
    p.add_argument("--batch", type=int, default=64, help="real: the cells' global batch (32 a rank)")
    p.add_argument("--steps", type=int, default=30, help="real: steps a launch (2 of them warm-up)")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()
    rng = np.random.default_rng(args.seed)
    print(f"sigma {args.sigma}, drift {args.drift}, pool {args.pool_cells} cells x 2 launches, first look "
          f"{args.launches} launches per side, effect {100 * args.effect:g} %, max looks {MAX_LOOKS}")
    if args.sims and not args.real:
        table(f"A/A, simulated ({args.sims} repetitions each)",
              [("first look only", simulate(args, 0.0, 1, rng)),
               (f"sequential, {MAX_LOOKS} looks", simulate(args, 0.0, MAX_LOOKS, rng))], None)
        table(f"A/B at {100 * args.effect:g} %, simulated ({args.sims} repetitions each)",
              [("first look only", simulate(args, args.effect, 1, rng)),
               (f"sequential, {MAX_LOOKS} looks", simulate(args, args.effect, MAX_LOOKS, rng))], BETTER)
    real_aa = args.real if args.real_aa is None else args.real_aa
    seen: list = []
    if args.real:  # A/B first: the answer the acceptance asks of the real cells
        table(f"A/B, real ({args.real} repetitions, collective floor {args.latency_ms} ms against "
              f"{args.latency_b_ms} ms)",
              [(f"sequential, {MAX_LOOKS} looks", real(args, args.effect, MAX_LOOKS, seen=seen))], BETTER)
    if real_aa:
        table(f"A/A, real ({real_aa} repetitions)",
              [(f"sequential, {MAX_LOOKS} looks", real(args, 0.0, MAX_LOOKS, real_aa, seen))], None)
    if seen and args.sims:  # the rates at the real cells' own noise, with intervals 20 repetitions cannot give
        sigma, drift, dof = fitted_noise(seen)
        print(f"\nnoise fitted to the real repetitions: sigma {100 * sigma:.1f} %, drift {100 * drift:.1f} % "
              f"({dof} degrees of freedom)")
        fitted = argparse.Namespace(**{**vars(args), "sigma": sigma, "drift": drift})
        table(f"A/A, simulated at the fitted noise ({args.sims} repetitions)",
              [(f"sequential, {MAX_LOOKS} looks", simulate(fitted, 0.0, MAX_LOOKS, rng))], None)
        table(f"A/B at {100 * args.effect:g} %, simulated at the fitted noise ({args.sims} repetitions)",
              [(f"sequential, {MAX_LOOKS} looks", simulate(fitted, args.effect, MAX_LOOKS, rng))], BETTER)


if __name__ == "__main__":
    main()
