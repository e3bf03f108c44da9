"""tinyverse.explore: schedules, epsilon-greedy with and without an action mask, Ape-X's spread, the slot."""

import math

import numpy as np
import pytest

import tinyverse
from tinyverse import explore


def test_the_module_is_exported_from_the_package():
    assert tinyverse.explore is explore and "explore" in tinyverse.__all__


# -- schedules ----------------------------------------------------------------------------------------------------
def test_linear_goes_from_start_to_end_and_stays_there():
    assert explore.linear(1.0, 0.1, 0.0) == 1.0
    assert explore.linear(1.0, 0.1, 0.5) == pytest.approx(0.55)
    assert explore.linear(1.0, 0.1, 1.0) == pytest.approx(0.1)
    assert explore.linear(1.0, 0.1, 7.0) == pytest.approx(0.1)  # past the end: the end
    assert explore.linear(1.0, 0.1, -1.0) == 1.0  # before the start: the start
    assert explore.linear(2e-3, 1e-4, 0.25) == pytest.approx(2e-3 - 0.25 * 1.9e-3)


def test_exponential_decays_by_one_factor_per_equal_step():
    assert explore.exponential(1.0, 0.01, 0.0) == 1.0
    assert explore.exponential(1.0, 0.01, 0.5) == pytest.approx(0.1)  # the geometric mean of the two
    assert explore.exponential(1.0, 0.01, 1.0) == pytest.approx(0.01)
    assert explore.exponential(1.0, 0.01, 3.0) == pytest.approx(0.01)
    values = [explore.exponential(0.5, 0.002, f) for f in np.linspace(0, 1, 11)]
    ratios = np.array(values[1:]) / np.array(values[:-1])
    np.testing.assert_allclose(ratios, ratios[0])  # the same factor each tenth of the way
    assert ratios[0] == pytest.approx((0.002 / 0.5) ** 0.1)


# -- epsilon-greedy -----------------------------------------------------------------------------------------------
def test_epsilon_zero_is_greedy_and_one_is_uniform():
    rng = np.random.default_rng(0)
    q = np.array([[0.0, 3.0, 1.0], [5.0, -1.0, 2.0]], np.float32)
    assert explore.epsilon_greedy(q, 0.0, rng).tolist() == [1, 0]
    drawn = explore.epsilon_greedy(np.tile(q[:1], (30_000, 1)), 1.0, rng)
    assert drawn.dtype.kind == "i" and set(drawn.tolist()) == {0, 1, 2}
    np.testing.assert_allclose(np.bincount(drawn) / len(drawn), [1 / 3] * 3, atol=0.015)


def test_each_action_is_random_with_probability_epsilon_one_per_row_if_given():
    rng = np.random.default_rng(1)
    q = np.tile(np.array([[0.0, 1.0, 0.0, 0.0]]), (40_000, 1))  # best: 1
    actions = explore.epsilon_greedy(q, 0.2, rng)
    # random with probability 0.2, and then the best one time in four: 1 - 0.2 x 3/4 are the best
    assert (actions == 1).mean() == pytest.approx(1 - 0.2 * 0.75, abs=0.01)
    per_row = np.where(np.arange(40_000) < 20_000, 0.0, 1.0)
    actions = explore.epsilon_greedy(q, per_row, rng)
    assert (actions[:20_000] == 1).all() and (actions[20_000:] == 1).mean() == pytest.approx(0.25, abs=0.015)


