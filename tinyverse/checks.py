"""Hooks' returns checked against the contract (:class:`~tinyverse.Experiment`): a problem is one
line naming the hook, what came back and what it wants; hot hooks in full at first, then briefly."""

import logging
import math
import os
import sysconfig
import traceback

import gymnasium as gym
import numpy as np

from . import spaces
from .errors import ExperimentError, TinyverseError
from .every import Every

log = logging.getLogger(__name__)
LIBRARIES = {sysconfig.get_path(k) for k in ("stdlib", "purelib", "platlib")}
OTHERS = (os.path.dirname(__file__) + os.sep, *LIBRARIES)  # files whose frames are not the user's
REWARDS = {float, int, np.float32, np.float64, np.int64}  # rewards that need no closer look
FLAGS = {bool, np.bool_}
STEP = "a Gymnasium env returns (observation, reward, terminated, truncated, info)"
say = Every(60.0)


def call(hook: str, fn, *args, **kwargs):
    """``fn(*args, **kwargs)``, a hook: what it raises becomes one line naming the hook, then the
    user's own frames (-vv logs them all)."""
    try:
        return fn(*args, **kwargs)
    except TinyverseError:
        raise  # one line already: tinyverse's own, from a call the hook made (db.sample_batch)
    except Exception as e:
        log.debug("%s raised", hook, exc_info=True)
        tb = traceback.extract_tb(e.__traceback__)
        shown = "".join(traceback.format_list([f for f in tb if not f.filename.startswith(OTHERS)]))
        line = f"{hook} raised {type(e).__name__}: {' '.join(str(e).split())}"
        raise ExperimentError(f"{line}\n{shown.rstrip()}" if shown else line) from None


def make_env(exp, render_mode: str | None = None) -> gym.Env:
    """``exp.make_env()`` (``render_mode``: eval's video), refused before its first step if it is
    no Gymnasium env or its observations are of a space that tinyverse cannot record."""
    env = call("make_env", exp.make_env, **({"render_mode": render_mode} if render_mode else {}))
    if not all(callable(getattr(env, name, None)) for name in ("reset", "step", "close")):
        raise ExperimentError(f"make_env returned {_kind(env)}: return a gymnasium.Env")
    if (problem := spaces.refused(getattr(env, "observation_space", None))) is None:
        return env
    env.close()
    raise ExperimentError(f"make_env's env observes {problem}")


def reset(env, **kwargs):
    """The first observation of ``env.reset(**kwargs)``."""
    if type(found := call("env.reset", env.reset, **kwargs)) is tuple and len(found) == 2:
        return found[0]
    raise ExperimentError(f"env.reset returned {_kind(found)}: a Gymnasium env returns (obs, info)")


def step(env, action) -> tuple:
    """``env.step(action)``: (observation, reward, terminated, truncated, info)."""
    found = call("env.step", env.step, action)
    if type(found) is tuple and len(found) == 5 and type(found[1]) in REWARDS:
        if type(found[2]) in FLAGS and type(found[3]) in FLAGS:  # the usual types: no closer look
            return found
    if type(found) is not tuple or len(found) != 5:
        raise ExperimentError(f"env.step returned {_kind(found)}: {STEP}")
    if _number(found[1]) is None:
        raise ExperimentError(f"env.step returned a reward of {_kind(found[1])}: {STEP}")
    for name, flag in (("terminated", found[2]), ("truncated", found[3])):
        if _number(flag) not in (0.0, 1.0):
            raise ExperimentError(f"env.step returned {name} {flag!r}: {STEP}, with bools")
    return found


class Act:
    """``exp.act`` on B observations, returning (actions, memory, named outputs): checked in full
    at first and whenever the actions' shape or dtype or the memory's names change."""

    def __init__(self, exp, batch_size: int, greedy: bool = False):
        self.exp = exp
        self.B = batch_size
        self.kwargs = {"greedy": True} if greedy else {}  # players call act(observations, memory)
        self.last = None  # the shape and dtype of the last actions

    def __call__(self, observations, memory) -> tuple[np.ndarray, dict, dict]:
        found = call("act", self.exp.act, observations, memory, **self.kwargs)
        if type(found) is not tuple or not 2 <= len(found) <= 3:
            fix = "return (actions, memory[, outputs])"
            raise ExperimentError(f"act returned {_kind(found)}: {fix}")
        actions = found[0]
        first = self.last is None
        if first or type(actions) is not np.ndarray or (actions.shape, actions.dtype) != self.last:
            actions = self._actions(actions)
        if first or type(found[1]) is not dict or found[1].keys() != memory.keys():
            batched("act", found[1], self.B, "memory", memory.keys())
        return actions, found[1], (outputs(found[2], self.B) if len(found) == 3 else {})

    def _actions(self, actions) -> np.ndarray:
        try:
            found = np.asarray(actions)
        except ValueError:  # a ragged list
            found = np.asarray(None)
        if found.ndim and found.dtype.kind in "biuf" and len(found) == self.B:
            self.last = (found.shape, found.dtype)
            return found
        what = f"shape {found.shape} dtype {found.dtype}" if found.ndim else _kind(actions)
        fix = f"return (actions, memory) with actions a NumPy array of {self.B} items"
        raise ExperimentError(f"act returned actions of {what}: {fix}")


