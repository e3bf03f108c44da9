"""The replay ratio players and trainers hold, counted in env steps in the database (docs: usage, "The pace")."""

FIELDS = ("updates_per_step", "learning_starts", "pace_slack", "session_length")  # what heartbeats show of it


class Pace:
    """One worker's view of ``lead = max(0, played - learning_starts) - updates / updates_per_step``."""

    def __init__(self, exp, db):
        self.spec = {k: getattr(exp, k) for k in FIELDS}
        self.ratio, self.starts, self.slack, self.T = self.spec.values()
        self.db, self.unit = db, exp.train_batch_size
        # the last update's size (the next one's guess), updates not yet counted, updates allowed without a look, and
        # all trainers' updates as of the last look
        self.size, self.pending, self.room, self.total = 1.0, 0.0, 0.0, 0

    def player_waits(self) -> str | None:
        """What a player waits for before its next round (while lead > slack), or None."""
        if self.ratio is None:
            return None
        played, updates = self.db.count_sessions().added * self.T, self.db.counter("updates")
        if max(0, played - self.starts) - updates / self.ratio <= self.slack:
            return None
        return f"for the trainers: {updates:,} updates for {played:,} env steps, target {self.ratio:g} an env step"

    def trainer_waits(self) -> str | None:
        """What a trainer waits for before its next update (until learning starts, while lead < -slack), or None."""
        if self.room >= self.size:  # allowed, as known from the last look: no round trip
            return None
        played, updates = self.db.count_sessions().added * self.T, self.flush()
        if played < self.starts:
            return f"for players: {played:,} of {self.starts:,} env steps played before learning starts"
        room = 2000 if self.ratio is None else self.ratio * (played - self.starts + self.slack) - updates - self.pending
        if room < self.size:  # the next update would overshoot the pace
            return f"for players: {updates:,} updates for {played:,} env steps, target {self.ratio:g} an env step"
        self.room = max(self.size, min(room / 2, 1000))  # look again halfway: other trainers share the room
        return None

    def count(self, sessions: int) -> int:
        """Count an update on ``sessions`` sessions; return the run's updates before it (all trainers', as known)."""
        before, self.size = self.total + int(self.pending), sessions / self.unit
        self.pending, self.room = self.pending + self.size, self.room - self.size
        return before

    def flush(self) -> int:
        """Count this trainer's whole updates in the database; return the total of all trainers."""
        n, self.pending = int(self.pending), self.pending - int(self.pending)
        self.total = self.db.add_to_counter("updates", n) if n else self.db.counter("updates")
        return self.total