def test_a_mask_keeps_illegal_actions_out_of_the_best_and_the_draw():
    rng = np.random.default_rng(2)
    q = np.array([[9.0, 1.0, 2.0, 8.0], [0.0, 0.0, 5.0, 0.0]], np.float32)
    mask = np.array([[0, 1, 1, 0], [1, 1, 0, 1]], np.int8)  # as games.py's obs["action_mask"]: 1 legal
    assert explore.epsilon_greedy(q, 0.0, rng, mask).tolist() == [2, 0]  # the best of the legal ones
    many = np.repeat(mask, 20_000, axis=0)
    drawn = explore.epsilon_greedy(np.repeat(q, 20_000, axis=0), 1.0, rng, many).reshape(2, 20_000)
    assert set(drawn[0].tolist()) == {1, 2} and set(drawn[1].tolist()) == {0, 1, 3}  # never an illegal one
    np.testing.assert_allclose(np.bincount(drawn[0], minlength=4)[[1, 2]] / 20_000, [0.5, 0.5], atol=0.015)
    np.testing.assert_allclose(np.bincount(drawn[1], minlength=4)[[0, 1, 3]] / 20_000, [1 / 3] * 3, atol=0.015)
    bools = explore.epsilon_greedy(q, 0.0, rng, mask.astype(bool))
    assert bools.tolist() == [2, 0]


def test_a_row_without_a_legal_action_is_one_line_naming_it():
    q, mask = np.zeros((3, 2)), np.array([[1, 0], [0, 0], [0, 1]])
    with pytest.raises(tinyverse.TinyverseError, match="row 1 allows no action") as e:
        explore.epsilon_greedy(q, 0.5, np.random.default_rng(), mask)
    assert len(str(e.value).splitlines()) == 1


# -- Ape-X ----------------------------------------------------------------------------------------------------------
def test_apex_spread_is_geometric_around_the_value():
    assert explore.apex_spread(0.1, 2.0, 0, 1) == pytest.approx(0.1)  # a lone player
    two = [explore.apex_spread(0.2, 2.0, i, 2) for i in range(2)]
    assert two == pytest.approx([0.2 * 2**0.5, 0.2 / 2**0.5])
    four = [explore.apex_spread(0.1, 2.0, i, 4) for i in range(4)]
    assert four == pytest.approx([0.1 * 2.0 ** (1 - (2 * i + 1) / 4) for i in range(4)])
    assert four == sorted(four, reverse=True) and math.prod(four) ** 0.25 == pytest.approx(0.1)
    many = [explore.apex_spread(0.1, 2.0, i, 1000) for i in (0, 999)]
    assert many == pytest.approx([0.2, 0.05], rel=0.01)  # the ends tend to value x factor and value / factor


def test_apex_epsilon_is_ape_x_centred_on_the_final_epsilon():
    assert explore.apex_epsilon(0.02, 7.0, 0, 1) == pytest.approx(0.02)
    pair = [explore.apex_epsilon(0.02, 7.0, i, 2) for i in range(2)]
    assert pair == pytest.approx([0.02 ** (2.75 / 4.5), 0.02 ** (6.25 / 4.5)])  # 0.092 and 0.0044
    eight = [explore.apex_epsilon(0.04, 7.0, i, 8) for i in range(8)]
    assert eight == pytest.approx([0.04 ** ((1 + 7 * (i + 0.5) / 8) / 4.5) for i in range(8)])
    assert math.prod(eight) ** (1 / 8) == pytest.approx(0.04)
    assert [explore.apex_epsilon(0.0, 7.0, i, 2) for i in range(2)] == [0.0, 0.0]  # greedy players stay greedy


# -- the player's slot --------------------------------------------------------------------------------------------
def test_the_slot_comes_from_run_or_is_drawn(monkeypatch):
    monkeypatch.setenv("TINYVERSE_WORKER_INDEX", "2")
    monkeypatch.setenv("TINYVERSE_WORKER_COUNT", "5")
    assert explore.player_slot(8) == (2, 5)  # run's numbering wins over the guess
    monkeypatch.delenv("TINYVERSE_WORKER_INDEX")
    assert explore.player_slot() == (0, 1)  # started by hand: a lone player
    slots = {explore.player_slot(4) for _ in range(200)}
    assert {count for _, count in slots} == {4} and {index for index, _ in slots} == {0, 1, 2, 3}
