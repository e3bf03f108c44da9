"""A trainer's batches, sampled ahead in a background thread."""

import queue
import threading

from . import checks, declared
from .database import Database
from .experiment import Experiment


class Prefetcher:
    """``depth`` batches on their way in a daemon thread (started by the first :meth:`get`), so that
    training never waits on the database, nor a stop on a sample (0: the training thread fetches
    them, faster when a batch is cheap and an update short: no second thread for the GIL)."""

    def __init__(self, exp: Experiment, db: Database, batch_size: int, depth: int = 2):
        self.exp = exp
        self.db = db
        self.batch_size = batch_size  # sessions a batch (the trainer grows it)
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
