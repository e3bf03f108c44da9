"""``train --logdir``: the trainer's metrics and the recent returns as TensorBoard event files, on
the run's update count."""

import numpy as np

from ..database import Database
from ..errors import TinyverseError, install


class EventWriter:
    """Scalars for TensorBoard, written by tensorboardX (pip install 'tinyverse[tensorboard]')."""

    def __init__(self, logdir: str, db: Database | None = None):
        try:
            from tensorboardX import SummaryWriter
        except ImportError:
            needs = f"--logdir needs tensorboardX: {install('tensorboardX')}"
            raise TinyverseError(needs) from None
        self.db = db
        self.writer = SummaryWriter(logdir)

    def scalars(self, values: dict[str, float], step: int) -> None:
        for tag, v in values.items():
            self.writer.add_scalar(tag, v, step)
        self.writer.flush()

    def report(self, metrics: dict[str, float], env_steps: int) -> None:
        """A trainer's report (its mean metrics, the env steps played, the mean recent return)
        against the run's update count: all trainers', so that a restarted trainer carries the
        curves on where they stopped (``db`` needed)."""
        recent = self.db.recent_returns(20)
        values = {f"train/{k}": v for k, v in metrics.items()} | {"run/env_steps": env_steps}
        values |= {"return/recent_mean": float(np.mean(recent))} if recent else {}
        self.scalars(values, self.db.counter("updates"))

    def close(self) -> None:
        self.writer.close()
