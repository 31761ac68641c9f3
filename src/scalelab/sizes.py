"""Sizes given as text: one parser, used by the config (memory_limit) and by experiment options."""
from __future__ import annotations

from typing import Any

from scalelab.errors import ConfigError


def parse_bytes(value: Any, name: str) -> int:
    """'4GiB', '512M', '1.5G', 1000000 -> bytes (K/M/G/T are powers of 1024)."""
    units = {"": 1, "k": 2**10, "m": 2**20, "g": 2**30, "t": 2**40}
    t = str(value).strip().lower().removesuffix("b").removesuffix("i")
    num, unit = (t[:-1], t[-1]) if t and t[-1] in units else (t, "")
    try:
        size = float(num) * units[unit]
    except ValueError:
        raise ConfigError(name, value, "allowed: a size like 4GiB, 512MiB or a number of bytes") from None
    if isinstance(value, bool) or not 1 <= size < float("inf"):  # also refuses nan and inf
        raise ConfigError(name, value, "allowed: a size > 0, like 4GiB")
    return int(size)
