"""The play loop: keep B environments running, record sessions, pick up new params."""

import itertools
import logging
import time
import zlib

import numpy as np

from .database import Database
from .encoding import layout
from .errors import TinyverseError
from .experiment import Experiment
from .params import sync_params
from .workers import Pace, StopFlag, Worker

log = logging.getLogger(__name__)


def default_capacity(exp: Experiment, session_bytes: int, budget: float = 2**30) -> int:
    """Sessions the database keeps unless told (``--buffer-size``): the experiment's
    ``buffer_size``, else as many sessions as fit ``budget`` bytes (at most 10^6)."""
    return exp.buffer_size or int(min(10**6, max(1000, budget // max(session_bytes, 1))))


def play(
    exp: Experiment,
    db: Database,
    batch_size: int = 1,
    sessions: int | None = None,
    sync_every: int = 1,
    buffer_size: int | None = None,
    seed: int | None = None,
    report_every: float = 10.0,
) -> int:
    """Play ``batch_size`` environments, storing one session per environment per round.

    Runs ``sessions`` rounds (for ever if None), checks the params version
    every ``sync_every`` rounds, seeds random-init params when none are stored,
    and waits before a round while it is ahead of the trainers (:class:`~tinyverse.workers.Pace`);
    with ``sync_every`` 1 it keeps loading the newest params while it waits.
    ``buffer_size`` changes the capacity of the database. Returns the number of
    sessions stored.
    """
    if buffer_size is not None:
        db.set_capacity(buffer_size)
    pace = Pace(exp, db)
    rng = np.random.default_rng(seed)
    envs = [exp.make_env() for _ in range(batch_size)]
    obs = np.stack([env.reset(seed=int(rng.integers(2**31)))[0] for env in envs])
    memory = exp.initial_memory(batch_size)
    worker = Worker(db, "player")
    tag = np.int64(zlib.crc32(worker.id.encode()))
    version = sync_params(exp, db, None, reseed=True)
    ep_return, ep_length = np.zeros(batch_size), np.zeros(batch_size, dtype=np.int64)
    T, stored, steps, capacity = exp.session_length, 0, 0, None
    started = shown = time.monotonic()
    recent: list[float] = []  # returns of this player's last 20 episodes

    def follow():  # while waiting for the trainers, act with their newest params at once
        nonlocal version
        version = worker.info["version"] = sync_params(exp, db, version)

    with StopFlag() as flag:
        try:
            for rnd in range(sessions) if sessions is not None else itertools.count():
                if rnd % sync_every == 0 and rnd:
                    version = sync_params(exp, db, version, reseed=True)
                if not worker.wait(flag, pace.player_waits, follow if sync_every == 1 else None):
                    break
                rec, finished = _round(obs, memory, T), []
                for t in range(T):
                    actions, memory, *outputs = exp.act(obs, memory)
                    actions = np.asarray(actions)
                    _record(rec, t, {"actions": actions, **_outputs(outputs, batch_size)})
                    for i, env in enumerate(envs):
                        o, r, term, trunc, _ = env.step(actions[i])
                        ep_return[i] += r
                        ep_length[i] += 1
                        rec["rewards"][i, t], rec["terminated"][i, t], rec["truncated"][i, t] = r, term, trunc
                        if term or trunc:
                            rec["final_observations"][i, t] = o
                            finished.append({"return": float(ep_return[i]), "length": int(ep_length[i])})
                            ep_return[i], ep_length[i] = 0, 0
                            o, _ = env.reset()
                            for k, v in exp.initial_memory(1).items():
                                memory[k][i] = v[0]
                        obs[i] = o
                    rec["observations"][:, t + 1] = obs
                steps += T * batch_size
                info = {f"info.{k}": np.float64(v) for k, v in exp.session_info().items()}
                meta = {"version": np.int64(version or 0), "worker": tag, **info}
                batch = [{**{k: v[i] for k, v in rec.items()}, **meta} for i in range(batch_size)]
                if capacity is None:  # the first round: the capacity to store if none is, and the layout
                    capacity = default_capacity(exp, sum(a.nbytes for a in batch[0].values()))
                    mine = layout(batch[0])
                    if (stored_layout := db.claim("layout", mine)) != mine:
                        raise TinyverseError(
                            f"prefix {db.prefix} holds sessions of another layout ({_differ(stored_layout, mine)}): "
                            "use another --prefix, or delete them with python -m tinyverse EXP clear --del-sessions"
                        )
                db.add_sessions(batch, capacity)
                stored += batch_size
                if finished:
                    added = db.count_sessions()[1]
                    now = time.time()
                    for f in finished:
                        f.update(time=now, steps=added * T, worker=worker.id, version=version)
                    db.add_metrics("episodes", finished)
                    recent = (recent + [f["return"] for f in finished])[-20:]
                rate = steps / max(time.monotonic() - started, 1e-9)
                if time.monotonic() - shown >= report_every:
                    mean = f"{np.mean(recent):.1f}" if recent else "-"
                    log.info("%d env steps (%.0f/s), params v%s, mean return %s", steps, rate, version, mean)
                    shown = time.monotonic()
                if worker.beat(
                    steps=steps, sessions=stored, version=version, steps_per_s=round(rate, 1), pace=pace.spec
                ):
                    flag.stop = True
        finally:
            for env in envs:
                env.close()
            worker.leave()
    return stored


def _differ(stored: list, mine: list) -> str:
    """The first array whose name, dtype or shape differs between two layouts, in words."""
    theirs, ours = {a[0]: a[1:] for a in stored}, {a[0]: a[1:] for a in mine}
    for name in sorted(theirs.keys() | ours.keys()):
        if theirs.get(name) != ours.get(name):
            return f"{name}: stored {theirs.get(name) or 'none'}, this experiment records {ours.get(name) or 'none'}"
    return "same arrays in another order"


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


def _record(rec: dict, t: int, ticks: dict[str, np.ndarray]) -> None:
    """Store tick ``t`` of per-tick arrays (B, ...), allocating each (B, T, ...) at its first tick."""
    for name, v in ticks.items():
        if rec.get(name) is None:
            rec[name] = np.zeros((len(v), rec["rewards"].shape[1], *v.shape[1:]), v.dtype)
        rec[name][:, t] = v


def _round(obs: np.ndarray, memory: dict, T: int) -> dict[str, np.ndarray]:
    """Preallocated arrays of one round of B sessions; ``actions`` come with the first act."""
    B, shape = len(obs), obs.shape[1:]
    rec = {
        "observations": np.zeros((B, T + 1, *shape), obs.dtype),
        "final_observations": np.zeros((B, T, *shape), obs.dtype),
    }
    rec |= {"actions": None, "rewards": np.zeros((B, T), np.float32)}
    rec |= {"terminated": np.zeros((B, T), bool), "truncated": np.zeros((B, T), bool)}
    rec["observations"][:, 0] = obs
    return rec | {f"memory.{k}": np.array(v) for k, v in memory.items()}
