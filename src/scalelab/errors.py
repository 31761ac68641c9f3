"""Errors a user can act on. The CLI prints their message as one line and exits with code 2."""


class ScalelabError(Exception):
    """Base for every error caused by the user's input (flags, files, models)."""


class ConfigError(ScalelabError, ValueError):
    """A configuration field has a value that is not allowed."""

    def __init__(self, field: str, value: object, allowed: str):
        self.field, self.value, self.allowed = field, value, allowed
        super().__init__(f"{field}: {_short_repr(value)} is not allowed; {allowed}")


def _short_repr(value: object, limit: int = 300) -> str:
    """repr() cut to `limit` characters: a 5000-digit int cannot even be repr'd, a huge list must not flood the line."""
    try:
        text = repr(value)
    except (ValueError, RecursionError):  # ints over sys.get_int_max_str_digits()
        return f"<{type(value).__name__} too large to show>"
    return text if len(text) <= limit else text[:limit - 3] + "..."


class DataError(ScalelabError):
    """A data file or directory is missing, unreadable or corrupt."""


class ModelError(ScalelabError):
    """A model could not be built or a user's model could not be imported."""


class StoreError(ScalelabError):
    """A run directory or the catalog cannot be read or written."""


class MissingExtra(ScalelabError):
    """An optional feature whose package is not installed; the message says what to install."""

    def __init__(self, feature: str, package: str, extra: str):
        super().__init__(f"{feature} needs {package}, which is not installed: pip install 'scalelab[{extra}]'")


class RenamedOption(ScalelabError):
    """A command-line flag that has a new spelling."""


def renamed_to(new: str):
    """A typer/click option callback for an old flag: using it fails with one line naming the new spelling."""

    def callback(ctx, param, value):
        if value is not None and not getattr(ctx, "resilient_parsing", False):
            raise RenamedOption(f"{param.opts[0]} was renamed: use {new}")
        return value

    return callback
