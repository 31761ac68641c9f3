"""Shared fixtures: a store in tmp, tiny configs, and teardown of any process group a test left behind.

Layout: tests/unit/<package>/ mirrors src/scalelab (one process; single-process runs are fine), tests/cli/ drives
the command line, tests/dist/ starts real process groups or several processes (every test there is marked `dist`,
so `pytest -m "not dist"` is the fast tier). Test files import these helpers with `from conftest import ...`
(pyproject's `pythonpath = ["tests"]`).

Every run the distributed tests make obeys its own arithmetic (scalelab.analysis.checks.run_failures: times and
their intervals >= 0, a step's parts sum to the step, waiting + critical = time inside collectives per rank, bytes
per step as theory says): a new figure that breaks arithmetic fails the suite here, whichever test made the run.
The runs are found on disk after the last test: every folder that a tests/dist module created under pytest's base
temporary directory (its tests' tmp_path and its module fixtures' tmp_path_factory folders: a module-scoped
autouse fixture sees them appear, so runs that unit tests plant on purpose are not read), searched for run
directories (a config.json beside a summary.json), by each xdist worker for the modules it ran. The terminal
summary says how many runs were read.

`run_cli` (a `scalelab ...` command run to its end, output captured) and `start_cli` (one started, to signal or watch
while it runs: a Popen's interface) fork each call from one process that has imported the CLI
(tests/cli_server.py says what of a fresh process it keeps); a test of the interpreter's own start-up asks
`start_cli` for a fresh `python -m scalelab`."""
from __future__ import annotations

import json
import os
import sys
import textwrap
from pathlib import Path

import pytest

pytest_plugins = ["alone"]  # tests that run with no other beside them, the rest in two workers (tests/alone.py)

SRC = Path(__file__).resolve().parents[1] / "src"
FIXTURES = Path(__file__).resolve().parent / "fixtures"
DIST = Path(__file__).resolve().parent / "dist"


def pytest_collection_modifyitems(config, items):
    """Every test under tests/dist is a `dist` test: real process groups or several processes. They run before the
    rest (after the `alone` tests: tests/alone.py), in the order the workers take them (pyproject's
    `--no-loadscope-reorder`): the long modules first and the many short unit modules last, so that the two workers
    end together."""
    for item in items:
        if DIST in Path(item.path).resolve().parents:
            item.add_marker(pytest.mark.dist)
    items.sort(key=lambda item: item.get_closest_marker("dist") is None)  # stable: each module stays in one piece


@pytest.fixture(scope="session", autouse=True)
def _sigint_not_ignored():
    """A suite started in the background (`pytest &`: the shell ignores SIGINT and SIGQUIT for it) would hand the
    ignored SIGINT to every process it starts, and the Ctrl-C tests would send a signal their CLI never sees. A
    Python handler in this process is reset to the default in its children at exec; SIG_IGN is not."""
    import signal

    if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    yield


@pytest.fixture(autouse=True)
def _no_leftover_process_group():
    yield
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


CHECKED: dict = {"done": False, "runs": 0, "failures": []}  # the invariant check's outcome, for the summary line
_DIST_FOLDERS: list[Path] = []  # what the tests/dist modules created under the base temp


@pytest.fixture(scope="module", autouse=True)
def _dist_folders(request, tmp_path_factory):
    if DIST not in Path(request.module.__file__).resolve().parents:
        yield
        return
    base = tmp_path_factory.getbasetemp()
    before = set(base.iterdir())
    yield
    _DIST_FOLDERS.extend(sorted(p for p in set(base.iterdir()) - before if not p.is_symlink()))  # not <name>current


def stored_runs(folders) -> list[Path]:
    """The run directories (config.json beside summary.json) under `folders`."""
    return sorted({p.parent.resolve() for f in folders if f.is_dir() for p in f.rglob("summary.json")
                   if (p.parent / "config.json").is_file()})


