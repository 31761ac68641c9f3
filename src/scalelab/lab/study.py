"""`scalelab study`: every experiment on one spec, resumable, then one report.

The spec is plain data (YAML-able): the experiments to run, a base config shared by all, and per-experiment
options, each of which may override base fields with `set:`. `default_spec()` is tuned for the machine at hand:
on a CPU-only box, small models, gloo, 1 and 2 ranks, minutes not hours; `quick` shrinks it further.
Its cells keep fixed `steps`, not `steps: auto`: with dozens of timing cells each taking up to its time budget on a
noisy machine, the quick study would not stay under 150 s (docs/definitions.md, "Run length").

Its decisions read one noise model pooled over every cell of the study (scalelab.analysis.noise.fit, set for the
rest of the process by `run_experiments`: the report's cards read it too). After the last experiment, the time
left in the budget goes to the comparisons still undecided (`top_up`): most promising first (the fewest launches
still needed), each experiment with open questions launched again with more launches per cell (the engine adds
only the missing ones; how many: decision.next_launches; a setting the best already beats beyond noise keeps the
launches it has, `cells.held`: racing), at most MAX_LOOKS - 1 times (the decision rule's Bonferroni over looks
holds the error rate), while the time left covers it. The grown launch counts (and the held ones) are saved in the
study's spec, so that a report re-derived from the stored runs reads the same launches.
"""
from __future__ import annotations

import dataclasses
import math
import time
from dataclasses import dataclass, field
from pathlib import Path

from scalelab.analysis import checks, keys
from scalelab.analysis.noise import NoiseModel, drift, drift_sentence, model_of_tables
from scalelab.config import TrainConfig, cuda_device_count, load_yaml
from scalelab.errors import ConfigError, ScalelabError
from scalelab.lab import registry, results
from scalelab.lab.base import StudyPlan
from scalelab.lab.budget import REFERENCE_S, Budget
from scalelab.lab.cells import held
from scalelab.lab.decision import MAX_LOOKS, UNDECIDED, next_launches, pooled, use_model
from scalelab.lab.progress import PlainProgress, Progress
from scalelab.run import warm
from scalelab.run.execute import RunFailed
from scalelab.store import Store, read_json, write_json_atomic


@dataclass(kw_only=True)
class StudySpec:
    name: str = "default"
    experiments: list[str] = field(default_factory=lambda: list(registry.names()))
    quick: bool = False
    base: dict = field(default_factory=dict)  # TrainConfig fields shared by every experiment
    options: dict = field(default_factory=dict)  # experiment name -> its options (+ "set": config overrides)
    # repeat one reference cell before the first experiment and after the last: its drift is the noise floor
    reference: bool = True
    # experiment -> {cell label: launches}: settings a top-up stopped launching, worse beyond noise (racing)
    held: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name or "/" in self.name:
            raise ConfigError("study.name", self.name, "allowed: a non-empty name without '/'")
        names = registry.names()
        if not isinstance(self.experiments, (list, tuple)):
            raise ConfigError("study.experiments", self.experiments, f"allowed: a list of {', '.join(names)}")
        if not isinstance(self.quick, bool):
            raise ConfigError("study.quick", self.quick, "allowed: true or false")
        if not isinstance(self.reference, bool):
            raise ConfigError("study.reference", self.reference, "allowed: true or false")
        if not isinstance(self.base, dict):
            raise ConfigError("study.base", self.base, "allowed: a mapping of config field: value")
        if not isinstance(self.options, dict):
            raise ConfigError("study.options", self.options, "allowed: a mapping of experiment: options")
        if not isinstance(self.held, dict) or not all(
                isinstance(v, dict) and all(isinstance(n, int) and n >= 1 for n in v.values())
                for v in self.held.values()):
            raise ConfigError("study.held", self.held, "allowed: a mapping of experiment: {cell label: launches}")
        for name in self.experiments:
            if name not in names:
                raise ConfigError("study.experiments", name, f"allowed: {', '.join(names)}")
        for name in self.options:
            if name not in names:
                raise ConfigError("study.options", name, f"allowed keys: {', '.join(names)}")
            opts = self.options[name]
            if not isinstance(opts, dict) or not isinstance(opts.get("set", {}), dict):
                raise ConfigError("study.options", {name: opts}, "allowed: each experiment's options a mapping of "
                                                                 "option: value, its `set:` a mapping of config fields")
            registry.get(name).option_values(opts)  # fail now on a bad option, not after an hour of runs
        TrainConfig.from_dict(self.base)

    def config(self, experiment: str, **extra) -> TrainConfig:
        """The base config with the experiment's `set:` overrides and the caller's extra fields."""
        data = {**self.base, **self.options.get(experiment, {}).get("set", {}), **extra}
        return TrainConfig.from_dict(data)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> "StudySpec":
        known = {f.name for f in dataclasses.fields(cls)}
        for key in data:
            if key not in known:
                raise ConfigError("study", key, f"unknown key; allowed: {', '.join(sorted(known))}")
        options = data.get("options")
        if isinstance(options, dict):  # option names of study files written by scalelab 0.1
            data = {**data, "options": {exp: {LEGACY_OPTIONS.get((exp, k), k): v for k, v in opts.items()}
                                        if isinstance(opts, dict) else opts for exp, opts in options.items()}}
        return cls(**data)


