"""The play loop: B environments running, a session of each recorded a round, new params loaded."""

import collections
import logging
import time
import zlib

import numpy as np

from . import checks, declared, spaces
from .database import Database
from .every import Every
from .experiment import Experiment
from .league import opponent, result
from .options import store
from .pace import Pace
from .params import sync_params
from .workers import Worker

log = logging.getLogger(__name__)


def play(exp, db, batch_size=1, rounds=None, sync_every=1, seed=None, report_every=10.0) -> int:
    """Play ``batch_size`` environments for ``rounds`` rounds (for ever if None), storing a session
    from each a round; return the number stored. Waits while ahead of the trainers
    (:class:`~tinyverse.pace.Pace`), with ``sync_every`` 1 loading the newest params meanwhile;
    checks the params version every ``sync_every`` rounds (storing this player's when none are)."""
    player = Player(exp, db, batch_size, seed, sync_every, report_every)
    try:
        with player.worker as worker:
            player.start()  # makes the environments, heeding a stop
            while not worker.stop and player.rounds != rounds:
                if not player.wait_for_pace():  # with sync_every 1 it loads newer params meanwhile
                    break
                if player.rounds % sync_every == 0:
                    player.sync(reseed=True)  # stores this player's params if none are
                player.record()  # T ticks in each environment: B sessions, the episodes that ended
                player.report()  # a heartbeat: stop requests heard
    finally:
        for env in player.envs:
            env.close()
    return player.rounds * batch_size