def check_runs(folders) -> tuple[int, list[str]]:
    """(runs read, "<run dir>: <why>" for every rule one of them breaks)."""
    from scalelab.analysis.checks import run_failures
    from scalelab.store import RunDir

    runs = stored_runs(folders)
    failures = []
    for path in runs:
        try:
            failures += [f"{path}: {why}" for why in run_failures(RunDir(path).load())]
        except (OSError, ValueError, KeyError, TypeError) as err:  # a run the check cannot read fails it too
            failures.append(f"{path}: unreadable for the invariant check ({type(err).__name__}: {err})")
    return len(runs), failures


@pytest.fixture(scope="session", autouse=True)
def _every_dist_run_obeys_its_arithmetic(request):
    yield
    if not _DIST_FOLDERS:
        return
    CHECKED["done"], (CHECKED["runs"], CHECKED["failures"]) = True, check_runs(_DIST_FOLDERS)
    if hasattr(request.config, "workeroutput"):  # an xdist worker: its controller prints the summary line
        request.config.workeroutput["invariant_check"] = dict(CHECKED)
    failures = CHECKED["failures"]
    if failures:
        shown = "\n  ".join(failures[:20]) + (f"\n  ... and {len(failures) - 20} more" if len(failures) > 20 else "")
        pytest.fail(f"{len(failures)} invariant(s) broken in the {CHECKED['runs']} runs the dist tests stored "
                    f"(scalelab.analysis.checks.run_failures):\n  {shown}", pytrace=False)


@pytest.hookimpl(optionalhook=True)  # an xdist hook: unknown with `-p no:xdist`
def pytest_testnodedown(node, error):
    """An xdist worker ended: add its invariant check to this (the controller's) summary."""
    checked = getattr(node, "workeroutput", {}).get("invariant_check")
    if checked:
        CHECKED["done"], CHECKED["runs"] = True, CHECKED["runs"] + checked["runs"]
        CHECKED["failures"] += checked["failures"]


@pytest.hookimpl(trylast=True)  # after the durations table: these lines stand right above pytest's last line
def pytest_terminal_summary(terminalreporter):
    if CHECKED["done"]:
        terminalreporter.write_line(f"invariant check: read {CHECKED['runs']} stored runs of the dist tests, "
                                    f"{len(CHECKED['failures'])} broken invariant(s)")
    for line in horovod_skips(terminalreporter.stats.get("skipped", []), os.environ.get(HOROVOD_SETUP_FAILED)):
        terminalreporter.write_line(line, yellow=True, bold=True)


# .ci/run sets it to the one line of a failed `scalelab setup horovod`, so that the run's last lines say Horovod went
# untested, and why, next to the count of tests that skipped for it (not only a warning far above pytest's output)
HOROVOD_SETUP_FAILED = "SCALELAB_HOROVOD_SETUP_FAILED"


def horovod_skips(skipped, setup_failed: str | None) -> list[str]:
    """The summary's lines on Horovod: how many tests skipped for it and why; the set-up's failure when known."""
    reasons = [rep.longrepr[2] for rep in skipped if isinstance(getattr(rep, "longrepr", None), tuple)
               and "horovod" in str(rep.longrepr[2]).lower()]
    lines = []
    if setup_failed:
        lines.append(f"HOROVOD UNTESTED: the set-up failed: {setup_failed}")
    if reasons:
        common = max(set(reasons), key=reasons.count).removeprefix("Skipped: ")
        lines.append(f"horovod: {len(reasons)} test(s) skipped ({common})")
    return lines


# Dist test modules whose runs start cold, one torchrun launch each: they test that path itself (torchrun, faults,
# interrupts, hangs, namespaced nodes, resuming, Horovod, the memory cap, CUDA), run scripts, or manage warm ranks
# themselves. Every other dist module's in-process multi-rank runs share one set of warm ranks (run/warm.py),
# started once per module: the start-up a cold launch pays per run, hundreds of times a suite.
COLD_MODULES = {"test_faults", "test_interrupt", "test_reliability_launch", "test_local_nodes", "test_maxbatch_real",
                "test_train_dist", "test_warm_dist", "test_watchdog_dist", "test_horovod_dist",
                "test_horovod_exposed_dist", "test_checkpoint_dist", "test_cuda_paths", "test_cuda_collective_timing",
                "test_slurm_real", "test_lightning_dist", "test_probe_dist", "test_clocks_dist"}


