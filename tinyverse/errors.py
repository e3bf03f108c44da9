"""Every error tinyverse raises on purpose: one line naming the problem and the fix."""

import time
from urllib.parse import urlsplit

INVOKED = {"experiment": "EXPERIMENT.py", "prefix": None}  # set by the CLI: hints name the command as it was typed


def command(rest: str) -> str:
    """``python -m tinyverse EXPERIMENT REST``, with the experiment and ``--prefix`` of this invocation."""
    prefix = f" --prefix {INVOKED['prefix']}" if INVOKED["prefix"] else ""
    return f"python -m tinyverse {INVOKED['experiment']} {rest}{prefix}"


def masked(url: str) -> str:
    """``url`` with its password replaced by ``***``: safe to print in any message."""
    password = urlsplit(url).password
    return url if password is None else url.replace(f":{password}@", ":***@", 1)


class Every:
    """True at most once every ``seconds`` per key: a warning a loop would repeat each step is said now and then."""

    def __init__(self, seconds: float = 30.0):
        self.seconds, self.last = seconds, {}

    def __call__(self, key: str = "") -> bool:
        if due := time.monotonic() - self.last.get(key, -self.seconds) >= self.seconds:
            self.last[key] = time.monotonic()
        return due


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