class Player:
    """B environments, their episodes so far, and the sessions recorded from them."""

    def __init__(self, exp: Experiment, db: Database, batch_size, seed, sync_every, report_every):
        self.settings = declared.check(exp)  # session_length, buffer_size, the pace
        self.exp = exp
        self.db = db
        self.B = batch_size
        self.sync_every = sync_every
        self.pace = Pace(exp, db)
        self.worker = Worker(db, "player", exp.run.args)
        self.worker.info["pace"] = self.pace.spec
        self.say = Every(report_every)  # the log
        self.envs = []  # made by start()
        self.seed = seed
        self.act = checks.Act(exp, batch_size)
        self.tag = np.int64(zlib.crc32(self.worker.id.encode()))  # its sessions' "worker"
        self.returns = np.zeros(batch_size)  # of the running episodes
        self.lengths = np.zeros(batch_size, np.int64)  # of the running episodes
        self.version = None  # of the params it acts with
        self.rounds = 0
        self.started = time.monotonic()
        self.recent = collections.deque(maxlen=20)  # returns of this player's last 20 episodes

    def start(self) -> bool:
        """Make the environments (False: a stop came between two), store the options, reset them."""
        while len(self.envs) < self.B:
            if self.worker.stop or self.worker.beat():
                return False
            self.envs.append(checks.make_env(self.exp))
        store(self.exp.run, self.db)  # the run's options, at its first write: the envs are made
        rng = np.random.default_rng(self.seed)
        first = [checks.reset(env, seed=int(rng.integers(2**31))) for env in self.envs]
        self.space = self.envs[0].observation_space
        self.obs = spaces.stack(self.space, first)  # (B, ...) arrays by name
        self.seen = spaces.nest(self.obs)  # what act gets: the same arrays, nested as the space
        self.memory = checks.initial_memory(self.exp, self.B)
        return True

    def wait_for_pace(self) -> bool:
        """Wait while this player is ahead of the trainers (:meth:`Pace.player_waits`); with
        ``sync_every`` 1, the newest params are loaded meanwhile. False on a stop."""
        while (why := self.pace.player_waits()) is not None:
            if self.sync_every == 1:
                self.sync()
            if not self.worker.idle(why):
                return False
        return True

    def sync(self, reseed: bool = False) -> None:
        """Load newer params if some are stored (``reseed``: store this player's if none are)."""
        version = self.version
        self.version = sync_params(self.exp, self.db, self.version, reseed)
        if self.version != version:
            self.exp.run._updates = self.db.counter("updates")  # the core's, read-only to exp
            self.worker.info["version"] = self.version

    def report(self) -> None:
        """Heartbeat with this player's counters; now and then, a line in the log."""
        steps = self.rounds * self.B * self.settings.session_length
        rate = steps / max(time.monotonic() - self.started, 1e-9)
        if self.say():
            mean = f"{np.mean(self.recent):.1f}" if self.recent else "-"
            said = "%d env steps (%.0f/s), params v%s, mean return %s"
            log.info(said, steps, rate, self.version, mean)
        self.worker.beat(steps=steps, sessions=self.rounds * self.B, steps_per_s=round(rate, 1))

    def record(self) -> None:
        """Play T ticks in every environment; store the B sessions and the episodes that ended."""
        B = self.B
        T = self.settings.session_length
        memory = {f"memory.{k}": np.array(v) for k, v in self.memory.items()}  # before tick 0
        rec = {k: np.repeat(v[:, None], T + 1, 1) for k, v in self.obs.items()}  # tick 0 on
        rec |= {f"final_{k}": np.zeros_like(v[:, 1:]) for k, v in rec.items()}
        rec |= {"rewards": np.zeros((B, T), "f4")}
        rec |= {"terminated": np.zeros((B, T), bool), "truncated": np.zeros((B, T), bool)}
        acted = []  # act's actions and outputs of each tick, stacked at the end
        ended = []  # the episodes that ended
        for t in range(T):
            actions, self.memory, outputs = self.act(self.seen, self.memory)
            acted.append({"actions": actions, **outputs})
            for i, env in enumerate(self.envs):
                o, r, terminated, truncated, info = checks.step(env, actions[i])
                rec["rewards"][i, t] = r
                rec["terminated"][i, t] = terminated
                rec["truncated"][i, t] = truncated
                self.returns[i] += r
                self.lengths[i] += 1
                if terminated or truncated:
                    for k, v in spaces.flatten(self.space, o).items():
                        rec[f"final_{k}"][i, t] = v
                    episode = {"return": float(self.returns[i]), "length": int(self.lengths[i])}
                    if versus := opponent(info):  # a game: its result is stored too
                        episode["opponent"] = versus
                    ended.append(episode)
                    o = self._reset(i)
                for k, v in spaces.flatten(self.space, o).items():
                    self.obs[k][i] = v
            for k, v in self.obs.items():
                rec[k][:, t + 1] = v
        rec |= {k: np.stack([a[k] for a in acted], 1) for k in acted[0]}
        self._store(rec | memory, ended)

    def _reset(self, i: int) -> np.ndarray:
        """Start a new episode in environment ``i``: its first observation."""
        self.returns[i] = 0
        self.lengths[i] = 0
        o = checks.reset(self.envs[i])
        for k, v in checks.initial_memory(self.exp, 1).items():
            self.memory[k][i] = v[0]
        return o

    def _store(self, rec: dict, ended: list[dict]) -> None:
        """A round's B sessions (stacked in ``rec``) and the episodes that ended in it."""
        info = {f"info.{k}": np.float64(v) for k, v in checks.session_info(self.exp).items()}
        meta = {"version": np.int64(self.version or 0), "worker": self.tag, **info}
        sessions = [{k: v[i] for k, v in rec.items()} | meta for i in range(self.B)]
        self.db.add_sessions(sessions, self.settings.buffer_size)
        self.rounds += 1
        if ended:
            steps = self.db.env_steps(self.settings.session_length)
            when = {"time": time.time(), "steps": steps, "worker": self.worker.id}
            when["version"] = self.version
            self.db.add_metrics("episodes", [e | when for e in ended])
            games = [e for e in ended if "opponent" in e]
            results = [
                result(self.version, g["opponent"], g["return"], when["time"]) for g in games
            ]
            if results:
                self.db.add_metrics("games", results)
            self.recent.extend(e["return"] for e in ended)