def batched(hook: str, found, B: int, what: str = "memory", names=None) -> dict:
    """``found`` if it is a dict of arrays of ``B`` rows (named ``names`` if given)."""
    says = f"{what} {'are' if what == 'outputs' else 'is'}"
    if not isinstance(found, dict):
        raise ExperimentError(f"{hook} returned {what} of {_kind(found)}: {says} a dict of arrays")
    if names is not None and found.keys() != names:
        fix = f"keep the names initial_memory returned: {', '.join(names) or 'none'}"
        raise ExperimentError(f"{hook} returned {what} named {', '.join(found) or 'none'}; {fix}")
    shapes = {f"{what}.{k}": tuple(np.shape(v)) for k, v in found.items()}
    if bad := [f"{k} of shape {shape}" for k, shape in shapes.items() if shape[:1] != (B,)]:
        raise ExperimentError(f"{hook} returned {bad[0]}: {says} batched, ({B}, ...)")
    return found


def outputs(found, B: int) -> dict[str, np.ndarray]:
    """``act``'s third item, the per-tick outputs, named ``outputs.<name>``."""
    return {f"outputs.{k}": np.asarray(v) for k, v in batched("act", found, B, "outputs").items()}


def initial_memory(exp, B: int) -> dict:
    return batched("initial_memory", call("initial_memory", exp.initial_memory, B), B)


def session_info(exp) -> dict[str, float]:
    return _numbers("session_info", call("session_info", exp.session_info))


def train_step(exp, batch) -> dict[str, float]:
    """An update's metrics; one of NaN or inf is logged at once (the params may be diverging)."""
    found = call("train_step", exp.train_step, batch)
    metrics = {} if found is None else _numbers("train_step", found)
    if not all(map(math.isfinite, metrics.values())) and say():
        log.warning("train_step returned %s at update %d of the run", metrics, exp.run.updates + 1)
    return metrics


def get_params(exp) -> dict[str, np.ndarray]:
    """``exp.get_params()``: NumPy arrays of numbers by name, what the database stores."""
    if not isinstance(found := call("get_params", exp.get_params), dict):
        raise ExperimentError(f"get_params returned {_kind(found)}: return a dict of NumPy arrays")
    for name, value in found.items():
        if not isinstance(value, np.ndarray | np.generic) or value.dtype.kind not in "biufc":
            fix = "params are NumPy arrays of numbers (of a tensor: t.detach().cpu().numpy())"
            raise ExperimentError(f"get_params returned {name!r} of {_kind(value)}: {fix}")
    return found


def finite(params: dict[str, np.ndarray], where: str) -> None:
    """Refuse params that hold NaN or inf: stored, they would poison every worker."""
    if bad := [k for k, v in params.items() if v.dtype.kind in "fc" and not np.isfinite(v).all()]:
        raise ExperimentError(f"params {', '.join(bad[:3])} hold NaN or inf {where}")


def sample(exp, db, batch_size: int) -> dict | None:
    """``exp.sample(db, batch_size)``: sessions, their observations nested as their space
    (:func:`~tinyverse.spaces.nested`), or None for "not yet" (nothing, or no rows)."""
    found = call("sample", exp.sample, db, batch_size)
    if found is None or isinstance(found, dict | list | tuple) and not found:
        return None
    if not isinstance(found, dict) or "rewards" not in found:
        what = f"a dict of {', '.join(map(str, found))}" if type(found) is dict else _kind(found)
        raise ExperimentError(f"sample returned {what}: return sessions as db.sample_batch does")
    return spaces.nested(found) if len(found["rewards"]) else None


def _number(value) -> float | None:
    """``value`` as a float if it is one number (a Python or NumPy scalar, 0-d array or tensor)."""
    if isinstance(value, str | bytes):
        return None  # float() would parse them
    try:
        return float(value)
    except (TypeError, ValueError):
        return None


def _numbers(hook: str, found) -> dict[str, float]:
    """A hook's named numbers as floats."""
    if not isinstance(found, dict):
        raise ExperimentError(f"{hook} returned {_kind(found)}: return a dict of numbers")
    named = {k: _number(v) for k, v in found.items()}
    if bad := [f"{k!r} of {_kind(found[k])}" for k, v in named.items() if v is None]:
        raise ExperimentError(f"{hook} returned {bad[0]}: return numbers (of a tensor: t.item())")
    return named


def _kind(found) -> str:  # what came back, in a few words
    return f"{len(found)} items" if isinstance(found, tuple) else f"type {type(found).__name__}"
