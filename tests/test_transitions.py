"""tinyverse.nstep_transitions against returns worked out by hand."""

import numpy as np
import pytest

from tinyverse import nstep_transitions


def session_batch(terminated, truncated, rewards, obs_shape=(1,)):
    """One session per row; observation of tick t is 10 t, the final observation of an episode ended at t is 100 + t."""
    rewards = np.asarray(rewards, np.float32)
    B, T = rewards.shape
    ticks = np.arange(T + 1, dtype=np.float32)
    obs = np.broadcast_to((10 * ticks).reshape(1, T + 1, *[1] * len(obs_shape)), (B, T + 1, *obs_shape)).copy()
    terminated, truncated = np.asarray(terminated, bool), np.asarray(truncated, bool)
    final = np.zeros((B, T, *obs_shape), np.float32)
    ended = (terminated | truncated).reshape(B, T, *[1] * len(obs_shape))
    final[:] = np.where(ended, 100 + ticks[:T].reshape(1, T, *[1] * len(obs_shape)), 0)
    actions = np.tile(np.arange(T), (B, 1))
    return dict(observations=obs, final_observations=final, rewards=rewards, actions=actions,
                terminated=terminated, truncated=truncated)  # fmt: skip


def test_both_kinds_of_episode_end_inside_a_session_and_its_end():
    # ticks:          0      1     2      3     4      5
    terminated = [[False, True, False, False, False, False]]
    truncated = [[False, False, False, True, False, False]]
    t = nstep_transitions(session_batch(terminated, truncated, [[1, 2, 3, 4, 5, 6]]), n=3, gamma=0.5)
    # t=0: 1 + .5*2, the pole fell at 1: no bootstrap. t=2: 3 + .5*4, time ran out at 3: bootstrap from its
    # final observation (103) with .5^2. t=4: 5 + .5*6, the session ends: bootstrap from observations[:, 6] = 60.
    np.testing.assert_allclose(t.returns, [[2, 2, 5, 4, 8, 6]])
    np.testing.assert_allclose(t.discounts, [[0, 0, 0.25, 0.5, 0.25, 0.5]])
    np.testing.assert_allclose(t.next_observations[..., 0], [[101, 101, 103, 103, 60, 60]])
    np.testing.assert_array_equal(t.next_index, [[-1, -1, -1, -1, 6, 6]])
    np.testing.assert_allclose(t.observations[..., 0], [[0, 10, 20, 30, 40, 50]])
    np.testing.assert_array_equal(t.actions, [[0, 1, 2, 3, 4, 5]])
    assert t.returns.dtype == t.discounts.dtype == np.float32


def test_a_full_window_then_the_sessions_end():
    none = [[False] * 6]
    t = nstep_transitions(session_batch(none, none, [[1] * 6]), n=3, gamma=0.5)
    np.testing.assert_allclose(t.returns, [[1.75, 1.75, 1.75, 1.75, 1.5, 1]])
    np.testing.assert_allclose(t.discounts, [[0.125] * 4 + [0.25, 0.5]])
    np.testing.assert_array_equal(t.next_index, [[3, 4, 5, 6, 6, 6]])
    np.testing.assert_allclose(t.next_observations[..., 0], [[30, 40, 50, 60, 60, 60]])


def test_an_episode_that_ends_on_the_sessions_last_tick():
    t = nstep_transitions(session_batch([[False, False, True]], [[False] * 3], [[1, 1, 1]]), n=5, gamma=0.5)
    np.testing.assert_allclose(t.returns, [[1.75, 1.5, 1]])
    np.testing.assert_allclose(t.discounts, [[0, 0, 0]])  # terminated: the next session's start is not its successor
    t = nstep_transitions(session_batch([[False] * 3], [[False, False, True]], [[1, 1, 1]]), n=5, gamma=0.5)
    np.testing.assert_allclose(t.discounts, [[0.125, 0.25, 0.5]])
    np.testing.assert_allclose(t.next_observations[..., 0], [[102, 102, 102]])


def test_one_step_is_the_textbook_transition_for_any_batch():
    rng = np.random.default_rng(0)
    terminated, truncated = rng.random((4, 9)) < 0.2, rng.random((4, 9)) < 0.2
    batch = session_batch(terminated, truncated & ~terminated, rng.normal(size=(4, 9)), obs_shape=(2, 3))
    t = nstep_transitions(batch, n=1, gamma=0.9)
    ended = batch["terminated"] | batch["truncated"]
    np.testing.assert_allclose(t.returns, batch["rewards"])
    np.testing.assert_allclose(t.discounts, 0.9 * ~batch["terminated"])
    successor = np.where(ended[..., None, None], batch["final_observations"], batch["observations"][:, 1:])
    np.testing.assert_array_equal(t.next_observations, successor)
    assert t.next_observations.shape == (4, 9, 2, 3)


def test_n_must_be_positive():
    with pytest.raises(ValueError, match="n must be at least 1"):
        nstep_transitions(session_batch([[False]], [[False]], [[1]]), n=0)
