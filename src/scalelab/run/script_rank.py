"""Entry point of one rank of a user's script: `python -m scalelab.run.script_rank --run-dir DIR -- train.py ARGS`
(or `-- -m MODULE ARGS`); torchrun starts it for `scalelab run`.

It opens the rank's probe (scalelab.run.probe: collectives metered, system sampled, heartbeat for the watchdog,
steps found at the script's DDP model or optimizer unless the script marks its own: scalelab.run.found_steps)
before the user's code runs, runs the script as `__main__` with its own argv in this process, and closes the probe:
the result file when the script ended well, else the step records so far and the script's exception, which
torchrun's error file carries to the run's error.txt (root cause and traceback, as for `scalelab train`).
"""
from __future__ import annotations

import runpy
import signal
import sys
from pathlib import Path

import torch
from torch.distributed.elastic.multiprocessing.errors import record

from scalelab.distenv import dist_context
from scalelab.run import probe as probes
from scalelab.run.script import ScriptConfig
from scalelab.run.worker import _exit_on_sigterm, end_with_parent
from scalelab.store.rundir import RunDir


def parse(argv: list[str]) -> tuple[Path, list[str]]:
    """(run directory, the user's command after the interpreter) from `--run-dir DIR -- ARGS...`."""
    if len(argv) < 4 or argv[0] != "--run-dir" or argv[2] != "--":
        raise SystemExit("usage: python -m scalelab.run.script_rank --run-dir DIR -- SCRIPT.py ARGS | -m MODULE ARGS")
    return Path(argv[1]), argv[3:]


def run_user_code(command: list[str], cwd: str) -> None:
    """Run `SCRIPT.py ARGS` or `-m MODULE ARGS` as `__main__` in this process, as `python` would."""
    if command[0] == "-m":
        sys.argv = [command[1], *command[2:]]
        runpy.run_module(command[1], run_name="__main__", alter_sys=True)
        return
    script = Path(cwd) / command[0]
    sys.argv = [command[0], *command[1:]]
    sys.path.insert(0, str(script.parent))
    runpy.run_path(str(script), run_name="__main__")


def run_script(run_dir: Path, command: list[str]) -> None:
    cfg = ScriptConfig.from_dict(RunDir(run_dir).read_config())
    ctx = dist_context("cuda" if torch.cuda.is_available() else "cpu")
    heartbeat_s = min(1.0, cfg.hang_timeout_s / 10) if cfg.hang_timeout_s > 0 else None
    probe = probes.Probe(run_dir, ctx, warmup_steps=cfg.warmup_steps, sample_interval_s=cfg.sample_interval_s,
                         heartbeat_s=heartbeat_s, find_steps=True)
    probes.set_current(probe.start())
    failed = True
    try:
        run_user_code(command, cfg.cwd)
        failed = False
    except SystemExit as stop:
        failed = stop.code not in (None, 0)
        if failed:
            raise
    finally:
        probe.close(failed=failed)
        probes.set_current(None)


@record
def main(argv: list[str] | None = None) -> None:
    run_dir, command = parse(sys.argv[1:] if argv is None else argv)
    signal.signal(signal.SIGTERM, _exit_on_sigterm)
    end_with_parent()
    run_script(run_dir, command)


if __name__ == "__main__":
    main()
