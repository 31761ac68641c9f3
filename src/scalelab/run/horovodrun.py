"""horovodrun as a launcher (the Horovod engine): the ranks of a LaunchSpec on this node, gloo, loopback only.

    python -m scalelab.run.hvdrun --gloo -np N -H 127.0.0.1:N --network-interfaces lo \\
        python -m scalelab.run.worker --run-dir DIR

`python -m scalelab.run.hvdrun` is horovodrun itself with its rendezvous HTTP server on 127.0.0.1 (run/hvdrun.py
says why it is a module of its own). gloo's sockets stay on `lo` (--network-interfaces).

horovodrun's output (the ranks' lines prefixed "[r]<stdout>:" / "[r]<stderr>:", and its own) goes to the run's
logs/horovodrun.log, and to the terminal unless the spec is quiet. This process hosts, on 127.0.0.1 only, the store
of the torch process group the ranks keep beside Horovod (engines/horovod.py). When a rank fails, horovodrun ends
the others and exits non-zero; the root cause is read from its output (`root_cause`) and raised as LaunchFailed.
"""
from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from dataclasses import dataclass

from scalelab.engines.horovod import STORE_ENV
from scalelab.run.launch import LOOPBACK, LaunchFailed, LaunchSpec, bound_store
from scalelab.store.rundir import RunDir

HOROVODRUN = "scalelab.run.hvdrun"  # horovodrun, its rendezvous server on loopback
LOG_NAME = "horovodrun.log"
_EXIT = re.compile(r"^Process (\d+) exit with status code (-?\d+)\.", re.MULTILINE)
_RANK_LINE = re.compile(r"^\[(\d+)\]<(stdout|stderr)>:(?:\[rank\d+\]:)?(.*)$")  # torch prefixes "[rankN]:"
# what a rank says when its peer went away or horovodrun stopped it: a consequence, not the cause
_CONSEQUENCE = re.compile(r"connection (reset|closed)|broken pipe|shut ?down|terminat|Gloo|peer", re.IGNORECASE)


def horovodrun_args(spec: LaunchSpec, *, python: str = sys.executable) -> list[str]:
    """The command that starts `spec`'s ranks under horovodrun on this node (one node, loopback)."""
    n = spec.nproc_per_node
    return [python, "-m", HOROVODRUN, "--gloo", "-np", str(n), "-H", f"{LOOPBACK}:{n}",
            "--network-interfaces", "lo", python, "-m", spec.module, "--run-dir", str(spec.run_dir), *spec.args]


@dataclass(frozen=True)
class RankExit:
    rank: int
    code: int
    last_error: str  # the rank's last stderr line ("" when it wrote none)

    @property
    def signal_name(self) -> str | None:
        """The signal that ended the rank (horovodrun reports 128 + signal), None for a plain exit."""
        if self.code > 128:
            try:
                return signal.Signals(self.code - 128).name
            except ValueError:
                return None
        return None

    @property
    def stopped(self) -> bool:
        """Ended by horovodrun after another rank failed (SIGTERM), or failed because its peer went away."""
        return self.signal_name == "SIGTERM" or bool(_CONSEQUENCE.search(self.last_error))

    def reason(self) -> str:
        if self.signal_name:
            return f"rank {self.rank} killed by signal {self.signal_name}"
        return f"rank {self.rank} exited with code {self.code}: {self.last_error or 'no error message'}"


def rank_exits(output: str) -> list[RankExit]:
    """Every failed rank horovodrun reported, in the order it reported them (the order they ended)."""
    last: dict[int, str] = {}
    for line in output.splitlines():
        m = _RANK_LINE.match(line)
        if m and m.group(2) == "stderr" and m.group(3).strip():
            last[int(m.group(1))] = m.group(3).strip()
    return [RankExit(int(r), int(c), last.get(int(r), "")) for r, c in _EXIT.findall(output)]


def root_cause(output: str, returncode: int) -> str:
    """One line: the first failed rank that neither horovodrun stopped nor failed because of a peer; else the
    first failed rank; else horovodrun's own failure."""
    exits = rank_exits(output)
    if exits:
        return min(enumerate(exits), key=lambda ie: (ie[1].stopped, ie[0]))[1].reason()
    lines = [line for line in output.splitlines() if line.strip() and not _RANK_LINE.match(line)]
    return f"horovodrun exited with code {returncode}: {lines[-1].strip() if lines else 'no output'}"


def horovodrun_launch(spec: LaunchSpec) -> None:
    """Run the spec's ranks under horovodrun; LaunchFailed (root cause, whole output) when one fails."""
    rundir = RunDir(spec.run_dir)
    rundir.logs.mkdir(parents=True, exist_ok=True)
    lines: list[str] = []
    # the log is appended to: a resumed run keeps the output of the attempt that failed
    with bound_store(LOOPBACK, 0, any_port=True) as port, (rundir.logs / LOG_NAME).open("a") as log:
        env = {**os.environ, **spec.env, STORE_ENV: f"{LOOPBACK}:{port}"}
        # its own session: an interrupt here ends horovodrun and every rank it started, nothing is left behind
        proc = subprocess.Popen(horovodrun_args(spec), env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                text=True, errors="replace", start_new_session=True)
        try:
            for line in proc.stdout:
                lines.append(line)
                log.write(line)
                log.flush()
                if not spec.quiet:
                    print(line, end="", flush=True)
            returncode = proc.wait()
        except BaseException:
            _end(proc)
            raise
    if returncode:
        output = "".join(lines)
        raise LaunchFailed(root_cause(output, returncode), output)


def _end(proc: subprocess.Popen, grace_s: float = 10.0) -> None:
    """Stop horovodrun's session (it and the ranks it started): SIGTERM, then SIGKILL after `grace_s`."""
    for sig, wait in ((signal.SIGTERM, grace_s), (signal.SIGKILL, None)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(wait)
            return
        except subprocess.TimeoutExpired:
            continue
