"""Errors a user can act on. The CLI prints their message as one line and exits with code 2."""


class ScalelabError(Exception):
    """Base for every error caused by the user's input (flags, files, models)."""


class ConfigError(ScalelabError, ValueError):
    """A configuration field has a value that is not allowed."""

    def __init__(self, field: str, value: object, allowed: str):
        self.field, self.value, self.allowed = field, value, allowed
        super().__init__(f"{field}: {value!r} is not allowed; {allowed}")


class DataError(ScalelabError):
    """A data file or directory is missing, unreadable or corrupt."""


class ModelError(ScalelabError):
    """A model could not be built or a user's model could not be imported."""


class StoreError(ScalelabError):
    """A run directory or the catalog cannot be read or written."""
