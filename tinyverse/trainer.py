"""The train loop: sample sessions (in the background), train at the pace, publish params."""

import contextlib
import logging
import queue
import threading
import time
from collections.abc import Callable

from .errors import Every, command
from .experiment import Experiment
from .options import store
from .pace import Pace
from .params import Publisher
from .workers import Worker

log = logging.getLogger(__name__)


def train(
    exp: Experiment,
    db,
    batch_size: int = 32,
    steps: int | None = None,
    save_every: int = 100,
    report_every: float = 2.0,
    sync: bool | None = None,
    push_coef: float = 1.0,  # ignored: accepted until cli.py stops passing it (--push-coef is removed)
    on_report: Callable[[dict, int], None] | None = None,
) -> int:
    """Train on batches of ``batch_size`` sessions (times the live players with ``exp.batch_per_player``) for
    ``steps`` updates (for ever if None), at the pace (:class:`~tinyverse.pace.Pace`); return the last published
    version. Resumes from the stored params, publishes (:class:`~tinyverse.params.Publisher`, ``sync``) every
    ``save_every`` updates, when it starts to wait for players, and at the end (a warm stop on SIGINT/SIGTERM).
    Every ``report_every`` seconds the mean metrics go to the database and to ``on_report(metrics, env_steps)``."""
    trainer = Trainer(exp, db, batch_size, steps, save_every, sync)
    trainer.report_every, trainer.on_report = report_every, on_report
    with trainer.worker:
        try:
            trainer.worker.run(steps, trainer.step, trainer.starved, trainer.behind)
        finally:
            trainer.prefetch.close()
        trainer.pace.flush()
        trainer.publish()  # a warm stop or the last step
    updates, version = trainer.pace.total, trainer.publisher.version
    log.info(
        "stopped after %d updates here (%d in the run); params version %d is stored", trainer.done, updates, version
    )
    return version


class Trainer:
    """One trainer's updates, publications and reports."""

    def __init__(self, exp: Experiment, db, batch_size: int, steps: int | None, save_every: int, sync: bool | None):
        self.pace = Pace(exp, db)
        store(exp, db)  # the run's options, at its first write
        self.publisher, self.worker = Publisher(exp, db, sync, exp.local_params), Worker(db, "trainer")
        self.worker.info |= {"pace": self.pace.spec, "updates": 0, "version": self.publisher.version}
        self.exp, self.db, self.batch_size, self.steps, self.save_every = exp, db, batch_size, steps, save_every
        self.report_every, self.on_report, self.say = 2.0, None, Every(10.0)  # metrics every 2 s, the log every 10 s
        self.done, self.saved, self.reported, self.batch, self.sums = 0, 0, 0, None, {}
        self.started = self.last_report = time.monotonic()
        exp.prepare_training()
        self.prefetch = Prefetcher(exp, db, self.grown(), exp.prefetch)

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

    def behind(self) -> str | None:
        """What the next update waits for of the pace (:meth:`Pace.trainer_waits`); meanwhile, publish."""
        if (reason := self.pace.trainer_waits()) is not None:
            self.publish()
        return reason

    def publish(self) -> None:
        """Push what was trained since the last publication, if anything."""
        if self.saved < self.done:
            self.publisher.push()
            self.saved = self.done

    def step(self) -> bool:
        """An update on the batch :meth:`starved` fetched; True if this trainer should stop."""
        self.exp.update_count = self.pace.count(len(self.batch["rewards"]))
        metrics = self.exp.train_step(self.batch)
        self.done += 1
        for k, v in (metrics or {}).items():
            self.sums[k] = self.sums.get(k, 0.0) + float(v)
        if self.done % self.save_every == 0:
            self.publish()
        return self.report()

    def report(self) -> bool:
        """Heartbeat; every ``report_every`` seconds and at the last step, store the mean metrics. True: stop."""
        now, p, final = time.monotonic(), self.publisher, self.done == self.steps
        rate = round(self.done / (now - self.started), 1)
        stop = self.worker.beat(
            updates=self.done, version=p.version, updates_per_s=rate, pushes=p.pushes, conflicts=p.conflicts
        )
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
            shown = " ".join(f"{k} {v:.4g}" for k, v in means.items())
            log.info(
                "update %d of the run (%d here, %.0f/s) params v%d %s",
                self.pace.total,
                self.done,
                rate,
                p.version,
                shown,
            )
        self.sums, self.reported, self.last_report = {}, self.done, now
        return stop


class Prefetcher:
    """Keeps ``depth`` batches ready in a thread, so training never waits on the database. With ``depth`` 0 the
    training thread fetches them: faster when a batch is cheap and an update short (no second thread for the GIL)."""

    def __init__(self, exp: Experiment, db, batch_size: int, depth: int = 2):
        self.exp, self.db, self.batch_size, self.done, self.error = exp, db, batch_size, False, None
        self.queue: queue.Queue = queue.Queue(maxsize=max(depth, 1))
        self.thread = threading.Thread(target=self._run, name="prefetch", daemon=True) if depth > 0 else None
        if self.thread:
            self.thread.start()

    def _fetch(self) -> dict | None:
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

    def get(self) -> dict | None:
        """The next batch, or None if none came within 0.1 s."""
        if self.thread is None:
            return self._fetch()
        if self.error is not None:
            raise self.error
        with contextlib.suppress(queue.Empty):
            return self.queue.get(timeout=0.1)
        return None

    def close(self):
        self.done, deadline = True, time.monotonic() + 5
        while self.thread and self.thread.is_alive() and time.monotonic() < deadline:
            with contextlib.suppress(queue.Empty):
                self.queue.get_nowait()
            self.thread.join(0.05)
