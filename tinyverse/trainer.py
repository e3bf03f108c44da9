"""The train loop: sample sessions (in the background), train at the pace, publish params."""

import logging
import math
import time

from . import checks, declared
from .database import Database
from .errors import DatabaseError, command
from .every import Every
from .experiment import Experiment
from .options import store
from .pace import Pace
from .params import Publisher
from .prefetch import Prefetcher
from .workers import Worker

log = logging.getLogger(__name__)
SLOW = "for a batch (sampling is slow, or skips corrupt or foreign records)"


def train(
    exp, db, batch_size=32, updates=None, save_every=100, report_every=2, sync=None, on_report=None
) -> int:
    """Train ``updates`` updates (for ever if None) on batches of ``batch_size`` sessions (per live
    player with ``batch_per_player``) at the pace; return the last published version. Publishes
    (:class:`Publisher`) every ``save_every`` updates, while it waits for the pace, and at a (warm)
    stop; reports metrics every ``report_every`` s."""
    trainer = Trainer(exp, db, batch_size, sync, report_every, on_report)
    with trainer.worker as worker:
        try:
            while not worker.stop and trainer.done != updates:
                batch = trainer.next_batch()  # waits for sessions, then a sample (None: a stop)
                if batch is None or not trainer.wait_for_pace():  # it publishes while it waits
                    break
                trainer.train_step(batch)
                if trainer.done % save_every == 0:
                    trainer.publish()
                trainer.report(final=trainer.done == updates)  # a heartbeat: stop requests heard
        finally:
            trainer.prefetch.close()
        trainer.pace.flush()
        trainer.publish()  # a warm stop, or the last update
    version = trainer.publisher.version
    said = "stopped after %d updates here (%d in the run); params version %d is stored"
    log.info(said, trainer.done, trainer.pace.total, version)
    return version


class Trainer:
    """One trainer's waits, updates, publications and reports (the arguments of :func:`train`)."""

    def __init__(self, exp: Experiment, db: Database, batch_size, sync, report_every, on_report):
        self.settings = declared.check(exp)  # prefetch, local_params, keep_*, the pace
        self.exp = exp
        self.db = db
        self.batch_size = batch_size  # sessions an update (a live player's, with batch_per_player)
        depth = self.settings.prefetch
        self.prefetch = Prefetcher(exp, db, self.batch_size_now(), depth)  # refuses too big
        self.pace = Pace(exp, db)
        store(exp.run, db)  # the run's options, at its first write
        self.publisher = Publisher(exp, db, sync, self.settings.local_params)
        self.worker = Worker(db, "trainer", exp.run.args)
        self.worker.info |= {"pace": self.pace.spec, "updates": 0}
        self.worker.info["version"] = self.publisher.version
        if (every := self.settings.keep_every) and self.publisher.version % every == 0:
            self.retain(self.publisher.version)  # a trainer killed after publishing it kept none
        self.report_every = report_every
        self.on_report = on_report  # on_report(mean metrics, env steps), at each report
        self.say = Every(10.0)  # the log, every 10 s
        self.done = 0  # updates here
        self.saved = 0  # updates here at the last publication
        self.reported = 0  # updates here at the last report
        self.sums = {}  # of each metric since the last report
        self.fed = False  # whether enough sessions for a batch were stored, as last seen
        self.started = self.last_report = time.monotonic()
        checks.call("prepare_training", exp.prepare_training)

    def batch_size_now(self) -> int:
        """The batch to sample: ``batch_size`` sessions, times the live players if the experiment
        asks."""
        if not self.settings.batch_per_player:
            return self.batch_size
        players = sum(w["role"] == "player" for w in self.db.workers())
        return self.batch_size * max(1, players)

    def next_batch(self) -> dict | None:
        """The next update's batch, waiting while too few sessions are stored or the sample is
        slow; None if a stop came first."""
        batch = self.prefetch.get() if self.fed else None  # no look at the count while it flows
        while batch is None:
            stored = self.db.count_sessions().stored
            wanted = self.prefetch.batch_size
            self.fed = stored >= wanted
            if self.fed and (batch := self.prefetch.get()) is not None:
                break
            start = f"start a player: {command('play', self.db.prefix)}"
            why = SLOW if self.fed else f"for sessions: {stored} of {wanted} stored; {start}"
            if not self.worker.idle(why):
                return None
        return batch

    def wait_for_pace(self) -> bool:
        """Wait while the pace holds the next update back (:meth:`Pace.trainer_waits`),
        publishing meanwhile: the players catch up with the newest params. False on a stop."""
        while (why := self.pace.trainer_waits()) is not None:
            self.publish()
            if not self.worker.idle(why):
                return False
        return True

    def train_step(self, batch: dict) -> None:
        """An update, counted for the pace, its metrics summed for the next report."""
        self.exp.run._updates = self.pace.count(len(batch["rewards"]))  # read-only to exp
        for k, v in checks.train_step(self.exp, batch).items():
            self.sums[k] = self.sums.get(k, 0.0) + v
        self.done += 1

    def publish(self) -> None:
        """Push what was trained since the last publication, if anything."""
        if self.saved < self.done:
            self.saved = self.done
            version = self.publisher.push()
            self.retain(version)
            pushes = {"pushes": self.publisher.pushes, "conflicts": self.publisher.conflicts}
            self.worker.info |= {"version": version, **pushes}

    def retain(self, version: int) -> None:
        """Keep snapshots vN of the last versions and every keep_every-th (Database.retain)."""
        try:
            last = self.settings.keep_last
            self.db.retain(self.publisher.stored, version, last, self.settings.keep_every)
        except DatabaseError as e:  # full of named snapshots: training goes on
            log.warning("params v%d not kept as a snapshot: %s", version, e)

    def report(self, final: bool) -> None:
        """Heartbeat; every ``report_every`` seconds and at the last update, store the mean
        metrics (and look at the batch size again)."""
        now = time.monotonic()
        rate = round(self.done / (now - self.started), 1)
        self.worker.beat(updates=self.done, updates_per_s=rate)
        if now - self.last_report < self.report_every and not final:
            return
        self.pace.flush()
        self.prefetch.batch_size = self.batch_size_now()
        means = {k: v / (self.done - self.reported) for k, v in self.sums.items()}
        steps = self.db.env_steps(self.settings.session_length)
        p = self.publisher
        record = {"time": time.time(), "updates": self.done, "steps": steps, "version": p.version}
        record |= {"batch": self.prefetch.batch_size, "worker": self.worker.id}
        record |= {"push_s": round(p.seconds, 4), "pushes": p.pushes, "push_conflicts": p.conflicts}
        record["run_updates"] = self.pace.total  # all trainers', across restarts: plot's x-axis
        finite = {k: v for k, v in means.items() if math.isfinite(v)}  # NaN: no JSON (logged)
        self.db.add_metrics("train", [record | finite])
        if self.on_report is not None:
            self.on_report(means, steps)
        if self.say() or final:
            shown = " ".join([f"params v{p.version}", *(f"{k} {v:.4g}" for k, v in means.items())])
            said = "update %d of the run (%d here, %.0f/s) %s"
            log.info(said, self.pace.total, self.done, rate, shown)
        self.sums = {}
        self.reported = self.done
        self.last_report = now
