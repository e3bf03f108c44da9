"""Named params snapshots, kept apart from the rolling params: those run's verdict judged
(:data:`VERDICT`), versions kept for later (a league's opponents). Saved, listed, loaded by name or
by version, deleted; at most :data:`MAX_SNAPSHOTS` a prefix, each a record read as params are. A
trainer keeps versions as it publishes (``retain``); a player draws one (``draw_params``)."""

import contextlib
import random
import re
from typing import NamedTuple

from ..encoding import encode
from ..errors import DatabaseError, command
from ..league import games, weights
from .control import Control
from .records import number

MAX_SNAPSHOTS = 100  # names kept under a prefix, each a whole copy of the params
VERDICT = "passed"  # the params that reached run's target, as its final eval and export take them
LATEST = "latest"  # no snapshot's name: the rolling params
RETAINED = MAX_SNAPSHOTS // 2  # versions retain keeps at most: room for named ones beside
NAME_RE = re.compile(r"[A-Za-z0-9_.-]{1,64}")
GAMES_READ = 2000  # the newest stored games a weighted draw reads


class Snapshot(NamedTuple):
    name: str
    version: int  # of the params it keeps
    time: float  # Unix time of the save


class Snapshots(Control):
    """Snapshots of params under names (loaded by :meth:`~.base.Database.load_params`)."""

    def save_snapshot(self, name: str, params: dict, version: int) -> None:
        """Keep ``params`` of ``version`` under ``name``, replacing a snapshot of that name."""
        if name == LATEST or not NAME_RE.fullmatch(name):
            rule = "1-64 letters, digits, '_', '.' or '-', and not 'latest'"
            raise DatabaseError(f"bad snapshot name {name!r:.80}: use {rule}")
        version = number(version, int, f"snapshot {name}'s version", "pass a params version", 1)
        held = {s.name for s in self.snapshots()}
        if name not in held and len(held) >= MAX_SNAPSHOTS:
            fix = f"delete some, or all with {command('clear --del-params', self.prefix)}"
            full = f"prefix {self.prefix} holds {len(held)} snapshots, the most it keeps"
            raise DatabaseError(f"{full}: {fix}")
        self._call(self._save_params, encode(params), lambda _: version, name)

    def snapshots(self) -> list[Snapshot]:
        """The snapshots, oldest version first; malformed ones skipped (and said now and then)."""
        found = self._call(self._snapshots, MAX_SNAPSHOTS)
        kept = []
        for name, version, saved in found:
            with contextlib.suppress(DatabaseError):  # a version or time that is junk
                if isinstance(name, str) and NAME_RE.fullmatch(name) and name != LATEST:
                    kept.append(Snapshot(name, *self._saved(version, saved, name)))
        self._skipped(len(found) - len(kept), "snapshots", command("clear --del-params"))
        return sorted(kept, key=lambda s: (s.version, s.time))

    def retain(self, params: dict, version: int, last: int, every: int) -> None:
        """Keep ``params`` as snapshot ``vN`` (N: ``version``) if it is among the ``last`` newest or
        a multiple of ``every`` (0: not kept so), then delete the ``vN`` ones neither keeps now: at
        most ``RETAINED`` (50), the oldest multiples first; other names are never deleted."""
        if not last and not (every and version % every == 0):
            return
        self.save_snapshot(f"v{version}", params, version)  # first: a kill loses no kept one
        held = sorted({s.version for s in self.snapshots() if s.name == f"v{s.version}"})
        keep = set(held[-last:] if last else []) | {v for v in held if every and v % every == 0}
        for v in set(held) - set(sorted(keep)[-RETAINED:]):
            self.delete_snapshot(f"v{v}")  # one another trainer deleted first: no harm

    def draw_params(self, pick: str = "uniform", rng: random.Random | None = None) -> tuple | None:
        """(version, params) of an opponent: the rolling params (``latest``), or of the versions
        kept (the ``vN`` snapshots) one drawn ``uniform``-ly or ``weighted`` towards those the
        agent scores least against in the newest stored games (``league.weights``);
        None if there are none."""
        if pick == LATEST:
            return self.load_params()
        if pick not in ("uniform", "weighted"):
            raise ValueError(f"pick {pick!r:.40} is not 'latest', 'uniform' or 'weighted'")
        rng = rng or random
        names = [s.name for s in self.snapshots() if s.name == f"v{s.version}"]
        chance = [1.0] * len(names)
        if pick == "weighted":
            chance = weights(names, games(self.metrics("games", GAMES_READ)))
        keys = [rng.random() ** (1 / c) for c in chance]  # a weighted order (Efraimidis-Spirakis)
        for _, name in sorted(zip(keys, names, strict=True), reverse=True):  # deleted: the next
            if (found := self.load_params(name)) is not None:
                return found
        return None

    def delete_snapshot(self, name: str) -> bool:
        """Delete a snapshot; whether it was there."""
        return bool(NAME_RE.fullmatch(name)) and self._call(self._delete_snapshot, name)

    def find_params(self, spec: str | None = None) -> tuple | None:
        """(version, params) that ``spec`` names, None if none are stored so: the rolling params
        (None, ``latest``), a snapshot's name, or ``vN``: version N, a snapshot's (the newest of
        that version) or else the rolling params if they are at N."""
        if spec in (None, LATEST):
            return self.load_params()
        held = self.snapshots()
        if spec in {s.name for s in held}:
            return self.load_params(spec)
        if (wanted := re.fullmatch(r"v([0-9]{1,18})", spec)) is None:
            return None
        named = [s.name for s in held if s.version == int(wanted[1])]
        if not named and self.params_version() != int(wanted[1]):
            return None  # not the rolling params either: loading them would say so, at a cost
        found = self.load_params(named[-1] if named else None)
        return found if found is not None and found[0] == int(wanted[1]) else None