@pytest.fixture(scope="module", autouse=True)
def _warm_ranks(request):
    path = Path(request.node.path).resolve()
    if DIST not in path.parents or path.stem in COLD_MODULES:
        yield
        return
    from scalelab.run import warm

    with warm.ranks():
        yield


@pytest.fixture(autouse=True)
def _no_study_noise_model_left():
    """A study sets its pooled noise model for the rest of its process (lab.decision.use_model: the report's cards
    read it); a test that ran one in-process must not hand it to the next test's decisions."""
    yield
    from scalelab.lab.decision import use_model

    use_model(None)


@pytest.fixture
def group(tmp_path):
    """A one-rank gloo process group in this process (a file rendezvous), with the collective intercept undone after
    the test: for the intercept's and the found steps' unit tests."""
    import torch.distributed as dist

    from scalelab.sync import intercept

    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'rdzv'}", rank=0, world_size=1)
    yield
    intercept.uninstall()
    dist.destroy_process_group()


@pytest.fixture
def store(tmp_path):
    from scalelab.store import Store

    return Store(tmp_path / "store")


# A figure that is the machine's own work (communication on the critical path, the imbalance of ranks on shared cores,
# a model's compute) scales with the machine's speed and load, so no constant bounds it: a test bounds it by the same
# figure of a control (the same config without the injected cause, measured in the same test or session), at most
# CONTROL_RATIO times it plus a share of the injected time. 1.5: what two runs of one config differ on 2 busy cores.
CONTROL_RATIO = 1.5


def control_figures(c: dict) -> str:
    """A no-sleep control's straggler figures in one line (its known-truth row: tests/dist/test_stragglers_dist.py,
    test_plain_script_dist.py), for its test's output and failure message."""
    return (f"control: waiting {c['waiting(ms)']:.2f} ms, straggler {c['straggler']}, most any rank cost the others "
            f"rank {c['most_rank']}'s {c['most(ms)']:.2f} ms (low {c['most_low(ms)']:.2f}), its own work beyond "
            f"the others' (low) {c['work_low(ms)']:.2f} ms against their jitter {c['jitter(ms)']:.2f} ms, step "
            f"{c['step(ms)']:.1f} ms, n = {c['n']} steps")


@pytest.fixture(scope="session")
def scenario_runs(tmp_path_factory):
    """Runs of tests/dist/sense_scenarios.py's known-answer scenarios and their controls (the same config without
    the injected cause), each launched once a session: the tests that read one share it."""
    from sense_scenarios import Runs

    return Runs(tmp_path_factory.mktemp("scenarios"))


# A bias-free 3-layer MLP whose gradient bytes are known: 3072·16 + 16·16 + 16·10 floats on 3×32×32 inputs.
TINY_MLP = """
from torch import nn

def make(spec):
    n_in = 1
    for d in spec.shape:
        n_in *= d
    return nn.Sequential(nn.Flatten(), nn.Linear(n_in, 16, bias=False), nn.ReLU(), nn.Linear(16, 16, bias=False),
                         nn.ReLU(), nn.Linear(16, spec.num_classes, bias=False))
"""


SLEEPY_MODEL = """
import time
import torch
from torch import nn


class Sleepy(nn.Module):
    '''A tiny model whose forward sleeps a known time: the known truth for the forward stage.'''

    def __init__(self, spec, delay_s={delay}):
        super().__init__()
        self.delay_s = delay_s
        self.fc = nn.Linear(int(torch.tensor(spec.shape).prod()), spec.num_classes)

    def forward(self, x):
        time.sleep(self.delay_s)
        return self.fc(x.flatten(1))


def make(spec):
    return Sleepy(spec)
"""


@pytest.fixture
def sleepy_model(tmp_path):
    """Path ref 'file.py:make' of a model whose forward sleeps 50 ms."""
    return lambda delay_s=0.05: write_sleepy(tmp_path, delay_s)


def write_sleepy(folder: Path, delay_s: float) -> str:
    """Path ref 'file.py:make' of a model in `folder` whose forward sleeps `delay_s` (for module-scoped fixtures)."""
    path = folder / f"sleepy_{int(delay_s * 1e6)}.py"
    path.write_text(textwrap.dedent(SLEEPY_MODEL.format(delay=delay_s)))
    return f"{path}:make"


