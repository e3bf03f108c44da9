"""Every error tinyverse raises on purpose: one line naming the problem and the fix."""

from urllib.parse import urlsplit


def masked(url: str) -> str:
    """``url`` with its password replaced by ``***``: safe to print in any message."""
    parts = urlsplit(url)
    return url if parts.password is None else url.replace(f":{parts.password}@", ":***@", 1)


class TinyverseError(Exception):
    """Base of all tinyverse errors; the CLI prints the message alone and exits 1."""


class ExperimentError(TinyverseError):
    """The experiment file cannot be loaded or does not follow the contract."""


class DatabaseError(TinyverseError):
    """A bad database URL, an unreachable server, or a broken store."""


class RecordError(TinyverseError):
    """A stored record is corrupt or foreign and cannot be decoded."""


class ParamsMismatch(TinyverseError):
    """Params in the database do not fit the experiment's model."""
