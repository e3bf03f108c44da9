"""The replay ratio players and trainers hold, counted in env steps in the database (docs: usage,
"The pace")."""

FIELDS = ("updates_per_step", "learning_starts", "pace_slack", "session_length")  # heartbeats show


class Pace:
    """One worker's view of the lead of the players, in env steps played:
    ``lead = max(0, played - learning_starts) - updates / updates_per_step``."""

    def __init__(self, exp, db):
        settings = exp.run.settings
        self.spec = {k: getattr(settings, k) for k in FIELDS}
        self.ratio = settings.updates_per_step  # None: each side runs free
        self.starts = settings.learning_starts
        self.slack = settings.pace_slack
        self.T = settings.session_length
        self.db = db
        self.unit = settings.train_batch_size  # sessions of a whole update
        self.size = 1.0  # the last update's size in whole updates: the next one's guess
        self.pending = 0.0  # this trainer's updates not yet counted in the database
        self.room = 0.0  # updates allowed without a look
        self.total = 0  # all trainers' updates as of the last look

    def player_waits(self) -> str | None:
        """What a player waits for before its next round (while lead > slack), or None."""
        if self.ratio is None:
            return None
        played = self.db.env_steps(self.T)
        updates = self.db.counter("updates")
        if max(0, played - self.starts) - updates / self.ratio <= self.slack:
            return None
        return f"for the trainers: {updates:,} updates for {played:,} env steps, {self._target}"

    def trainer_waits(self) -> str | None:
        """What a trainer waits for before its next update (until learning starts, while
        lead < -slack), or None."""
        if self.room >= self.size:  # allowed, as known from the last look: no round trip
            return None
        played = self.db.env_steps(self.T)
        updates = self.flush()
        if played < self.starts:
            starts = f"{self.starts:,} env steps played before learning starts"
            return f"for players: {played:,} of {starts}"
        room = 2000  # updates a free trainer makes between two looks at the count
        if self.ratio is not None:
            room = self.ratio * (played - self.starts + self.slack) - updates - self.pending
        if room < self.size:  # the next update would overshoot the pace
            return f"for players: {updates:,} updates for {played:,} env steps, {self._target}"
        self.room = max(self.size, min(room / 2, 1000))  # look again halfway: other trainers share
        return None

    @property
    def _target(self) -> str:
        return f"target {self.ratio:g} an env step"

    def count(self, sessions: int) -> int:
        """Count an update on ``sessions`` sessions; return the run's updates before it (all
        trainers', as known)."""
        before = self.total + int(self.pending)
        self.size = sessions / self.unit
        self.pending += self.size
        self.room -= self.size
        return before

    def flush(self) -> int:
        """Count this trainer's whole updates in the database; return the total of all trainers."""
        n = int(self.pending)
        self.pending -= n
        self.total = self.db.add_to_counter("updates", n) if n else self.db.counter("updates")
        return self.total
