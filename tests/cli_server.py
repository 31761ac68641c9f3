"""A fork server for the tests' `run_cli` and `start_cli` (conftest.py): one process that has imported scalelab's
CLI, and torch through it, and forks each `scalelab ARGS` call from there, so that a call does not pay a fresh
interpreter's start and imports (about 1.9 s here, 4.6 s on a slow machine of this kind; some 80 calls a suite).

The child is what `python -m scalelab ARGS` runs once its imports are done: the call's `sys.argv`, working directory
and environment, its stdout and stderr in the call's files, stdin empty, the signal handlers a fresh interpreter
has (this process changes none), and an exit with main()'s status as the interpreter's (`exit_as_the_interpreter`).
It is forked before any torch op, for the reasons `scalelab.run.warm_zygote` gives (OpenMP's pool and CUDA are not
fork-safe), from a process with one thread (a lock another thread held at the fork would stay held in the child).
Calls may overlap (two CLIs at once, a test that signals one while it runs): each answer names its child.
conftest starts the server again when pytest's own environment changed in a variable read when a process starts
(`warm_zygote.forks`), and runs a call whose own variables differ in one as a subprocess. What only a fresh
interpreter shows (its start-up, its imports) is tested by the tests that ask `start_cli` for `fresh=True`.

    python tests/cli_server.py    # one JSON request a line on stdin; answers {"pid": N} at the fork, then
                                  # {"pid": N, "status": S} when that child has ended, S as Popen's returncode
"""
from __future__ import annotations

import importlib.util
import json
import os
import sys
import time
import traceback
import types
from pathlib import Path

MAIN = Path(__file__).resolve().parents[1] / "src" / "scalelab" / "__main__.py"  # sys.argv[0] of `python -m scalelab`


def as_main() -> types.ModuleType:
    """A `__main__` as `python -m scalelab` has it (its package and spec), without running scalelab/__main__.py: click
    names the program from it ("python -m scalelab"), and a spawned process would import it."""
    module = types.ModuleType("__main__")
    module.__file__, module.__package__ = str(MAIN), "scalelab"
    module.__spec__ = importlib.util.find_spec("scalelab.__main__")
    return module


def child(request: dict, main) -> int:
    """Become the call: its directory, environment, streams and argv; main()'s exit status."""
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])  # in place: rich's consoles read COLUMNS from this very mapping
    for fd, path in ((0, os.devnull), (1, request["stdout"]), (2, request["stderr"])):
        new = os.open(path, os.O_RDONLY if fd == 0 else os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.dup2(new, fd)
        os.close(new)
    sys.stdin = open(0, closefd=False)  # not the requests' pipe, which the server reads ahead
    sys.argv = [str(MAIN), *request["args"]]
    sys.modules["__main__"] = as_main()
    try:
        main(request["args"])
    except SystemExit as done:
        if done.code is None or isinstance(done.code, int):
            return done.code or 0
        print(done.code, file=sys.stderr)
        return 1
    except BaseException:  # what the interpreter does with an uncaught exception
        traceback.print_exc()
        return 1
    return 0


def exit_as_the_interpreter(code: int) -> None:
    """End the call as an interpreter's exit does, up to its module teardown: wait for every non-daemon thread (a
    CLI that leaves one hangs here as it would at its own exit), run the atexit handlers, flush stdout and stderr,
    then exit with `code`. The teardown of torch's modules that follows in a real exit is skipped: it took 0.85 s
    of a 0.9 s `scalelab --help` here, and nothing of scalelab's output waits for it (a file only a finalizer
    flushed would show up here as missing, never pass by chance)."""
    import atexit
    import threading

    threading._shutdown()  # the interpreter's first step at exit (Py_FinalizeEx: wait_for_thread_shutdown)
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    os._exit(code)


def serve() -> None:
    import select

    from scalelab.cli import main  # torch and all of scalelab; no torch op runs here

    def say(answer: dict) -> None:
        os.write(1, (json.dumps(answer) + "\n").encode())  # unbuffered: no Python lock for a child to inherit

    pending, children, open_ = b"", set(), True
    while open_ or children:
        # block for a request when no child runs; else look for ended children every 20 ms
        if open_ and select.select([0], [], [], 0.02 if children else None)[0]:
            chunk = os.read(0, 65536)
            open_ = bool(chunk)
            pending += chunk
            while b"\n" in pending:
                line, pending = pending.split(b"\n", 1)
                pid = os.fork()
                if pid == 0:
                    exit_as_the_interpreter(child(json.loads(line), main))
                children.add(pid)
                say({"pid": pid})
            if not open_:  # the tests ended: a call still running was left by a failed test
                for pid in children:
                    os.kill(pid, 9)
        elif not open_:
            time.sleep(0.02)
        while children:
            pid, status = os.waitpid(-1, os.WNOHANG)
            if pid == 0:
                break
            children.discard(pid)
            say({"pid": pid, "status": os.waitstatus_to_exitcode(status)})


if __name__ == "__main__":
    serve()
