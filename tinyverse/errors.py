"""Every error tinyverse raises on purpose: one line naming the problem and the fix."""

import re
from urllib.parse import unquote_plus

# the query items whose value masked() hides
SECRET = re.compile("password|auth|token|secret", re.IGNORECASE)
# the extra of tinyverse (pyproject.toml) that installs an optional package, by its import name
EXTRAS = {"torch": "examples", "ale_py": "atari", "Box2D": "box2d", "vizdoom": "doom"}
EXTRAS |= {"safetensors": "export", "matplotlib": "plot", "imageio": "video", "ray": "ray"}
EXTRAS |= {"tensorboardX": "tensorboard"}


def install(package: str) -> str:
    """How to install a package: ``pip install 'tinyverse[EXTRA]'`` if an extra has it."""
    named = f"'tinyverse[{EXTRAS[package]}]'" if package in EXTRAS else package
    return f"pip install {named}"


def command(rest: str, prefix: str | None = None, experiment: str = "EXPERIMENT.py") -> str:
    """``python -m tinyverse EXPERIMENT.py REST --prefix PREFIX``, a command a hint names; the CLI
    writes in the experiment it was given (:func:`typed`)."""
    named = f" --prefix {prefix}" if prefix else ""
    return f"python -m tinyverse {experiment} {rest}{named}"


def typed(text: str, experiment: str | None) -> str:
    """``text`` with the commands it names run on ``experiment``, the file the CLI was given."""
    return text if experiment is None else text.replace(command(""), command("", None, experiment))


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