# (experiment, option name in scalelab 0.1) -> its name now
LEGACY_OPTIONS = {("strategies", "names"): "strategies", ("scale", "modes"): "mode"}


def default_spec(quick: bool = False, name: str | None = None) -> StudySpec:
    """The built-in study for this machine: the base config here, each experiment's options from its own module
    (`study_options`); the quick study leaves out those marked `quick=False` (the max-batch search, Horovod,
    the bucket sweep).
    Compute-side experiments use the small CNN on synthetic images; communication-side ones the MLP, whose 25 MB of
    gradients make communication costs visible on loopback."""
    q = quick
    base = {"model": "cnn", "dataset": "synthetic", "samples": 1024 if q else 2048, "eval_samples": 256,
            "global_batch": 64, "steps": 8 if q else 16, "warmup_steps": 2}
    # the default study launches compared cells 3 times: 8 steps each (6 timed) pool to 18 timed steps per cell
    comm_model = {"model": "mlp", "steps": 6 if q else 8}
    plan = StudyPlan(quick=q, gpus=cuda_device_count(), comm_model=comm_model)
    options: dict = {}
    for experiment in registry.experiments().values():
        own = experiment.study_options(plan) if experiment.study_options is not None else {}
        if own is not None:
            options[experiment.name] = own
    names = [e.name for e in registry.experiments().values() if e.name in options and (e.quick or not q)]
    return StudySpec(name=name or ("quick" if q else "default"), quick=q, base=base, options=options,
                     experiments=names)


def load_spec(path: str | Path, *, quick: bool = False) -> StudySpec:
    """A YAML study file: keys of StudySpec; options merge over the defaults experiment by experiment."""
    data = load_yaml(path)
    spec = default_spec(quick=bool(data.get("quick", quick)))
    merged = spec.to_dict()
    for key, value in data.items():
        if key == "options":
            if not isinstance(value, dict):
                raise ConfigError("study.options", value, "allowed: a mapping of experiment: options")
            for exp, opts in value.items():
                if opts is not None and not isinstance(opts, dict):
                    raise ConfigError("study.options", {exp: opts},
                                      "allowed: each experiment's options a mapping of option: value")
                merged["options"].setdefault(exp, {}).update(opts or {})
        elif key == "base":
            if value is not None and not isinstance(value, dict):
                raise ConfigError("study.base", value, "allowed: a mapping of config field: value")
            merged["base"].update(value or {})
        else:
            merged[key] = value
    own_max_batch = (data.get("options") or {}).get("max_batch") or {}
    if merged["base"].get("device") == "cuda" and "memory_limit" not in own_max_batch:
        # the default's CPU cap (an address-space limit) means nothing on a GPU, whose own memory is the limit
        merged["options"].setdefault("max_batch", {})["memory_limit"] = None
    return StudySpec.from_dict(merged)


def spec_path(out_dir: Path) -> Path:
    return out_dir / "study.json"


def save_spec(spec: StudySpec, out_dir: Path, store: Store) -> None:
    write_json_atomic(spec_path(out_dir), {"spec": spec.to_dict(), "store": str(store.root.resolve())})


