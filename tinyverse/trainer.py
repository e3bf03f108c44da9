"""The train loop: sample sessions (in the background), train at the pace, publish params."""

import contextlib
import itertools
import logging
import queue
import threading
import time

import numpy as np

from .database import Database
from .errors import TinyverseError
from .experiment import Experiment
from .monitor import EventWriter
from .params import Publisher
from .workers import Pace, StopFlag, Worker

log = logging.getLogger(__name__)


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
                batch = self._fetch()
                if batch is None:
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


def check_layout(exp: Experiment, db: Database) -> list | None:
    """The layout of the stored sessions (None: none known), checked against the experiment's observations."""
    stored = db.setting("layout")
    env = exp.make_env()
    shape = env.observation_space.shape
    env.close()
    obs = next((a[2][1:] for a in stored or [] if a[0] == "observations"), None)
    if obs is not None and shape is not None and obs != list(shape):
        raise TinyverseError(
            f"the sessions in prefix {db.prefix} hold observations of shape {obs}, this experiment's are "
            f"{list(shape)}: use another --prefix, or delete them with python -m tinyverse EXP clear --del-sessions"
        )
    return stored


def grown(batch_size: int, exp: Experiment, db: Database) -> int:
    """The batch to sample: ``batch_size`` sessions, times the live players if the experiment asks."""
    if not exp.batch_per_player:
        return batch_size
    return batch_size * max(1, sum(w["role"] == "player" for w in db.workers()))


def train(
    exp: Experiment,
    db: Database,
    batch_size: int = 32,
    steps: int | None = None,
    save_every: int = 100,
    buffer_size: int | None = None,
    report_every: float = 2.0,
    logdir: str | None = None,
    push_coef: float = 1.0,
    sync: bool | None = None,
    push_only: tuple[str, ...] = (),
) -> int:
    """Train on batches of ``batch_size`` sessions for ``steps`` updates (for ever if None).

    With ``exp.batch_per_player`` a batch is ``batch_size`` times the live players.

    Resumes from stored params (never overwrites them with a random init), keeps
    the experiment's pace (:class:`~tinyverse.workers.Pace`), publishes every ``save_every`` updates,
    when it starts to wait for players, and on SIGINT/SIGTERM, as a delta merged
    with other trainers' (:class:`~tinyverse.params.Publisher`: ``push_coef``,
    ``sync``, ``push_only``). ``buffer_size`` changes the capacity of the
    database. Returns the last published version.
    """
    if buffer_size is not None:
        db.set_capacity(buffer_size)
    pace = Pace(exp, db)
    db.layout = check_layout(exp, db)
    publisher = Publisher(exp, db, push_coef, sync, push_only, exp.local_params)
    version = publisher.version
    exp.prepare_training()
    worker = Worker(db, "trainer")
    events = EventWriter(logdir) if logdir else None
    done, sums, count, last_report, last_log, saved = 0, {}, 0, time.monotonic(), 0.0, 0
    started, batch = time.monotonic(), None

    def publish():  # what was trained since the last save, if anything
        nonlocal version, saved
        if saved < done:
            version, saved = publisher.push(), done

    def starved():
        nonlocal batch
        if batch is None and (stored := db.count_sessions()[0]) < (b := prefetch.batch_size):  # before the first
            return f"for sessions: {stored} of {b} stored; start a player: python -m tinyverse EXP play"
        batch = prefetch.get()
        return None if batch is not None else "for a batch (sampling is slow, or skips corrupt or foreign records)"

    with StopFlag() as flag:
        prefetch = None
        try:
            worker.beat(force=True, updates=0, version=version, pace=pace.spec)
            prefetch = Prefetcher(exp, db, grown(batch_size, exp, db), exp.prefetch)
            for _ in range(steps) if steps is not None else itertools.count():
                if not (worker.wait(flag, starved) and worker.wait(flag, pace.trainer_waits, publish)):
                    break
                metrics = exp.train_step(batch)
                pace.count(len(batch["rewards"]))
                done += 1
                for k, v in (metrics or {}).items():
                    sums[k] = sums.get(k, 0.0) + float(v)
                count += 1
                if done % save_every == 0:
                    publish()
                now = time.monotonic()
                rate = round(done / (now - started), 1)
                if worker.beat(updates=done, version=version, updates_per_s=rate, pushes=publisher.pushes,
                               conflicts=publisher.conflicts):  # fmt: skip
                    flag.stop = True
                if now - last_report >= report_every or done == steps:
                    pace.flush()
                    prefetch.batch_size = grown(batch_size, exp, db)
                    means = {k: v / count for k, v in sums.items()}
                    env_steps = db.count_sessions()[1] * exp.session_length
                    record = {"time": time.time(), "updates": done, "steps": env_steps, "version": version}
                    record["batch"] = prefetch.batch_size
                    record |= {"worker": worker.id, "push_s": round(publisher.seconds, 4), "pushes": publisher.pushes}
                    record["push_conflicts"] = publisher.conflicts
                    db.add_metrics("train", [{**record, **means}])
                    if events:
                        recent = [m["return"] for m in db.metrics("episodes", 20)]
                        extra = {"return/recent_mean": float(np.mean(recent))} if recent else {}
                        events.scalars({**{f"train/{k}": v for k, v in means.items()}, **extra}, env_steps)
                    shown = " ".join(f"{k} {v:.4g}" for k, v in means.items())
                    if now - last_log >= 10 or done == steps:  # metrics every 2 s, the log every 10 s
                        log.info("update %d (%.0f/s) params v%d %s", done, done / (now - started), version, shown)
                        last_log = now
                    sums, count, last_report = {}, 0, now
        finally:
            if prefetch is not None:
                prefetch.close()
            if events:
                events.close()
            worker.leave()
        pace.flush()
        publish()  # a warm stop or the last step
        log.info("stopped after %d updates; params version %d is stored", done, version)
    return version