def namespaces_unusable() -> str | None:
    """Why network namespaces cannot be made here (a skip reason), or None when they can."""
    from scalelab.run import netns

    try:
        netns.check_usable()
    except netns.NamespacesUnavailable as err:
        return str(err)
    return None


def cli_env(extra: dict | None = None) -> dict:
    """Environment for running `python -m scalelab` in a subprocess from a source checkout."""
    env = dict(os.environ)
    env["PYTHONPATH"] = str(SRC) + os.pathsep + env.get("PYTHONPATH", "")
    env.update(extra or {})
    return env


# rich reads them at each layout when they were not set as its consoles were built (the server starts without them)
SCREEN = ("COLUMNS", "LINES")
# pytest-xdist's workers start with COLUMNS=80 and LINES=24 though no terminal is behind them: the suite must see
# what `-n 0` sees (no width), or every CLI call from a worker would have its lines broken at 80 columns
# (scalelab.lab.terminal reads COLUMNS); a test that wants a width sets it itself
if os.environ.get("PYTEST_XDIST_WORKER"):
    for _name in SCREEN:
        os.environ.pop(_name, None)
# not read when a process starts, though `warm_zygote.forks` cannot know it: pytest's name of the running test
NOT_AT_START = (*SCREEN, "PYTEST_CURRENT_TEST")


class CliServer:
    """The tests' end of tests/cli_server.py: started at the first CLI call, ended with the session."""

    def __init__(self):
        import subprocess

        self.env = {k: v for k, v in cli_env().items() if k not in SCREEN}  # its consoles' width: each call's
        self.proc = subprocess.Popen([sys.executable, str(Path(__file__).with_name("cli_server.py"))],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, bufsize=0, env=self.env)
        self.pending = b""
        self.ended: dict[int, int] = {}  # child pid -> its status, as the server reported it

    def answer(self, timeout: float | None = None) -> dict | None:
        """The server's next answer line, or None when none came within `timeout` s (read unbuffered: a buffered
        reader could hold the second answer where select cannot see it)."""
        import select
        import time

        deadline = None if timeout is None else time.monotonic() + timeout
        while b"\n" not in self.pending:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            if not select.select([self.proc.stdout], [], [], left)[0]:
                return None
            chunk = os.read(self.proc.stdout.fileno(), 4096)
            if not chunk:
                raise RuntimeError(f"the CLI server ended (exit {self.proc.wait()})")
            self.pending += chunk
        line, self.pending = self.pending.split(b"\n", 1)
        return json.loads(line)

    def takes(self, env: dict) -> bool:
        from scalelab.run.warm_zygote import forks

        def start(variables: dict) -> dict:
            return {k: v for k, v in variables.items() if k not in NOT_AT_START}

        return self.proc.poll() is None and forks(start(self.env), start(env)) is None

    def fork(self, request: dict) -> int:
        """The pid of the child the server forked for `request`; the calls still running are unaffected."""
        self.proc.stdin.write((json.dumps(request) + "\n").encode())
        while True:
            answer = self.answer()
            if "status" in answer:
                self.ended[answer["pid"]] = answer["status"]
            else:
                return answer["pid"]

    def status(self, pid: int, timeout: float | None) -> int | None:
        """Child `pid`'s exit status, once it has ended within `timeout` s (0: only look), else None."""
        import time

        deadline = None if timeout is None else time.monotonic() + timeout
        while pid not in self.ended:
            answer = self.answer(None if deadline is None else max(0.0, deadline - time.monotonic()))
            if answer is None:
                return None
            self.ended[answer["pid"]] = answer["status"]
        return self.ended.pop(pid)

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.stdin.close()
            self.proc.wait(timeout=30)


