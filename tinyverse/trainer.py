"""The train loop: sample sessions (in the background), train at the pace, publish params."""

import logging
import queue
import threading
import time

from . import checks, declared
from .database import Database
from .errors import command
from .every import Every
from .experiment import Experiment
from .options import store
from .pace import Pace
from .params import Publisher
from .workers import Worker

log = logging.getLogger(__name__)


def train(
    exp: Experiment, db: Database, batch_size=32, steps=None, save_every=100, report_every=2, sync=None, on_report=None
) -> int:
    """Train ``steps`` updates (for ever if None) on batches of ``batch_size`` sessions (per live player with
    ``exp.batch_per_player``) at the pace; return the last published version. Publishes (:class:`Publisher`) every
    ``save_every`` updates, while waiting, and at a (warm) stop; reports metrics every ``report_every`` s."""
    trainer = Trainer(exp, db, batch_size, steps, save_every, report_every, sync, on_report)
    with trainer.worker:
        try:
            trainer.worker.run(steps, trainer.step, trainer.starved, trainer.behind)
        finally:
            trainer.prefetch.close()
        trainer.pace.flush()
        trainer.publish()  # a warm stop or the last step
    done, updates, version = trainer.done, trainer.pace.total, trainer.publisher.version
    log.info("stopped after %d updates here (%d in the run); params version %d is stored", done, updates, version)
    return version


class Trainer:
    """One trainer's updates, publications and reports (the arguments of :func:`train`)."""

    def __init__(self, exp: Experiment, db: Database, batch_size, steps, save_every, report_every, sync, on_report):
        declared.check(exp)
        self.exp, self.db, self.batch_size = exp, db, batch_size
        self.steps, self.save_every = steps, save_every
        self.prefetch = Prefetcher(exp, db, self.grown(), exp.prefetch)  # refuses a batch too big
        self.pace = Pace(exp, db)
        store(exp, db)  # the run's options, at its first write
        self.publisher, self.worker = Publisher(exp, db, sync, exp.local_params), Worker(db, "trainer")
        self.worker.info |= {"pace": self.pace.spec, "updates": 0, "version": self.publisher.version}
        self.report_every, self.on_report, self.say = report_every, on_report, Every(10.0)  # the log every 10 s
        self.done, self.saved, self.reported, self.batch, self.sums = 0, 0, 0, None, {}
        self.started = self.last_report = time.monotonic()
        checks.call("prepare_training", exp.prepare_training)

    def grown(self) -> int:
        """The batch to sample: ``batch_size`` sessions, times the live players if the experiment asks."""
        players = sum(w["role"] == "player" for w in self.db.workers()) if self.exp.batch_per_player else 1
        return self.batch_size * max(1, players)

    def starved(self) -> str | None:
        """What the next update waits for, or None when its batch is here."""
        if self.batch is None and (stored := self.db.count_sessions().stored) < (b := self.prefetch.batch_size):
            return f"for sessions: {stored} of {b} stored; start a player: {command('play', self.db.prefix)}"
        self.batch = self.prefetch.get()
        return None if self.batch is not None else "for a batch (sampling is slow, or skips corrupt or foreign records)"

    def behind(self) -> str | None:
        """What the next update waits for of the pace (:meth:`Pace.trainer_waits`); meanwhile, publish."""
        if (reason := self.pace.trainer_waits()) is not None:
            self.publish()
        return reason

    def publish(self) -> None:
        """Push what was trained since the last publication, if anything."""
        if self.saved < self.done:
            p, self.saved = self.publisher, self.done
            self.worker.info |= {"version": p.push(), "pushes": p.pushes, "conflicts": p.conflicts}

    def step(self) -> bool:
        """An update on the batch :meth:`starved` fetched; True if this trainer should stop."""
        self.exp.update_count = self.pace.count(len(self.batch["rewards"]))
        for k, v in checks.train_step(self.exp, self.batch).items():
            self.sums[k] = self.sums.get(k, 0.0) + v
        self.done += 1
        if self.done % self.save_every == 0:
            self.publish()
        return self.report()

    def report(self) -> bool:
        """Heartbeat; every ``report_every`` seconds and at the last step, store the mean metrics. True: stop."""
        now, p, final = time.monotonic(), self.publisher, self.done == self.steps
        rate = round(self.done / (now - self.started), 1)
        stop = self.worker.beat(updates=self.done, updates_per_s=rate)
        if now - self.last_report < self.report_every and not final:
            return stop
        self.pace.flush()
        self.prefetch.batch_size = self.grown()
        means = {k: v / (self.done - self.reported) for k, v in self.sums.items()}
        steps = self.db.count_sessions().added * self.exp.session_length
        record = {"time": time.time(), "updates": self.done, "steps": steps, "version": p.version}
        record |= {"batch": self.prefetch.batch_size, "worker": self.worker.id, "push_s": round(p.seconds, 4)}
        self.db.add_metrics("train", [record | {"pushes": p.pushes, "push_conflicts": p.conflicts, **means}])
        if self.on_report is not None:
            self.on_report(means, steps)
        if self.say() or final:
            shown = " ".join([f"params v{p.version}", *(f"{k} {v:.4g}" for k, v in means.items())])
            log.info("update %d of the run (%d here, %.0f/s) %s", self.pace.total, self.done, rate, shown)
        self.sums, self.reported, self.last_report = {}, self.done, now
        return stop


class Prefetcher:
    """``depth`` batches on their way in a daemon thread (started by the first :meth:`get`), so that
    training never waits on the database, nor a stop on a sample (0: the training thread fetches
    them, faster when a batch is cheap and an update short: no second thread for the GIL)."""

    def __init__(self, exp: Experiment, db: Database, batch_size: int, depth: int = 2):
        self.exp, self.db, self.batch_size = exp, db, batch_size
        self.fits = 0  # the batch size known to fit in memory
        self.ahead = queue.Queue(depth) if depth > 0 else None
        self.thread = threading.Thread(target=self._run, name="prefetch", daemon=True)
        self.closed = threading.Event()
        self._fit()

    def _fit(self) -> None:
        if self.fits != self.batch_size and declared.batch_fits(self.db, self.batch_size):
            self.fits = self.batch_size

    def _fetch(self) -> dict | None:
        self._fit()  # the batch may have grown
        return checks.sample(self.exp, self.db, self.batch_size)

    def _run(self) -> None:
        while not self.closed.is_set():
            try:
                self.ahead.put(self._fetch())
            except Exception as e:  # raised in the training thread by get()
                self.ahead.put(e)

    def get(self) -> dict | None:
        """The next batch (a sampling error raised here), or None if none came within 0.1 s."""
        if self.ahead is not None and self.thread.ident is None:
            self.thread.start()  # at the first get: sessions are stored
        try:
            batch = self._fetch() if self.ahead is None else self.ahead.get(timeout=0.1)
        except queue.Empty:
            return None
        if isinstance(batch, Exception):
            raise batch
        return batch

    def close(self) -> None:
        self.closed.set()  # the thread ends at its next put, which emptying the queue lets through
        while self.ahead is not None and not self.ahead.empty():
            self.ahead.get_nowait()
