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


# -- the hand-computed cases of the examples' former copies (dqn.nstep_targets, continuous.nstep_targets,
# cartpole_dqn.n_step and cartpole_numpy.n_step), now against the one helper they all use
def hand_made_sessions():
    """Two sessions of 6 ticks; the first has a termination at tick 1 and a truncation at tick 4."""
    B, T = 2, 6
    obs = np.arange(B * (T + 1), dtype=np.float32).reshape(B, T + 1, 1) * 10  # o[b, t] = 10 (7b + t)
    final = np.zeros((B, T, 1), np.float32)
    final[0, 1], final[0, 4] = -1.0, -4.0
    rewards = np.tile(np.arange(1, T + 1, dtype=np.float32), (B, 1))  # r_t = t + 1
    terminated, truncated = np.zeros((B, T), bool), np.zeros((B, T), bool)
    terminated[0, 1], truncated[0, 4] = True, True
    actions = np.zeros((B, T), np.int64)
    batch = dict(observations=obs, final_observations=final, rewards=rewards, actions=actions)
    return batch | dict(terminated=terminated, truncated=truncated)


def test_dqn_targets_stop_at_episode_ends_and_session_end():
    batch = hand_made_sessions()
    t = nstep_transitions(batch, n=3, gamma=0.5)
    returns, boot, disc, index = t.returns, t.next_observations, t.discounts, t.next_index
    # session 0: terminated at tick 1 (no bootstrap), truncated at tick 4 (bootstrap from its final obs)
    np.testing.assert_allclose(returns[0], [1 + 0.5 * 2, 2, 3 + 0.5 * 4 + 0.25 * 5, 4 + 0.5 * 5, 5, 6])
    np.testing.assert_allclose(disc[0], [0, 0, 0.125, 0.25, 0.5, 0.5])
    np.testing.assert_allclose(boot[0, 2:, 0], [-4, -4, -4, 60])  # final obs of the truncated episode; o6
    # session 1: no episode end; the last ticks use the steps left in the session
    np.testing.assert_allclose(returns[1], [1 + 1 + 0.75, 2 + 1.5 + 1, 3 + 2 + 1.25, 4 + 2.5 + 1.5, 5 + 3, 6])
    np.testing.assert_allclose(disc[1], [0.125, 0.125, 0.125, 0.125, 0.25, 0.5])
    np.testing.assert_allclose(boot[1, :, 0], [100, 110, 120, 130, 130, 130])
    # where each bootstrap observation sits in the session (dqn.py's double-Q pick reads the online net there)
    np.testing.assert_array_equal(index, [[-1, -1, -1, -1, -1, 6], [3, 4, 5, 6, 6, 6]])
    b, t = np.nonzero(index >= 0)
    np.testing.assert_array_equal(batch["observations"][b, index[b, t]], boot[b, t])


def test_dqn_one_step_targets_are_plain_td():
    batch = hand_made_sessions()
    obs, final, rewards = batch["observations"], batch["final_observations"], batch["rewards"]
    terminated, truncated = batch["terminated"], batch["truncated"]
    t = nstep_transitions(batch, n=1, gamma=0.9)
    returns, boot, disc, index = t.returns, t.next_observations, t.discounts, t.next_index
    np.testing.assert_allclose(returns, rewards)
    np.testing.assert_allclose(disc, np.where(terminated, 0.0, 0.9))
    ended = (terminated | truncated)[..., None]
    np.testing.assert_allclose(boot, np.where(ended, final, obs[:, 1:]))
    np.testing.assert_array_equal(index, np.where(ended[..., 0], -1, np.arange(1, 7)))


def test_continuous_targets_stop_at_episode_and_session_ends():
    # session 0: obs t is [t]; tick 1 terminates (final obs -1), tick 3 is truncated (final obs -3)
    # session 1: obs t is [10 + t], no episode end; rewards are t + 1 in both
    obs = np.array([np.arange(6), 10 + np.arange(6)], np.float32)[..., None]
    final = np.zeros((2, 5, 1), np.float32)
    final[0, 1], final[0, 3] = -1, -3
    terminated, truncated = np.zeros((2, 5), bool), np.zeros((2, 5), bool)
    terminated[0, 1], truncated[0, 3] = True, True
    rewards = np.tile(np.arange(1, 6, dtype=np.float32), (2, 1))
    batch = dict(observations=obs, final_observations=final, rewards=rewards, terminated=terminated)
    batch |= dict(truncated=truncated, actions=np.zeros((2, 5, 1), np.float32))

    t = nstep_transitions(batch, 1, 0.5)
    np.testing.assert_allclose(t.returns, rewards)
    np.testing.assert_allclose(t.discounts[0], [0.5, 0, 0.5, 0.5, 0.5])
    np.testing.assert_allclose(t.next_observations[0, :, 0], [1, -1, 3, -3, 5])  # the final obs where one ended
    np.testing.assert_allclose(t.next_observations[1, :, 0], [11, 12, 13, 14, 15])

    t = nstep_transitions(batch, 3, 0.5)
    np.testing.assert_allclose(t.returns[0], [1 + 0.5 * 2, 2, 3 + 0.5 * 4, 4, 5])
    np.testing.assert_allclose(t.discounts[0], [0, 0, 0.25, 0.5, 0.5])  # no bootstrap after the termination
    np.testing.assert_allclose(t.next_observations[0, 2:, 0], [-3, -3, 5])
    np.testing.assert_allclose(t.returns[1], [1 + 1 + 0.75, 2 + 1.5 + 1, 3 + 2 + 1.25, 4 + 2.5, 5])
    np.testing.assert_allclose(t.discounts[1], [0.125, 0.125, 0.125, 0.25, 0.5])  # the session's end cuts it
    np.testing.assert_allclose(t.next_observations[1, :, 0], [13, 14, 15, 15, 15])


def test_cartpole_returns_bootstrap_on_truncation_only():
    T = 6
    batch = {
        "observations": np.arange(T + 1, dtype=np.float32)[None, :, None],  # obs t is [t]
        "final_observations": np.array([[0, -1, 0, -3, 0, 0]], np.float32)[..., None],
        "actions": np.zeros((1, T), np.int64),
        "rewards": np.ones((1, T), np.float32),
        "terminated": np.array([[0, 1, 0, 0, 0, 0]], bool),  # the pole falls at tick 1
        "truncated": np.array([[0, 0, 0, 1, 0, 0]], bool),  # time runs out at tick 3
    }
    t = nstep_transitions(batch, 1, 0.5)
    assert t.returns.tolist() == [[1] * T]
    assert t.discounts.tolist() == [[0.5, 0, 0.5, 0.5, 0.5, 0.5]]
    assert t.next_observations[..., 0].tolist() == [[1, -1, 3, -3, 5, 6]]
    t = nstep_transitions(batch, 3, 0.5)
    assert t.returns.tolist() == [[1.5, 1, 1.5, 1, 1.5, 1]]  # cut at episode ends and at the session end
    assert t.discounts.tolist() == [[0, 0, 0.25, 0.5, 0.25, 0.5]]
    assert t.next_observations[..., 0].tolist() == [[-1, -1, -3, -3, 6, 6]]