def read_spec(out_dir: Path) -> tuple[StudySpec, Path]:
    data = read_json(spec_path(out_dir))
    return StudySpec.from_dict(data["spec"]), Path(data["store"])


# The reference cell: the base config on one rank for a few steps (about a second on 2 cores). Its seed is its own
# so it is never the same cell as an experiment's (the engine reuses identical configs across a study).
REFERENCE_GROUP = "reference"
REFERENCE_FIELDS = {"ranks": 1, "nnodes": 1, "steps": 12, "warmup_steps": 2, "seed": 9973}


def reference_cell(spec: StudySpec, repeats: int):
    """The study's reference cell; `repeats` 1 at the start, 2 at the end (the second repeat is a new run)."""
    from scalelab.lab.cells import Cell

    return Cell("reference", TrainConfig.from_dict({**spec.base, **REFERENCE_FIELDS}), repeats=repeats)


def noise_floor(spec: StudySpec, store: Store) -> str | None:
    """The drift of the reference cell between the study's start and end, in one line, from stored runs alone;
    None when the study has no two finished reference runs."""
    from scalelab.lab.cells import Cells, replay_only

    if not spec.reference:
        return None
    cells = Cells(store, spec.name, progress=PlainProgress(lambda line: None))
    with replay_only():
        results = cells.run([reference_cell(spec, 2)], group=REFERENCE_GROUP)
    runs = [r["summary"] for r in cells.runs(results, all_repeats=True)]
    if len(runs) < 2 or not all(keys.STEP_MEDIAN_MS in r for r in runs):
        return None
    start, end = ((r[keys.STEP_MEDIAN_MS], (r[keys.STEP_MEDIAN_CI_LOW_MS], r[keys.STEP_MEDIAN_CI_HIGH_MS]))
                  for r in runs[:2])
    return drift_sentence(drift(start, end), start[0], end[0])


def run_experiments(spec: StudySpec, store: Store, out_dir: Path, progress: Progress | None = None, *,
                    reuse_saved: bool = False, budget_s: float | None = None) -> list[tuple]:
    """Run (or, under cells.replay_only, read back) every experiment of the spec through one cell engine, between
    the two measurements of the reference cell (`noise_floor`); (registry entry, Result) per experiment, in the
    spec's order. Each result is saved in out_dir/results (lab.results) with the study's noise floor. With
    `reuse_saved` (`scalelab report`) a saved result of the code's analysis version is used as it is, and only the
    others are derived again (under replay_only: from the stored runs). `budget_s`: the study sizes what remains to
    finish within it (lab/budget.py); its decisions are saved with the study's figures."""
    from scalelab.lab.base import Context
    from scalelab.lab.cells import Cells

    progress = progress or PlainProgress()
    cells = Cells(store, spec.name, progress=progress)
    folder = results.results_dir(out_dir)
    ctx = Context(cells, folder, progress.say, tables=False)

    plan = Budget(None if reuse_saved else budget_s, spec.experiments, spec.options, quick=spec.quick)

    def reference(repeats: int) -> None:
        if spec.reference and not reuse_saved:
            began = time.monotonic()
            try:
                cells.run([reference_cell(spec, repeats)], group=REFERENCE_GROUP)
            except (RunFailed, ScalelabError, RuntimeError) as err:  # no noise floor then; the study goes on
                progress.say(f"reference cell failed: {str(err).strip()[:200]}")
            plan.finished("reference", time.monotonic() - began)

    with warm.ranks() as pools:  # one set of warm ranks for every experiment's cells (run/warm.py)
        if not reuse_saved:
            _start_up(pools)
        answered = _run_each(spec, ctx, folder, progress, reference, reuse_saved, plan)
        if not reuse_saved and budget_s is not None and top_up(spec, ctx, answered, plan, progress):
            save_spec(spec, out_dir, store)  # the grown launch counts, for a report re-derived from the runs
        if pools.warm or pools.cold:
            progress.say(pools.tally())
    model = study_model(answered)
    use_model(model)  # every decision from here on (the report's cards included) reads the study's pool
    progress.say(f"noise model: {model.words()}")
    if not reuse_saved or results.load_study(folder) is None:
        results.save_study(folder, noise_floor(spec, store), budget=plan.notes(), budget_s=budget_s,
                           noise_model=model.words())
    return held_to_host_peak(answered)


