"""The train loop: sample sessions (in the background), train at the pace, publish params."""

import contextlib
import itertools
import logging
import queue
import threading
import time
from collections.abc import Callable

import numpy as np

from .database import Database
from .errors import command
from .experiment import Experiment
from .options import store
from .pace import Pace
from .params import Publisher
from .workers import StopFlag, Worker

log = logging.getLogger(__name__)


def train(
    exp: Experiment,
    db: Database,
    batch_size: int = 32,
    steps: int | None = None,
    save_every: int = 100,
    report_every: float = 2.0,
    sync: bool | None = None,
    push_coef: float = 1.0,
    on_report: Callable[[dict, int], None] | None = None,
) -> int:
    """Train on batches of ``batch_size`` sessions for ``steps`` updates (for ever if None).

    With ``exp.batch_per_player`` a batch is ``batch_size`` times the live players.
    Resumes from stored params (never overwrites them with a random init), keeps
    the experiment's pace (:class:`~tinyverse.pace.Pace`), publishes every
    ``save_every`` updates, when it starts to wait for players, and on
    SIGINT/SIGTERM, as a delta merged with other trainers' (:class:`~tinyverse.params.Publisher`:
    ``sync``, ``push_coef``).
    Every ``report_every`` seconds the mean metrics go to the database (and to
    ``on_report(metrics, env_steps)``). Returns the last published version.
    """
    pace = Pace(exp, db)
    store(exp, db)  # the run's options, at its first write
    trainer = Trainer(exp, db, batch_size, save_every, Publisher(exp, db, sync, exp.local_params, push_coef), on_report)
    exp.prepare_training()
    with StopFlag() as flag:
        prefetch = None
        try:
            trainer.worker.beat(force=True, updates=0, version=trainer.publisher.version, pace=pace.spec)
            prefetch = trainer.prefetch = Prefetcher(exp, db, trainer.grown(), exp.prefetch)
            for _ in range(steps) if steps is not None else itertools.count():
                if not (
                    trainer.worker.wait(flag, trainer.starved)
                    and trainer.worker.wait(flag, pace.trainer_waits, trainer.publish)
                ):
                    break
                trainer.step(pace)
                if trainer.report(report_every, pace, final=trainer.done == steps):
                    flag.stop = True
        finally:
            if prefetch is not None:
                prefetch.close()
            trainer.worker.leave()
        pace.flush()
        trainer.publish()  # a warm stop or the last step
        log.info("stopped after %d updates here (%d in the run); params version %d is stored", trainer.done,
                 pace.total, trainer.publisher.version)  # fmt: skip
    return trainer.publisher.version


