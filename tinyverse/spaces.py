"""Observations of nested spaces as the flat named arrays a session stores, and back: a Dict or
Tuple space (nested too) of Box, Discrete, MultiBinary and MultiDiscrete spaces is stored as
``observations.<key>`` arrays (nested keys joined with '.', Tuple items by index), and ``act`` and
``train_step`` get them nested as the space is: dicts by key, tuples by index. An array space is
one array named ``observations``, as it always was."""

import gymnasium as gym
import numpy as np

from .errors import ExperimentError

ARRAYS = (gym.spaces.Box, gym.spaces.Discrete, gym.spaces.MultiBinary, gym.spaces.MultiDiscrete)
NESTS = (gym.spaces.Dict, gym.spaces.Tuple)
NAMES = ("observations", "final_observations")  # what a batch holds nested


def unstorable(space, name: str = "observations") -> tuple[str, str] | None:
    """The first part of ``space`` that cannot be stored as arrays: (its name, what it is)."""
    if isinstance(space, ARRAYS):
        return None
    if not isinstance(space, NESTS):
        return name, f"a {type(space).__name__} space"
    if not space.spaces:
        return name, f"an empty {type(space).__name__} space"
    is_dict = isinstance(space, gym.spaces.Dict)
    for k in _keys(space):
        if is_dict and (type(k) is not str or "." in k or k.isdigit()):
            return name, f"a Dict space keyed {k!r} (keys are names without '.', not numbers)"
        if found := unstorable(space[k], f"{name}.{k}"):
            return found
    return None


def refused(space) -> str | None:
    """Why ``space`` cannot be recorded, and the wrapper that makes it an array space (None: it can
    be recorded)."""
    if (found := unstorable(space)) is None:
        return None
    name, what = found
    whose = "" if name == "observations" else f"a {type(space).__name__} space whose {name} is "
    fix = "encode it as arrays with a gymnasium.ObservationWrapper"
    try:
        if isinstance(gym.spaces.flatten_space(space), gym.spaces.Box):
            fix = "wrap the env in gymnasium.wrappers.FlattenObservation"
    except (NotImplementedError, TypeError, ValueError):
        pass  # no flat form: the ObservationWrapper
    said = "tinyverse records Box, Discrete, MultiBinary, MultiDiscrete, in Dicts and Tuples"
    return f"{whose}{what}: {said}; {fix}"


def flatten(space, obs, name: str = "observations") -> dict:
    """An observation of ``space`` as its named arrays (``{name: obs}`` for an array space)."""
    if not isinstance(space, NESTS):
        return {name: obs}
    flat = {}
    for k in _keys(space):
        try:
            item = obs[k]
        except (KeyError, IndexError, TypeError):
            fix = f"return observations of its observation_space, {space}"
            raise ExperimentError(f"the env observed {name} without {k!r}: {fix}") from None
        flat |= flatten(space[k], item, f"{name}.{k}")
    return flat


def nest(flat: dict, name: str = "observations"):
    """The arrays of ``flat`` named ``name`` or ``name.<key>...``, nested as their space: dicts by
    key, tuples by index (``flat[name]`` itself for an array space)."""
    if name in flat:
        return flat[name]
    keys = {}  # the next key of each name under ``name``, in order
    for k in flat:
        if k.startswith(name + "."):
            keys.setdefault(k[len(name) + 1 :].split(".")[0], None)
    nested = {k: nest(flat, f"{name}.{k}") for k in keys}
    return tuple(nested.values()) if nested and all(k.isdigit() for k in nested) else nested


def stack(space, observations: list) -> dict:
    """Observations of ``space`` stacked: (B, ...) arrays by name."""
    flat = [flatten(space, o) for o in observations]
    return {k: np.stack([f[k] for f in flat]) for k in flat[0]}


def nested(batch: dict) -> dict:
    """A batch as ``train_step`` gets it: the flat ``observations.<key>`` and
    ``final_observations.<key>`` nested as their space (array observations: ``batch`` itself)."""
    if "observations" in batch:
        return batch  # the hot path: an array space
    flat = [k for k in batch if k.startswith(("observations.", "final_observations."))]
    found = {n: nest(batch, n) for n in NAMES if any(k.startswith(f"{n}.") for k in flat)}
    return found | {k: v for k, v in batch.items() if k not in flat}


def map_arrays(fn, *nests):
    """``fn`` on the arrays of alike nests (dicts and tuples of arrays, or arrays), nested alike."""
    if isinstance(nests[0], dict):
        return {k: map_arrays(fn, *(n[k] for n in nests)) for k in nests[0]}
    if isinstance(nests[0], tuple):
        return tuple(map_arrays(fn, *items) for items in zip(*nests, strict=True))
    return fn(*nests)


def _keys(space) -> list:
    """A Dict's keys or a Tuple's indices, in order."""
    return list(space.keys()) if isinstance(space, gym.spaces.Dict) else list(range(len(space)))