class ServedProcess:
    """`subprocess.Popen([python, -m, scalelab, *args], stdout=PIPE, stderr=PIPE, text=True)` as the tests use it
    (pid, poll, wait, communicate, send_signal, kill, terminate, returncode), for a call the CLI server forked: a
    process of its own, with its own pid and process tree, that signals reach as they reach a fresh one. Its output
    is read from its files once it has ended (no test reads a running CLI's output)."""

    def __init__(self, server: CliServer, args: list[str], env: dict, cwd: Path):
        import tempfile

        self.server, self.args, self.returncode = server, args, None
        self.folder = Path(tempfile.mkdtemp(prefix="scalelab-cli-"))
        self.out, self.err = self.folder / "stdout", self.folder / "stderr"
        self.pid = server.fork({"args": args, "env": env, "cwd": str(cwd), "stdout": str(self.out),
                                "stderr": str(self.err)})

    def poll(self) -> int | None:
        if self.returncode is None:
            self.returncode = self.server.status(self.pid, 0)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        import subprocess

        if self.returncode is None:
            self.returncode = self.server.status(self.pid, timeout)
            if self.returncode is None:
                raise subprocess.TimeoutExpired(self.args, timeout)
        return self.returncode

    def communicate(self, timeout: float | None = None) -> tuple[str, str]:
        import shutil

        self.wait(timeout)
        if not self.folder.exists():
            return "", ""  # read once, as Popen's pipes
        out, err = self.out.read_text(), self.err.read_text()
        shutil.rmtree(self.folder, ignore_errors=True)
        return out, err

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:  # as Popen: never signal a pid that ended (it may have been reused)
            os.kill(self.pid, sig)

    def kill(self) -> None:
        import signal

        self.send_signal(signal.SIGKILL)

    def terminate(self) -> None:
        import signal

        self.send_signal(signal.SIGTERM)


_CLI: list[CliServer] = []


@pytest.fixture(scope="session", autouse=True)
def _cli_server():
    yield
    for server in _CLI:
        server.close()


