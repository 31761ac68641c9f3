"""The command line, generated from the config (options.py) and the experiment registry (experiments.py).

`scalelab.cli:main` is the console entry point (pyproject.toml); `app` is the typer application.
"""
from scalelab.cli.main import app, main

__all__ = ["app", "main"]
