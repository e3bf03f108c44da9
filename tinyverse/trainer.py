"""The train loop: sample sessions in the background, train, publish params."""

import itertools
import logging
import queue
import threading
import time

import numpy as np

from .experiment import Experiment, check_params
from .monitor import EventWriter
from .workers import StopFlag, Worker

log = logging.getLogger(__name__)


def collate(sessions: list[dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
    """Stack sessions into a batch, dropping any whose arrays differ from the first's."""
    first = sessions[0]
    shape = {k: (v.shape, v.dtype) for k, v in first.items()}
    keep = [s for s in sessions if {k: (v.shape, v.dtype) for k, v in s.items()} == shape]
    if len(keep) < len(sessions):
        log.warning(
            "dropped %d sessions of another shape: clear old sessions with --del-sessions", len(sessions) - len(keep)
        )
    return {k: np.stack([s[k] for s in keep]) for k in first}


class Prefetcher:
    """Keeps ``depth`` batches ready in a thread, so training never waits on the database.

    With ``depth`` 0 batches are fetched in the training thread instead: faster
    when a batch is cheap to fetch and an update is short, because a second
    Python thread competes for the GIL (cartpole_dqn: 1.3-1.6x more updates/s).
    """

    def __init__(self, exp: Experiment, db, batch_size: int, depth: int = 2):
        self.exp, self.db, self.batch_size = exp, db, batch_size
        self.queue: queue.Queue = queue.Queue(maxsize=max(depth, 1))
        self.error: BaseException | None = None
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._run, name="prefetch", daemon=True) if depth > 0 else None
        if self.thread:
            self.thread.start()

    def _fetch(self) -> dict[str, np.ndarray] | None:
        got = self.exp.sample(self.db, self.batch_size)
        batch = collate(got) if isinstance(got, list) and got else got  # sessions, or a batch
        return batch if batch and len(next(iter(batch.values()))) >= self.batch_size else None

    def _run(self):
        try:
            while not self.done.is_set():
                batch = self._fetch()
                if batch is None:
                    time.sleep(0.05)
                    continue
                while not self.done.is_set():
                    try:
                        self.queue.put(batch, timeout=0.1)
                        break
                    except queue.Full:
                        pass
        except BaseException as e:  # handed to the training thread, raised there
            self.error = e

    def get(self, flag: StopFlag) -> dict[str, np.ndarray] | None:
        """The next batch, or None once ``flag`` says stop (a starved trainer still stops)."""
        while not flag.stop:
            if self.thread is None:
                batch = self._fetch()
                if batch is not None:
                    return batch
                time.sleep(0.05)
                continue
            if self.error is not None:
                raise self.error
            try:
                return self.queue.get(timeout=0.1)
            except queue.Empty:
                pass
        return None

    def close(self):
        self.done.set()
        if self.thread:
            self.thread.join(timeout=5)


def wait_for_sessions(db, n: int, flag: StopFlag, worker: Worker) -> bool:
    """Block until ``n`` sessions are stored, saying so every few seconds."""
    said = 0.0
    while not flag.stop:
        if worker.beat():
            return False
        stored = db.count_sessions()[0]
        if stored >= n:
            return True
        if time.monotonic() - said > 5:
            log.info("waiting for sessions: %d of %d stored; start a player: python -m tinyverse EXP play", stored, n)
            said = time.monotonic()
        time.sleep(0.2)
    return False


def train(
    exp: Experiment,
    db,
    batch_size: int = 32,
    steps: int | None = None,
    save_every: int = 100,
    buffer_size: int | None = None,
    report_every: float = 2.0,
    logdir: str | None = None,
) -> int:
    """Train on batches of ``batch_size`` sessions for ``steps`` updates (for ever if None).

    Resumes from stored params (never overwrites them with a random init),
    publishes every ``save_every`` updates and on SIGINT/SIGTERM. Returns the
    last published params version.
    """
    if buffer_size is not None:
        db.set_capacity(buffer_size)
    found = db.load_params()
    if found is not None:
        check_params(exp.get_params(), found[1], f"database {db.url} (prefix {db.prefix})")
        exp.set_params(found[1])
        version = found[0]
        log.info("resuming from params version %d", version)
    else:
        version = db.save_params(exp.get_params(), if_absent=True) or db.params_version() or 0
    exp.prepare_training()
    worker = Worker(db, "trainer")
    events = EventWriter(logdir) if logdir else None
    done, sums, count, last_report, last_log = 0, {}, 0, time.monotonic(), 0.0
    started = time.monotonic()
    with StopFlag() as flag:
        prefetch = None
        try:
            worker.beat(force=True, updates=0, version=version)
            if not wait_for_sessions(db, batch_size, flag, worker):
                return version
            prefetch = Prefetcher(exp, db, batch_size, exp.prefetch)
            for _ in range(steps) if steps is not None else itertools.count():
                batch = prefetch.get(flag)
                if batch is None:
                    break
                metrics = exp.train_step(batch)
                done += 1
                for k, v in (metrics or {}).items():
                    sums[k] = sums.get(k, 0.0) + float(v)
                count += 1
                if done % save_every == 0:
                    version = db.save_params(exp.get_params(), min_version=version + 1)
                now = time.monotonic()
                if worker.beat(updates=done, version=version, updates_per_s=round(done / (now - started), 1)):
                    flag.stop = True
                if now - last_report >= report_every or done == steps:
                    means = {k: v / count for k, v in sums.items()}
                    env_steps = db.count_sessions()[1] * exp.session_length
                    record = {"time": time.time(), "updates": done, "steps": env_steps, "version": version}
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
        # a warm stop or the last step: publish what was trained since the last save
        if done % save_every:
            version = db.save_params(exp.get_params(), min_version=version + 1)
        log.info("stopped after %d updates; params version %d is stored", done, version)
    return version
