"""The replay ratio that players and trainers hold, after Reverb's SampleToInsertRatio, counted in env steps.

``lead = max(0, played - learning_starts) - updates / updates_per_step`` is how
far players are ahead of trainers. Players wait while lead > slack; trainers
wait until ``learning_starts`` env steps are played and while lead < -slack.
Both counters live in the database, so players and trainers can join and leave.
An update counts in samples: one on B sessions counts ``B / train_batch_size``.
"""

from .database import Database
from .errors import ExperimentError


class Pace:
    """One worker's view of the pace: what it waits for, and the updates it has yet to count."""

    def __init__(self, exp, db: Database):
        self.ratio, self.starts, self.slack = exp.updates_per_step, exp.learning_starts, exp.pace_slack
        if (self.ratio is not None and not self.ratio > 0) or self.starts < 0 or self.slack < 0:
            raise ExperimentError(
                f"bad pace: updates_per_step {self.ratio} (None or > 0), learning_starts {self.starts} and "
                f"pace_slack {self.slack} (>= 0)"
            )
        self.db, self.T, self.unit = db, exp.session_length, exp.train_batch_size
        #: what workers show in their heartbeats, for info
        self.spec = {"updates_per_step": self.ratio, "learning_starts": self.starts, "pace_slack": self.slack}
        self.spec["session_length"] = self.T
        self.size = 1.0  # what the last update counted: the next one's guess
        self.pending, self.room = 0.0, 0.0  # updates not yet counted; updates allowed without a look
        self.total = 0  # all trainers' updates, as of the last look

    def played(self) -> int:
        return self.db.count_sessions().added * self.T

    def player_waits(self) -> str | None:
        """What a player waits for before its next round, or None."""
        if self.ratio is None:
            return None
        played, updates = self.played(), self.db.counter("updates")
        if max(0, played - self.starts) - updates / self.ratio <= self.slack:
            return None
        return f"for the trainers: {updates:,} updates for {played:,} env steps, target {self.ratio:g} an env step"

    def trainer_waits(self) -> str | None:
        """What a trainer waits for before its next update, or None."""
        if self.room >= self.size:  # room known from the last look: no round trip
            return None
        played, updates = self.played(), self.flush()
        if played < self.starts:
            return f"for players: {played:,} of {self.starts:,} env steps played before learning starts"
        room = 2000 if self.ratio is None else self.ratio * (played - self.starts + self.slack) - updates - self.pending
        if room < self.size:  # the next update would overshoot the pace
            return f"for players: {updates:,} updates for {played:,} env steps, target {self.ratio:g} an env step"
        self.room = max(self.size, min(room / 2, 1000))  # look again halfway: other trainers share the room
        return None

    def count(self, sessions: int) -> None:
        """Count an update on ``sessions`` sessions."""
        self.size = sessions / self.unit
        self.pending += self.size
        self.room -= self.size

    def flush(self) -> int:
        """Count this trainer's whole updates in the database; return the total of all trainers."""
        n = int(self.pending)
        self.pending -= n
        self.total = self.db.add_updates(n) if n else self.db.counter("updates")
        return self.total

    def updates(self) -> int:
        """The run's updates so far (all trainers'), as this trainer knows them."""
        return self.total + int(self.pending)
