"""Exploration for value-based players: epsilon-greedy, schedules, Ape-X's spread (NumPy only).

    from tinyverse import explore
    eps = explore.linear(1.0, 0.05, self.run.updates / 3000)    # 1 -> 0.05 over 3000 updates
    actions = explore.epsilon_greedy(q_values, eps, self.rng)    # (B, A) -> (B,)
    actions = explore.epsilon_greedy(q_values, eps, self.rng, mask)  # legal actions only

Ape-X (https://arxiv.org/abs/1803.00933) gives each player of a fleet its own
epsilon, so that part of the data keeps failing while the rest plays well;
:func:`player_slot` says which player of how many this process is.
"""

import os
import random

import numpy as np

from .errors import ExperimentError


def linear(start: float, end: float, fraction: float) -> float:
    """``start`` at fraction 0, ``end`` from fraction 1 on, on a straight line between."""
    return start + (end - start) * min(1.0, max(0.0, fraction))


def exponential(start: float, end: float, fraction: float) -> float:
    """``start`` at fraction 0, ``end`` from fraction 1 on, by the same factor over each equal
    step between: start x (end / start) ** fraction (``start`` and ``end`` of one sign, not 0)."""
    return start * (end / start) ** min(1.0, max(0.0, fraction))


def epsilon_greedy(q_values, epsilon, rng: np.random.Generator, mask=None) -> np.ndarray:
    """Each row's best action, replaced with probability ``epsilon`` by one drawn at random.

    ``q_values`` (B, A); ``epsilon`` a number or one per row (0: greedy); ``mask`` (B, A),
    where given, marks the legal actions (non-zero): an illegal one is never the best, never
    drawn, and the draw is uniform over the legal ones.
    """
    q_values = np.asarray(q_values)
    rows, n_actions = q_values.shape
    if mask is None:
        best, drawn = q_values.argmax(1), rng.integers(n_actions, size=rows)
    else:
        legal = np.asarray(mask, bool)
        if not legal.any(1).all():
            row = int(np.flatnonzero(~legal.any(1))[0])
            raise ExperimentError(f"the action mask of row {row} allows no action: mark one legal")
        best = np.where(legal, q_values, -np.inf).argmax(1)
        drawn = np.where(legal, rng.random((rows, n_actions)), -1.0).argmax(1)
    return np.where(rng.random(rows) < epsilon, drawn, best)


def apex_spread(value: float, factor: float, index: int, count: int) -> float:
    """Player ``index`` of ``count``'s share of a geometric spread around ``value``.

    value x factor ** (1 - 2q), q = (index + 1/2) / count: from near value x factor for
    player 0 to near value / factor for the last; a lone player gets ``value``, which is
    also the geometric mean of a fleet's.
    """
    quantile = (index + 0.5) / count
    return value * factor ** (1 - 2 * quantile)


def apex_epsilon(epsilon: float, alpha: float, index: int, count: int) -> float:
    """Ape-X's final epsilon of player ``index`` of ``count``, centred on ``epsilon``.

    epsilon ** ((1 + alpha q) / (1 + alpha / 2)), q = (index + 1/2) / count: the
    :func:`apex_spread` of ``epsilon`` by the factor epsilon ** (-alpha / (2 + alpha)). A lone
    player plays ``epsilon``; two with alpha 7 play epsilon ** 0.61 and epsilon ** 1.39 (Ape-X's
    own 0.4 ** (1 + 7 i / (n - 1)) gives them 0.4 and 0.4 ** 8).
    """
    if epsilon == 0:  # no exploration stays none for every player (the factor would be infinite)
        return 0.0
    return apex_spread(epsilon, epsilon ** (-alpha / (2 + alpha)), index, count)


def player_slot(players: int = 1) -> tuple[int, int]:
    """(index, count): this player's place in its fleet.

    From ``TINYVERSE_WORKER_INDEX`` and ``TINYVERSE_WORKER_COUNT``, which ``run`` sets; a
    player started by hand draws its index at random among ``players``.
    """
    index = os.environ.get("TINYVERSE_WORKER_INDEX")
    count = os.environ.get("TINYVERSE_WORKER_COUNT")
    if index is None or count is None:
        return random.randrange(players), players
    return int(index), int(count)