def study_model(answered: list[tuple]) -> NoiseModel:
    """The noise model pooled over every table row of the study that keeps its launch medians."""
    return model_of_tables([t for _, r in answered for t in r.tables.values()])


def top_up(spec: StudySpec, ctx, answered: list[tuple], plan: Budget, progress: Progress) -> bool:
    """Spend the budget left on the decisions still open (module docstring); True when any experiment grew.
    `answered` is updated in place; each grown result is saved, its notes say so."""
    grew = False
    for look in range(2, MAX_LOOKS + 1):
        with pooled(study_model(answered)):  # this look's decisions read the pool; the caller's model is kept
            spent = _look(spec, ctx, answered, plan, progress, look)
        grew = grew or spent
        if not spent:
            break
    return grew


def _look(spec: StudySpec, ctx, answered: list[tuple], plan: Budget, progress: Progress, look: int) -> bool:
    """One look of `top_up`: each experiment with a question still open, the fewest launches needed first, grows
    while the budget covers it; True when any did."""
    wanted = []
    for i, (experiment, result) in enumerate(answered):
        if experiment.decide is None or not result.tables:
            continue
        decisions = experiment.decide(result)
        open_ = [d for d in decisions if d.verdict == UNDECIDED and d.more]
        # what grows: the launches per cell, or the seeds where its questions count seeds (an accuracy)
        grow = "seeds" if open_ and all(d.count == "seeds" for d in open_) else "launches"
        launches = (spec.options.get(experiment.name) or {}).get(grow)
        if open_ and isinstance(launches, int):  # most promising: the fewest launches still needed
            need = min(d.more for d in open_)
            # racing: a launched setting the best already beats beyond noise keeps the launches it has
            worse = {label for d in decisions for label in d.worse} if grow == "launches" else set()
            wanted.append((need - launches, i, next_launches(need, launches), open_, grow, worse))
    spent = False
    for _, i, target, open_, grow, worse in sorted(wanted, key=lambda w: (w[0], w[1])):
        experiment, result = answered[i]
        now = spec.options[experiment.name][grow]
        # a setting stays held (at the launches it was held at) only while the best still beats it beyond noise:
        # one that a look no longer finds worse grows again, else its comparison stays open for good (a default
        # study's bucket card: "undecided after 5 launches each; about 4 more would decide" with 4 MiB held at 5)
        before = spec.held.get(experiment.name, {})
        caps = {label: before.get(label, now) for label in sorted(worse)}
        released = sorted(set(before) - set(caps))
        per_launch = plan.took.get(experiment.name, math.inf) / max(now, 1)
        spare = plan.left_s() - plan.pace * (REFERENCE_S["reference"][0] + REFERENCE_S["report"][
            1 if spec.quick else 0])
        target = min(target, now + int(spare // per_launch) if per_launch > 0 else target)
        if target <= now:
            continue
        unit = "seeds per cell" if grow == "seeds" else "launches per cell"
        kept = f"; held (worse beyond noise): {', '.join(f'{k} at {v}' for k, v in caps.items())}" if caps else ""
        kept += f"; released (no longer worse beyond noise): {', '.join(released)}" if released else ""
        progress.say(f"== look {look} at {experiment.name}: {len(open_)} question(s) open "
                     f"({'; '.join(d.question for d in open_)}): {now} -> {target} {unit}{kept}")
        began = time.monotonic()
        opts = {**(spec.options.get(experiment.name) or {}), grow: target}
        try:
            with held(caps):
                grown = experiment.execute(ctx, spec.config(experiment.name) if experiment.base else None,
                                           experiment.option_values(opts))
        except (RunFailed, ScalelabError, RuntimeError) as err:
            progress.say(f"== look {look} at {experiment.name} failed: {str(err).strip()[:200]}")
            continue
        took = time.monotonic() - began
        plan.took[experiment.name] = plan.took.get(experiment.name, 0.0) + took
        spec.options[experiment.name] = opts
        if caps:
            spec.held[experiment.name] = caps
        else:
            spec.held.pop(experiment.name, None)
        grown.notes = {**result.notes, **grown.notes,
                       "topped up": f"look {look}: {now} -> {target} {unit} for the question(s) "
                                    f"still open{kept}, in {took:.0f} s of the budget left"}
        results.save(experiment, grown, ctx.out_dir)
        answered[i] = (experiment, grown)
        spent = True
    return spent


def _start_up(pools: warm.Pools) -> None:
    """The study's one-time costs side by side before its first cell: the warm ranks' zygote imports torch and
    scalelab (~2 s on a 2-core machine) while this process makes torch's one-time allocations, which its first run
    here would make (~1 s: torch._dynamo's import, the thread pools); then it waits for the zygote, so that no cell
    is measured while another process imports. Before, the zygote started with the first multi-rank cell, alone."""
    from scalelab.config import TrainConfig
    from scalelab.run.worker import warm_up_runtime

    pools.start_zygote()  # unless the block's caller already did (`scalelab study`, before reading the store)
    warm_up_runtime(TrainConfig())
    pools.zygote_ready()


def _run_each(spec: StudySpec, ctx, folder: Path, progress: Progress, reference, reuse_saved: bool,
              plan: Budget) -> list[tuple]:
    """The reference cell, every experiment in the spec's order (as the budget's plan has it), the reference cell
    again."""
    from scalelab.lab.base import Result

    reference(1)
    answered = []
    for i, name in enumerate(spec.experiments, 1):
        experiment = registry.get(name)
        saved = results.load(experiment, folder) if reuse_saved else None
        if saved is not None:
            answered.append((experiment, saved))
            continue
        decision = plan.decide(name)
        progress.experiment(name, i, len(spec.experiments), eta_s=plan.eta_s() if plan.spent else None)
        if decision.action != "as planned":
            progress.say(f"== budget: {decision.line()}")
        if decision.action == "left out":
            plan.finished(name, 0.0)
            answered.append((experiment, Result(name, {}, notes={"left out": f"by the study's time budget: "
                                                                              f"{decision.why}"})))
            continue
        began = time.monotonic()
        try:
            base = spec.config(name) if experiment.base else None
            opts = {**(spec.options.get(name) or {}), **decision.options}
            with held(spec.held.get(name, {})):  # a report re-derived from the store: what the top-ups held
                result = experiment.execute(ctx, base, experiment.option_values(opts))
            progress.experiment_done(name, time.monotonic() - began)
            results.save(experiment, result, folder)
        except (RunFailed, ScalelabError, RuntimeError) as err:
            # One experiment failing must not lose the others: its section says why, the rest goes on.
            reason = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
            progress.experiment_done(name, time.monotonic() - began, failure=reason)
            result = Result(name, {}, notes={"failed": reason})
        plan.finished(name, time.monotonic() - began)
        plan.took[name] = time.monotonic() - began
        if decision.action == "reduced":
            result.notes["reduced"] = f"by the study's time budget: {decision.why}"
        answered.append((experiment, result))
    reference(2)
    return answered


def held_to_host_peak(answered: list[tuple]) -> list[tuple]:
    """Every experiment's tables held to the fastest collective the study's benchmark measured on this host
    (analysis.checks.mark_host_peak): the one check that spans two experiments, applied before any sentence."""
    peak = next((checks.host_peak(r.tables) for _, r in answered if "comm" in r.tables), None)
    return [(e, dataclasses.replace(r, tables=checks.mark_host_peak(r.tables, peak))) for e, r in answered]


def audit(answered: list[tuple]) -> list[str]:
    """Every sentence or recommendation of the study that relies on a row a check failed, and every decision worded
    beyond what its figures give (analysis.checks): none is the bar."""
    peak = next((checks.host_peak(r.tables) for _, r in answered if "comm" in r.tables), None)
    out, records = [], []
    for experiment, result in answered:
        if result.tables:
            sentences, rec = experiment.interpret(result)
            out += checks.contradictions(result.tables, sentences, rec, peak)
            if experiment.decide is not None:
                records += [d.record() for d in experiment.decide(result)]
    return out + checks.decision_faults(records)