def start_cli(args: list[str], *, env: dict | None = None, cwd: Path | None = None, fresh: bool = False):
    """`python -m scalelab ARGS` started with its output captured (text): a `ServedProcess` forked from
    tests/cli_server.py when its environment allows (that module says what it keeps of a fresh process; the server
    is started again when this process's environment changed in a variable read at a process start), else, or with
    `fresh` (a test of the interpreter's own start-up), that subprocess."""
    import subprocess

    full = cli_env(env)
    if not fresh:
        if not _CLI or not _CLI[0].takes(cli_env()):  # a test before this one may have changed our environment
            if _CLI:
                _CLI.pop().close()
            _CLI.append(CliServer())
        if _CLI[0].takes(full):
            return ServedProcess(_CLI[0], list(args), full, Path(cwd or os.getcwd()))
    return subprocess.Popen([sys.executable, "-m", "scalelab", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, cwd=cwd, env=full)


def run_cli(args: list[str], *, timeout: float = 180, cwd: Path | None = None, env: dict | None = None):
    """`python -m scalelab ARGS` run to its end (a CompletedProcess, output captured), as `start_cli` starts it; as
    subprocess.run, a call still running after `timeout` s is killed and raises TimeoutExpired."""
    import subprocess

    proc = start_cli(args, env=env, cwd=cwd)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
        raise subprocess.TimeoutExpired(args, timeout, out, err) from None
    return subprocess.CompletedProcess(args, proc.returncode, out, err)


PER_SAMPLE = 8 * 2**20

HUNGRY = """
import os, signal
import torch
from torch import nn

RANK_ONLY = {rank_only}

class Hungry(nn.Module):
    '''Allocates {per} bytes per training sample in forward.'''
    def __init__(self, spec):
        super().__init__()
        self.fc = nn.Linear(3 * 32 * 32, spec.num_classes)

    def forward(self, x):
        out = self.fc(x.flatten(1))
        if self.training:
            {kill}
            if RANK_ONLY is None or os.environ.get("RANK") == str(RANK_ONLY):
                buf = torch.ones(x.shape[0], {per} // 4, device=x.device)
                # a view of one column, not a reduction: on CUDA `buf.mean(1)` held a second buffer of buf's size
                # (an H100 search stopped at 19 samples of 2 GiB with 78.7 GiB free: batch 20 did not fit)
                out = out + buf[:, :1] * 0
        return out

def make(spec):
    return Hungry(spec)
"""


def hungry_model(tmp_path, kill_above=None, rank_only=None, per_sample: int = PER_SAMPLE,
                 fail_above=None) -> str:
    """Ref 'file.py:make' of a model allocating `per_sample` bytes per training sample on its input's device:
    max-batch's known truth. `kill_above`: SIGKILLed (as by the kernel's OOM killer) above that batch;
    `fail_above`: raises an error that is not memory above that batch."""
    kill = (f"if x.shape[0] > {kill_above}: os.kill(os.getpid(), signal.SIGKILL)" if kill_above else
            f"if x.shape[0] > {fail_above}: raise ValueError('a deliberate failure that is not memory')"
            if fail_above else "pass")
    path = tmp_path / "hungry.py"
    path.write_text(HUNGRY.format(per=per_sample, kill=kill, rank_only=rank_only))
    return f"{path}:make"


FAULTY = """
import os, time
import torch
from torch import nn

RANK = {rank}

class Faulty(nn.Module):
    '''Runs an injected fault in its {call}th training forward, on rank {rank} (None: every rank).'''
    def __init__(self, spec):
        super().__init__()
        self.fc = nn.Linear(int(torch.tensor(spec.shape).prod()), spec.num_classes)
        self.calls = 0

    def forward(self, x):
        if self.training:
            self.calls += 1
            if self.calls == {call} and (RANK is None or os.environ.get("RANK", "0") == str(RANK)):
                {fault}
        return self.fc(x.flatten(1))

def make(spec):
    return Faulty(spec)
"""


def faulty_model(tmp_path, name: str, *, call: int, fault: str, rank: int | None = None) -> str:
    """Ref 'file.py:make' of a linear model that runs the statement `fault` in its `call`-th training forward:
    the known place of an injected crash or hang."""
    path = tmp_path / f"{name}.py"
    path.write_text(FAULTY.format(call=call, rank=rank, fault=fault))
    return f"{path}:make"


def step_losses(run_dir, rank=0):
    """Per-step training loss of one rank of a run: {step: loss}, from its steps.rank<N>.jsonl."""
    from scalelab.store import read_jsonl

    return {r["step"]: r["loss"] for r in read_jsonl(run_dir / f"steps.rank{rank}.jsonl")}


def quiet_cells(store, study: str):
    """The cell engine of `study` on `store`, printing nothing."""
    from scalelab.lab.cells import Cells
    from scalelab.lab.progress import PlainProgress

    return Cells(store, study, progress=PlainProgress(lambda line: None))


def run_experiment(name: str, base, store, study: str, out_dir: Path, **options):
    """One registered experiment through the cell engine of `study`, quietly: its Result (tables, files, notes)."""
    from scalelab.lab import registry
    from scalelab.lab.base import Context

    experiment = registry.get(name)
    ctx = Context(quiet_cells(store, study), Path(out_dir), lambda line: None)
    return experiment.execute(ctx, base, experiment.option_values(options))


def spawn_ranks(main, args: tuple, *, nprocs: int = 2, timeout_s: float = 120) -> None:
    """Run `main(rank, *args)` in `nprocs` spawned processes and wait for all of them; a failed rank raises, a
    hung one is killed after `timeout_s` (a rank left running would keep pytest from exiting)."""
    import time

    import torch.multiprocessing as mp

    ranks = mp.start_processes(main, args=args, nprocs=nprocs, start_method="spawn", join=False)
    deadline = time.monotonic() + timeout_s
    try:
        while not ranks.join(timeout=1):  # raises when a rank fails
            if time.monotonic() > deadline:
                raise TimeoutError(f"the {nprocs} ranks did not finish within {timeout_s:g} s (a hung collective?)")
    finally:
        for proc in ranks.processes:
            if proc.is_alive():
                proc.kill()


def leave_group(folder, rank: int, world: int = 2, timeout_s: float = 30) -> None:
    """End a spawned rank's process group without a teardown race: when one rank's process exits while its peer
    is still tearing gloo down, the peer's gloo thread can see the closed socket and abort ("terminate called
    without an active exception", SIGABRT; seen under load). Every rank destroys its group, then waits until all
    have, and only then leaves (os._exit: no interpreter teardown touches torch's threads afterwards)."""
    import os
    import time
    from pathlib import Path

    import torch.distributed as dist

    dist.barrier()
    dist.destroy_process_group()
    Path(folder, f".left.rank{rank}").touch()
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and not all(Path(folder, f".left.rank{r}").exists() for r in range(world)):
        time.sleep(0.05)
    os._exit(0)


def cuda_sleep_cycles(seconds: float) -> int:
    """torch.cuda._sleep cycles that take about `seconds` on this GPU (timed with events). _sleep counts clock
    cycles and an idle GPU runs at a low clock, so the GPU is kept busy first and the last of a few probes counts;
    the tests still time the sleep they queue."""
    import torch

    probe = 5 * 10**7
    for _ in range(3):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        torch.cuda._sleep(probe)
        end.record()
        end.synchronize()
    return int(probe * seconds / (start.elapsed_time(end) / 1e3))


def kill_rank(proc, pid: int, timeout: float) -> tuple[str, float]:
    """SIGKILL the rank process `pid` of the CLI run `proc` and wait for the run to end: (its stderr, seconds from
    the kill to its end)."""
    import signal
    import time

    killed_at = time.monotonic()
    os.kill(pid, signal.SIGKILL)
    _, err = proc.communicate(timeout=timeout)
    return err, time.monotonic() - killed_at


def heartbeat_process(root: Path, rank: int):
    """The process of rank `rank` of the run stored under `root`, by the pid its heartbeat names (a node agent forks
    its ranks, so a rank's command line and /proc environment are the agent's); None before the heartbeat is
    written or once that process has ended."""
    import json

    import psutil

    for beat in root.glob(f"runs/*/heartbeat.rank{rank}.json"):
        try:
            return psutil.Process(json.loads(beat.read_text())["pid"])
        except (ValueError, KeyError, OSError, psutil.Error):
            continue  # being written, or the rank ended meanwhile
    return None


def wait_for_steps(proc, root: Path, rank: int, timeout: float = 120) -> Path:
    """The run directory of the CLI run `proc` (storing under `root`) once rank `rank` has recorded a step;
    fails the test, killing `proc`, when it ends or `timeout` s pass first."""
    import time

    from scalelab.store import read_jsonl

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        steps = list(root.glob(f"runs/*/steps.rank{rank}.jsonl"))
        if steps and read_jsonl(steps[0]):
            return steps[0].parent
        if proc.poll() is not None:
            break
        time.sleep(0.2)
    proc.kill()
    pytest.fail("run never recorded a step: " + proc.communicate()[1][-1500:])


# Runs of tests/fixtures/store_v0 that calibrate the performance model (`predict --from`): one-rank cnn runs at
# per-rank batches 16, 32, 64, 256, a 2-rank `bench comm` run, a 2-rank ddp cnn run; host "vm", a 2-core CPU.
STORE_V0_COMPUTE = {16: "run-20261123-044515-57e9c8", 32: "run-20261123-044540-89c611",
                    64: "run-20261123-044516-f9fd1c", 256: "run-20261123-044516-3c8b34"}
STORE_V0_BENCH = "run-20261123-044530-9a9cc9"
STORE_V0_DDP = "run-20261123-044511-b8b1bf"  # cnn, 2 ranks, sync auto (ddp), per-rank batch 32
STORE_V0_MLP_NOOP = "run-20261123-044527-3bc1e4"  # mlp, 2 ranks, sync noop, per-rank batch 32


def copied_runs(tmp_path: Path, *run_ids: str) -> Path:
    """A fresh folder holding copies of store_v0's runs `run_ids`, as if copied from another machine."""
    import shutil

    folder = tmp_path / "copied"
    folder.mkdir()
    for rid in run_ids:
        shutil.copytree(FIXTURES / "store_v0" / "runs" / rid, folder / rid)
    return folder


def as_gpu_box(folder: Path, device: str = "NVIDIA A100-SXM4-80GB", host: str = "gpubox") -> None:
    """Rewrite the runs in `folder` as if measured on one CUDA device of `host`."""
    from scalelab.store import RunDir

    for run in folder.iterdir():
        files = RunDir(run)
        provenance, config = files.read_provenance(), files.read_config()
        provenance.update(host=host, cuda_devices=[device])
        config["device"] = "cuda"
        files.write_provenance(provenance)
        files.write_config(config)
