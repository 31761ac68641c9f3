"""horovodrun itself (horovod.runner.launch), with one change: its rendezvous HTTP server, an unauthenticated
key-value store the ranks meet at, binds 127.0.0.1 instead of every interface (Horovod has no option for it).

    python -m scalelab.run.hvdrun --gloo -np N -H 127.0.0.1:N --network-interfaces lo COMMAND...

Kept apart from run/horovodrun.py (the launcher that starts this command and reads its output) and free of torch:
horovodrun starts one helper process per rank with multiprocessing's spawn, which imports this module again in each,
so every import here is paid 1 + N times per launch (torch was 0.8 s of CPU each, 2.4 s of a 2-rank launch's 7.5).
"""
from __future__ import annotations

LOOPBACK = "127.0.0.1"  # scalelab.run.launch.LOOPBACK; not imported from there: that module imports torch


def loopback_only() -> None:
    """Make horovodrun's rendezvous HTTP server bind 127.0.0.1 (it binds every interface: `find_port` tries
    ('', port)). One node on loopback needs nothing else; the ranks reach it at the `lo` address."""
    from horovod.runner.http import http_server

    find_port = http_server.find_port
    http_server.find_port = lambda factory: find_port(lambda addr: factory((LOOPBACK, addr[1])))


def main() -> None:
    """horovodrun's command line, with its rendezvous server on loopback."""
    from horovod.runner.launch import run_commandline

    loopback_only()
    run_commandline()


if __name__ == "__main__":
    main()
