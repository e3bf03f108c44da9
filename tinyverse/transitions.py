"""n-step transitions from a batch of sessions, for value-based learners (NumPy only).

    t = nstep_transitions(batch, n=3, gamma=0.99)
    target = t.returns + t.discounts * max_a Q(t.next_observations, a)   # (B, T)
    loss = (Q(t.observations, t.actions) - target) ** 2

The return of tick t sums the rewards of ticks t .. t+m-1, where m <= n stops
early where the episode ends or the session does. A terminated episode is not
bootstrapped (discount 0); a truncated one is, from its final observation.
Observations of a Dict or Tuple space come back nested as the space, each array as above.
"""

from typing import NamedTuple

import numpy as np

from .spaces import map_arrays, nested


class Transitions(NamedTuple):
    observations: np.ndarray  # (B, T, ...) what the agent saw at each tick (nested as its space)
    actions: np.ndarray  # (B, T, ...)
    returns: np.ndarray  # (B, T) float32: sum of gamma^k r[t+k] over the m ticks
    next_observations: np.ndarray  # (B, T, ...) where to bootstrap from (nested alike)
    discounts: np.ndarray  # (B, T) float32: gamma^m, 0 after a termination
    next_index: np.ndarray  # (B, T) t+m: next_observations is observations[:, t+m]; -1: a final one


def nstep_transitions(batch: dict[str, np.ndarray], n: int = 1, gamma: float = 0.99) -> Transitions:
    """The n-step transition of every tick of a batch as ``train_step`` receives it."""
    if n < 1:
        raise ValueError(f"n must be at least 1, got {n}")
    batch = nested(batch)  # as db.sample_batch stores them: a no-op for train_step's batches
    obs = batch["observations"]
    final = batch["final_observations"]
    rewards = batch["rewards"]
    terminated = batch["terminated"].astype(bool)
    ended = terminated | batch["truncated"].astype(bool)
    B, T = rewards.shape
    t = np.arange(T)[:, None]  # (T, 1): the tick
    k = np.arange(n)  # (n,): the step
    window = np.minimum(t + k, T - 1)  # (T, n): the tick summed at step k (clipped to the session)
    m = (ended[:, window] | (k == n - 1) | (t + k >= T - 1)).argmax(-1)  # (B, T): the first stop
    powers = (gamma**k).astype(np.float32)
    summed = np.where(k <= m[..., None], rewards[:, window], 0) * powers
    returns = summed.sum(-1, dtype=np.float32)
    rows = np.arange(B)[:, None]
    last = t[:, 0] + m  # the last tick summed
    cut = ended[rows, last]
    discounts = np.where(terminated[rows, last], 0, gamma ** (m + 1)).astype(np.float32)
    following = map_arrays(lambda o, f: _where(cut, f[rows, last], o[rows, last + 1]), obs, final)
    index = np.where(cut, -1, last + 1)
    seen = map_arrays(lambda o: o[:, :T], obs)
    return Transitions(seen, batch["actions"], returns, following, discounts, index)


def _where(mask: np.ndarray, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """``a`` where ``mask`` (B, T), else ``b``: (B, T, ...) arrays."""
    return np.where(mask.reshape(mask.shape + (1,) * (a.ndim - 2)), a, b)
