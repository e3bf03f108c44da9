"""Every error tinyverse raises on purpose: one line naming the problem and the fix."""

import re
import time
from urllib.parse import unquote_plus

# the query items whose value masked() hides
SECRET = re.compile("password|auth|token|secret", re.IGNORECASE)
INVOKED = {"experiment": "EXPERIMENT.py", "prefix": None}  # set by the CLI: hints name the command as it was typed


def command(rest: str) -> str:
    """``python -m tinyverse EXPERIMENT REST``, with the experiment and ``--prefix`` of this invocation."""
    prefix = f" --prefix {INVOKED['prefix']}" if INVOKED["prefix"] else ""
    return f"python -m tinyverse {INVOKED['experiment']} {rest}{prefix}"


def masked(url: str) -> str:
    """``url`` with each secret in it as ``***``, safe to print: its userinfo's password (all of a
    userinfo without one: a token may stand there), the value of each query item whose name says
    password, auth, token or secret (``?password=``, ``ssl_password=``), and its fragment."""
    found = re.match(r"[A-Za-z][A-Za-z0-9+.-]*://", url)
    scheme = found[0] if found else ""
    rest = url[len(scheme) :]
    netloc = re.match(r"[^/?#]*", rest)[0]  # where urlsplit ends it
    after = rest[len(netloc) :]
    if "@" in after:  # a password's unencoded / ? or # split it, or a query value holds an @
        return f"{scheme}***"
    userinfo, at, host = netloc.rpartition("@")
    if at:
        user, colon, _ = userinfo.partition(":")
        userinfo = f"{user}:***" if colon else "***"
    after, hashed, _ = after.partition("#")
    path, asked, query = after.partition("?")
    items = [_masked_item(item) for item in query.split("&")] if asked else []
    return f"{scheme}{userinfo}{at}{host}{path}{asked}{'&'.join(items)}{'#***' if hashed else ''}"


def _masked_item(item: str) -> str:
    name, _, value = item.partition("=")
    read = unquote_plus(re.sub("[\t\r\n]", "", name))  # as redis-py reads it: urlsplit drops these
    return f"{name}=***" if value and SECRET.search(read) else item


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
