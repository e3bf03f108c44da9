"""The play loop: keep B environments running, record one session each a round, pick up new params."""

import itertools
import logging
import time
import zlib

import numpy as np

from .database import Database
from .errors import TinyverseError
from .experiment import Experiment, make_env
from .options import store
from .pace import Pace
from .params import sync_params
from .workers import StopFlag, Worker

log = logging.getLogger(__name__)


def play(
    exp: Experiment,
    db: Database,
    batch_size: int = 1,
    sessions: int | None = None,
    sync_every: int = 1,
    seed: int | None = None,
    report_every: float = 10.0,
) -> int:
    """Play ``batch_size`` environments, storing one session per environment per round.

    Runs ``sessions`` rounds (for ever if None), checks the params version every
    ``sync_every`` rounds, seeds random-init params when none are stored, and
    waits before a round while it is ahead of the trainers (:class:`~tinyverse.pace.Pace`);
    with ``sync_every`` 1 it keeps loading the newest params while it waits.
    Returns the number of sessions stored.
    """
    player, pace = Player(exp, db, batch_size, seed), Pace(exp, db)

    def sync(reseed: bool = True) -> None:
        version = player.version
        player.version = player.worker.info["version"] = sync_params(exp, db, version, reseed)
        if player.version != version:
            exp.update_count = db.counter("updates")

    def follow():  # while waiting for the trainers, act with their newest params at once
        sync(reseed=False)

    with StopFlag() as flag:
        try:
            store(exp, db)  # the run's options, at its first write
            sync()
            for rnd in range(sessions) if sessions is not None else itertools.count():
                if rnd % sync_every == 0 and rnd:
                    sync()
                if not player.worker.wait(flag, pace.player_waits, follow if sync_every == 1 else None):
                    break
                player.round()
                if player.report(report_every, pace.spec):
                    flag.stop = True
        finally:
            player.close()
    return player.stored


class Player:
    """B environments, their episodes so far, and the sessions recorded from them."""

    def __init__(self, exp: Experiment, db: Database, batch_size: int, seed: int | None):
        self.exp, self.db, self.B, self.T = exp, db, batch_size, exp.session_length
        rng = np.random.default_rng(seed)
        self.envs = [make_env(exp) for _ in range(batch_size)]
        self.obs = np.stack([env.reset(seed=int(rng.integers(2**31)))[0] for env in self.envs])
        self.memory = exp.initial_memory(batch_size)
        self.worker = Worker(db, "player")
        self.tag = np.int64(zlib.crc32(self.worker.id.encode()))
        self.ep_return, self.ep_length = np.zeros(batch_size), np.zeros(batch_size, np.int64)
        self.version, self.stored, self.steps = None, 0, 0
        self.started = self.shown = time.monotonic()
        self.recent: list[float] = []  # returns of this player's last 20 episodes

    def round(self) -> None:
        """Play T ticks in every environment; store the B sessions and the episodes that ended."""
        rec, finished = self._arrays(), []
        for t in range(self.T):
            actions, self.memory, *outputs = self.exp.act(self.obs, self.memory)
            actions = np.asarray(actions)
            for name, v in {"actions": actions, **_outputs(outputs, self.B)}.items():
                if rec.get(name) is None:  # allocated at the first tick, when its dtype and shape are known
                    rec[name] = np.zeros((self.B, self.T, *v.shape[1:]), v.dtype)
                rec[name][:, t] = v
            for i, env in enumerate(self.envs):
                o, r, term, trunc, _ = env.step(actions[i])
                self.ep_return[i] += r
                self.ep_length[i] += 1
                rec["rewards"][i, t], rec["terminated"][i, t], rec["truncated"][i, t] = r, term, trunc
                if term or trunc:
                    rec["final_observations"][i, t] = o
                    finished.append({"return": float(self.ep_return[i]), "length": int(self.ep_length[i])})
                    self.ep_return[i], self.ep_length[i] = 0, 0
                    o, _ = env.reset()
                    for k, v in self.exp.initial_memory(1).items():
                        self.memory[k][i] = v[0]
                self.obs[i] = o
            rec["observations"][:, t + 1] = self.obs
        self.steps += self.T * self.B
        info = {f"info.{k}": np.float64(v) for k, v in self.exp.session_info().items()}
        meta = {"version": np.int64(self.version or 0), "worker": self.tag, **info}
        self.db.add_sessions(
            [{**{k: v[i] for k, v in rec.items()}, **meta} for i in range(self.B)], self.exp.buffer_size
        )
        self.stored += self.B
        if finished:
            now, added = time.time(), self.db.count_sessions().added
            for f in finished:
                f.update(time=now, steps=added * self.T, worker=self.worker.id, version=self.version)
            self.db.add_metrics("episodes", finished)
            self.recent = (self.recent + [f["return"] for f in finished])[-20:]

    def _arrays(self) -> dict[str, np.ndarray]:
        """The arrays of one round of B sessions, the observations at tick 0 and the memory before it filled in."""
        B, T, shape, dtype = self.B, self.T, self.obs.shape[1:], self.obs.dtype
        rec = {
            "observations": np.zeros((B, T + 1, *shape), dtype),
            "final_observations": np.zeros((B, T, *shape), dtype),
        }
        rec |= {"actions": None, "rewards": np.zeros((B, T), np.float32)}
        rec |= {"terminated": np.zeros((B, T), bool), "truncated": np.zeros((B, T), bool)}
        rec["observations"][:, 0] = self.obs
        return rec | {f"memory.{k}": np.array(v) for k, v in self.memory.items()}

    def report(self, every: float, pace: dict) -> bool:
        """Log progress now and then, heartbeat; True if this player should stop."""
        rate = self.steps / max(time.monotonic() - self.started, 1e-9)
        if time.monotonic() - self.shown >= every:
            mean = f"{np.mean(self.recent):.1f}" if self.recent else "-"
            log.info("%d env steps (%.0f/s), params v%s, mean return %s", self.steps, rate, self.version, mean)
            self.shown = time.monotonic()
        counters = dict(steps=self.steps, sessions=self.stored, version=self.version, steps_per_s=round(rate, 1))
        return self.worker.beat(**counters, pace=pace)

    def close(self) -> None:
        for env in self.envs:
            env.close()
        self.worker.leave()


def _outputs(extra: list, B: int) -> dict[str, np.ndarray]:
    """The per-tick outputs ``act`` returned as a third item, named ``outputs.<name>``, checked."""
    outputs = extra[0] if extra else {}
    if len(extra) > 1:
        raise TinyverseError(f"act returned {2 + len(extra)} items: return (actions, memory[, outputs])")
    if not isinstance(outputs, dict):
        raise TinyverseError(f"act returned outputs of type {type(outputs).__name__}: outputs are a dict of arrays")
    named = {f"outputs.{k}": np.asarray(v) for k, v in outputs.items()}
    for name, v in named.items():
        if v.shape[:1] != (B,):
            raise TinyverseError(f"act returned {name} of shape {v.shape}: outputs are batched, ({B}, ...)")
    return named