class Trainer:
    """One trainer's updates, publications and reports."""

    def __init__(self, exp, db: Database, batch_size: int, save_every: int, publisher: Publisher, on_report=None):
        self.exp, self.db, self.batch_size, self.save_every, self.on_report = exp, db, batch_size, save_every, on_report
        self.publisher, self.worker, self.prefetch = publisher, Worker(db, "trainer"), None
        self.done, self.saved, self.batch, self.sums, self.count = 0, 0, None, {}, 0
        self.started = self.last_report = self.last_log = time.monotonic()

    def grown(self) -> int:
        """The batch to sample: ``batch_size`` sessions, times the live players if the experiment asks."""
        if not self.exp.batch_per_player:
            return self.batch_size
        return self.batch_size * max(1, sum(w["role"] == "player" for w in self.db.workers()))

    def starved(self) -> str | None:
        """What the next update waits for, or None when its batch is here."""
        if self.batch is None and (stored := self.db.count_sessions().stored) < (b := self.prefetch.batch_size):
            return f"for sessions: {stored} of {b} stored; start a player: {command('play')}"
        self.batch = self.prefetch.get()
        return None if self.batch is not None else "for a batch (sampling is slow, or skips corrupt or foreign records)"

    def publish(self) -> None:
        """Push what was trained since the last publication, if anything."""
        if self.saved < self.done:
            self.publisher.push()
            self.saved = self.done

    def step(self, pace: Pace) -> None:
        self.exp.update_count = pace.updates()
        metrics = self.exp.train_step(self.batch)
        pace.count(len(self.batch["rewards"]))
        self.done += 1
        for k, v in (metrics or {}).items():
            self.sums[k] = self.sums.get(k, 0.0) + float(v)
        self.count += 1
        if self.done % self.save_every == 0:
            self.publish()

    def report(self, every: float, pace: Pace, final: bool) -> bool:
        """Heartbeat; every ``every`` seconds store the mean metrics. True if this trainer should stop."""
        now, p = time.monotonic(), self.publisher
        rate = round(self.done / (now - self.started), 1)
        stop = self.worker.beat(updates=self.done, version=p.version, updates_per_s=rate, pushes=p.pushes,
                                conflicts=p.conflicts)  # fmt: skip
        if now - self.last_report < every and not final:
            return stop
        pace.flush()
        self.prefetch.batch_size = self.grown()
        means = {k: v / self.count for k, v in self.sums.items()}
        record = {
            "time": time.time(),
            "updates": self.done,
            "steps": self.db.count_sessions().added * self.exp.session_length,
        }
        record |= {"version": p.version, "batch": self.prefetch.batch_size, "worker": self.worker.id}
        record |= {"push_s": round(p.seconds, 4), "pushes": p.pushes, "push_conflicts": p.conflicts, **means}
        self.db.add_metrics("train", [record])
        if self.on_report is not None:
            self.on_report(means, record["steps"])
        if now - self.last_log >= 10 or final:  # metrics every 2 s, the log every 10 s
            shown = " ".join(f"{k} {v:.4g}" for k, v in means.items())
            rate = self.done / (now - self.started)
            log.info(
                "update %d of the run (%d here, %.0f/s) params v%d %s",
                pace.updates(),
                self.done,
                rate,
                p.version,
                shown,
            )
            self.last_log = now
        self.sums, self.count, self.last_report = {}, 0, now
        return stop


class Prefetcher:
    """Keeps ``depth`` batches ready in a thread, so training never waits on the database.

    With ``depth`` 0 batches are fetched in the training thread instead: faster
    when a batch is cheap to fetch and an update is short, because a second
    Python thread competes for the GIL (cartpole_dqn: 1.3-1.6x more updates/s).
    """

    def __init__(self, exp: Experiment, db: Database, batch_size: int, depth: int = 2):
        self.exp, self.db, self.batch_size, self.done = exp, db, batch_size, False
        self.queue: queue.Queue = queue.Queue(maxsize=max(depth, 1))
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, name="prefetch", daemon=True) if depth > 0 else None
        if self.thread:
            self.thread.start()

    def _fetch(self) -> dict[str, np.ndarray] | None:
        batch = self.exp.sample(self.db, self.batch_size)
        return batch if batch and len(batch["rewards"]) else None  # short after skipped records: still good

    def _run(self):
        try:
            while not self.done:
                if (batch := self._fetch()) is None:
                    time.sleep(0.05)
                else:
                    self.queue.put(batch)  # waits while full; close() drains the queue to end the wait
        except BaseException as e:  # handed to the training thread, raised there
            self.error = e

    def get(self) -> dict[str, np.ndarray] | None:
        """The next batch, or None if none came within 0.1 s."""
        if self.thread is None:
            return self._fetch()
        if self.error is not None:
            raise self.error
        try:
            return self.queue.get(timeout=0.1)
        except queue.Empty:
            return None

    def close(self):
        self.done, deadline = True, time.monotonic() + 5
        while self.thread and self.thread.is_alive() and time.monotonic() < deadline:
            with contextlib.suppress(queue.Empty):
                self.queue.get_nowait()
            self.thread.join(0.05)
