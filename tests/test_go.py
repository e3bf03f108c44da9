"""examples/go.py: self-play's seats and masks on real OpenSpiel games, the negamax n-step target and optimality
tightening's bounds on hand-made sessions, the league opponent drawing stored params from a real SQLite database, and
play, train and eval through the CLI."""

import sys

import numpy as np
import pytest
from conftest import ROOT, optional, run_cli, sets

import tinyverse

optional("pyspiel")
torch = optional("torch")
if str(ROOT / "examples") not in sys.path:  # as the loader makes them: examples/ importable
    sys.path.insert(0, str(ROOT / "examples"))
import alphazero  # noqa: E402
import games  # noqa: E402
import go  # noqa: E402

GO = ROOT / "examples" / "go.py"
BIAS = "q.advantage_out.bias"  # the advantage stream's last layer: what a test sets to make a net prefer moves


def batched(obs: dict) -> dict:
    return {k: np.asarray(v)[None] for k, v in obs.items()}


def preferring(exp, moves: dict[int, float]) -> dict:
    """``exp``'s params with each move's advantage raised by the given amount: the greedy policy prefers them."""
    params = exp.get_params()
    params[BIAS] = params[BIAS].copy()
    for move, amount in moves.items():
        params[BIAS][move] += amount
    return params


def test_self_play_alternates_seats_scores_the_last_mover_and_refuses_illegal_moves():
    exp = go.make_experiment(None, go.Args(game="tic_tac_toe", opponent="self", league_games=0.0))
    env = exp.make_env()
    obs, info = env.reset(seed=0)
    assert obs["seat"] == info["seat"] == 0 and "opponent" not in info  # no opponent: no result to rate
    with pytest.raises(games.IllegalMove):
        env.step(9)
    for move, seat in zip([4, 0, 8], [1, 0, 1], strict=True):  # X, O, X: each observation is the seat to move's
        obs, reward, terminated, _, info = env.step(move)
        assert (obs["seat"], info["seat"], reward, terminated, "opponent" in info) == (seat, seat, 0.0, False, False)
    with pytest.raises(games.IllegalMove, match="action 4 is illegal"):  # occupied: nothing is played
        env.step(4)
    assert env.unwrapped.state.history() == [4, 0, 8]
    for move in (1, 2, 6, 5):  # O, X, O, X: X completes the right column (2, 5, 8)
        obs, reward, terminated, _, info = env.step(move)
    assert terminated and reward == 1.0 and obs["seat"] == 0, "the reward and the last observation: the mover's"
    assert env.unwrapped.state.returns() == [1.0, -1.0]
    assert env.reset()[0]["seat"] == 0, "self-play starts every game with the seat to move"


@pytest.mark.parametrize("game", ["tic_tac_toe", "go"])
def test_the_agent_plays_only_legal_moves_in_self_play_greedy_or_exploring(game):
    exp = go.make_experiment(None, go.Args(game=game, opponent="self", league_games=0.0))
    env = exp.make_env()
    seen = 0
    for episode in range(3 if game == "tic_tac_toe" else 1):
        obs, _ = env.reset(seed=episode)
        terminated = False
        while not terminated:  # epsilon 1 before any update: uniform over the legal moves
            seat = obs["seat"]
            action = int(exp.act(batched(obs), {})[0][0])
            assert obs["action_mask"][action], "an illegal move drawn"
            obs, _, terminated, _, _ = env.step(action)
            assert terminated or obs["seat"] == 1 - seat
            seen += 1
    assert seen >= 15
    # greedy, a net that prefers the occupied points most: the best legal one is played
    stones = [4, 0] if game == "tic_tac_toe" else [40, 41]
    env.reset()
    for stone in stones:
        obs, *_ = env.step(stone)
    best = 8 if game == "tic_tac_toe" else 80
    exp.set_params(preferring(exp, {stones[0]: 1e3, stones[1]: 1e3, best: 500.0}))
    assert exp.act(batched(obs), {}, greedy=True)[0][0] == best


@pytest.mark.parametrize("game, actions", [("go", 5 * 5 + 1), ("hex", 5 * 5), ("connect_four", 7)])
def test_board_size_is_the_side_of_gos_and_hexs_board_and_other_games_ignore_it(game, actions):
    """One place (games.SIZED) says which games take it, for go.py and alphazero.py alike."""
    exp = go.make_experiment(None, go.Args(game=game, board_size=5))
    assert exp.make_env().action_space.n == actions
    assert alphazero.make_experiment(alphazero.Args(game=game, board_size=5)).game.num_distinct_actions() == actions


def session(seats, rewards, terminated) -> dict:
    """A batch of hand-made sessions as train_step gets them: only the seats observed (B, T+1)."""
    seats = np.array(seats)
    T = seats.shape[1] - 1
    observations = {"seat": seats}
    return {
        "observations": observations,
        "final_observations": {"seat": np.zeros_like(seats[:, :T])},
        "actions": np.zeros(seats[:, :T].shape, np.int64),
        "rewards": np.array(rewards, np.float32),
        "terminated": np.array(terminated, bool),
        "truncated": np.zeros(seats[:, :T].shape, bool),
    }


def test_the_negamax_target_signs_each_reward_and_the_bootstrap_from_the_first_movers_side():
    F, T = False, True
    batch = session(
        seats=[
            [0, 1, 0, 1, 0, 0],  # self-play: seat 0 wins with the move of tick 4; a new game at tick 5
            [1, 1, 1, 1, 0, 0],  # against a fixed opponent: the agent (seat 1) loses at tick 3, then plays seat 0
            [0, 1, 1, 0, 1, 0],  # seat 1 moves twice in a row (ticks 1, 2); the session ends in the game
        ],
        rewards=[[0, 0, 0, 0, 1], [0, 0, 0, -1, 0], [0, 0, 0, 0, 0]],
        terminated=[[F, F, F, F, T], [F, F, F, T, F], [F, F, F, F, F]],
    )
    t = go.negamax_transitions(batch, n=3, gamma=0.5)
    # row 0: ticks 0, 1 bootstrap at 3, 4, where the other seat moves: -0.5^3; tick 3 (seat 1) gets seat 0's win
    # one move later: -0.5; tick 2 (seat 0) gets it two moves later: +0.25
    assert t.returns[0].tolist() == [0, 0, 0.25, -0.5, 1]
    assert t.discounts[0].tolist() == [-0.125, -0.125, 0, 0, 0]
    # row 1: one seat throughout: one player's n-step returns; tick 4 (a new game) bootstraps at 5 at once
    assert t.returns[1].tolist() == [0, -0.25, -0.5, -1, 0]
    assert t.discounts[1].tolist() == [0.125, 0, 0, 0, 0.5]
    # row 2: +, where the seat at s_t+m is the first mover's: 0 at 3 for 0, 1 at 4 for 1, 0 at 5 for 0
    assert t.discounts[2].tolist() == [0.125, 0.125, -0.125, 0.25, -0.5]
    assert t.next_index.tolist() == [[3, 4, -1, -1, -1], [3, -1, -1, -1, 5], [3, 4, 5, 5, 5]]
    values = np.full((3, 5), 0.8, np.float32)  # max_a Q(s', a) of each bootstrap, from its own mover's side
    target = t.returns + t.discounts * values
    assert np.allclose(target, [[-0.1, -0.1, 0.25, -0.5, 1], [0.1, -0.25, -0.5, -1, 0.4], [0.1, 0.1, -0.1, 0.2, -0.4]])


def test_optimality_tightening_bounds_from_one_seat_the_alternating_seats_and_across_an_episode_end():
    F, T = False, True
    batch = session(
        seats=[[0, 0, 0, 0, 0], [0, 1, 0, 1, 0], [0, 0, 1, 1, 1]],
        rewards=[[0, 0, 0, 1], [0, 0, 0, 1], [0, 1, 0, 0]],
        terminated=[[F, F, F, T], [F, F, F, T], [F, T, F, F]],
    )
    values = np.array([[0.2, 0.4, 0.6, 0.8, 0.1]] * 3)  # max_a Q(s_t, a)
    taken = np.array([[0.1, 0.3, 0.5, 0.7]] * 3)  # Q(s_t, a_t)
    ended = batch["terminated"] | batch["truncated"]
    args = (batch["rewards"], batch["observations"]["seat"], ended, batch["terminated"], values, taken)
    lower, upper = go.tightening_bounds(*args, gamma=0.5, steps=2)
    inf = np.inf
    # row 0, one seat throughout (the paper's case): lower bounds from 2-step returns, r_t + g r_t+1 + g^2 V_t+2
    # (the game's end at 3: no V); upper bounds from earlier ticks, (Q_u - sum g^i r_u+i) / g^k, the least
    assert np.allclose(lower[0], [0.15, 0.2, 0.5, -inf])
    assert np.allclose(upper[0], [inf, 0.2, 0.4, 1.0])
    # row 1, self-play: the other seat's reply bounds from above (r_t - g r_t+1 + g^2 V_t+2, and
    # -(Q_t-1 - r_t-1) / g); two ticks back the seats mix: no bound, and no lower bound at all
    assert np.allclose(lower[1], [-inf] * 4)
    assert np.allclose(upper[1], [0.15, -0.2, -0.6, -1.0])
    # row 2, a game ends at tick 1: nothing reaches across it
    assert np.allclose(lower[2], [0.5, -inf, 0.025, -inf])
    assert np.allclose(upper[2], [inf, 0.2, inf, 1.0])


def test_a_training_step_with_tightening_fits_the_targets_of_real_self_play_sessions():
    torch.manual_seed(0)
    args = go.Args(game="tic_tac_toe", opponent="self", league_games=0.0, tightening=True, learning_rate=3e-3)
    exp = go.make_experiment(None, args)
    env = exp.make_env()
    obs, _ = env.reset(seed=0)
    seen, actions, rewards, terminated = [obs], [], [], []
    for _ in range(4 * 12):  # 4 sessions of 12 moves, played on one after another
        action = int(exp.act(batched(obs), {})[0][0])
        obs, reward, done, _, _ = env.step(action)
        actions.append(action)
        rewards.append(reward)
        terminated.append(done)
        obs = env.reset()[0] if done else obs
        seen.append(obs)
    rows = [slice(12 * b, 12 * b + 13) for b in range(4)]
    batch = {"observations": {k: np.stack([np.stack([o[k] for o in seen[r]]) for r in rows]) for k in obs}}
    batch["final_observations"] = {k: np.zeros_like(v[:, :12]) for k, v in batch["observations"].items()}
    for name, values in (("actions", actions), ("rewards", rewards), ("terminated", terminated)):
        batch[name] = np.array(values).reshape(4, 12)
    batch["rewards"] = batch["rewards"].astype(np.float32)
    batch["truncated"] = np.zeros((4, 12), bool)
    assert batch["terminated"].sum() >= 4
    exp.prepare_training()
    first = exp.train_step(batch)
    for _ in range(60):
        last = exp.train_step(batch)
    assert set(first) >= {"td_loss", "tightening", "loss", "q", "target"}
    assert last["loss"] < 0.5 * first["loss"], (first, last)
    exp.set_params(exp.get_params())  # the params round-trip by name and shape


@pytest.fixture
def league_db(tmp_path):
    db = tinyverse.connect(f"sqlite:///{tmp_path / 'league.db'}", "go", retry_for=5)
    yield db
    db.close()


def test_the_league_opponent_plays_stored_params_and_falls_back_to_the_latest_then_to_random(league_db):
    db = league_db
    exp = go.make_experiment(db, go.Args(game="tic_tac_toe", opponent="league"))
    env = exp.make_env()
    assert env.reset(seed=0)[1]["opponent"] == "random", "nothing stored: random play"
    db.save_params(preferring(exp, {4: 1e3}))  # the rolling params, version 1: they play the centre
    _, info = env.reset()  # the agent's seat alternates: now 1, the opponent moves first
    assert info["seat"] == 1 and info["opponent"] == "v1" and env.unwrapped.state.history() == [4]
    assert env.step(0)[4]["opponent"] == "v1", "every step's info names the opponent"
    db.save_snapshot("v5", preferring(exp, {8: 1e3}), 5)  # a kept version: the league draws among those
    for _ in range(4):
        obs, info = env.reset()
        if info["seat"] == 0:
            obs, _, _, _, info = env.step(0)
        assert info["opponent"] == "v5" and 8 in env.unwrapped.state.history()
    weighted = go.make_experiment(db, go.Args(game="tic_tac_toe", opponent="league", league_pick="weighted"))
    assert weighted.make_env().reset()[1]["opponent"] == "v5", "towards the versions the agent loses to: still v5"
    with pytest.raises(games.GameError, match="league_pick='best': choose uniform or weighted"):
        go.make_experiment(db, go.Args(league_pick="best"))
    fixed = go.make_experiment(db, go.Args(game="tic_tac_toe", opponent="v1")).make_env()
    fixed.reset()
    assert fixed.reset()[1]["opponent"] == "v1" and fixed.unwrapped.state.history() == [4]
    with pytest.raises(games.GameError, match="opponent 'v99': no such params"):
        go.make_experiment(db, go.Args(game="tic_tac_toe", opponent="v99")).make_env()
    db.save_snapshot("v6", {"w": np.zeros(2, np.float32)}, 6)  # not this network's: refused when drawn
    mismatch = go.make_experiment(db, go.Args(game="tic_tac_toe", opponent="v6")).make_env
    with pytest.raises(tinyverse.TinyverseError, match="do not fit this experiment"):
        mismatch()


def test_self_play_gives_a_share_of_its_games_to_the_league(league_db):
    exp = go.make_experiment(league_db, go.Args(game="tic_tac_toe", opponent="self", league_games=0.5))
    league_db.save_snapshot("v3", exp.get_params(), 3)
    env = exp.make_env()
    names = [env.reset(seed=s)[1].get("opponent", "self") for s in range(40)]
    assert set(names) == {"self", "v3"} and 10 <= names.count("v3") <= 30, names


def test_play_train_and_eval_through_the_cli_on_tic_tac_toe(tmp_path):
    url = f"sqlite:///{tmp_path / 'go.db'}"
    where = ["--db", url, "-q"]
    options = sets(game="tic_tac_toe", learning_starts=0, session_length=8, league_games=0)
    run_cli(GO, "play", "-n", "2", "-b", "3", *where, *options, cwd=tmp_path, timeout=90)
    run_cli(GO, "train", "-n", "3", "-b", "2", *where, cwd=tmp_path, timeout=90)
    out = run_cli(GO, "eval", "-n", "4", "--no-record", *where, "--opponent", "random", cwd=tmp_path).stdout
    assert "params v2" in out and "against random: " in out and "of 4: score" in out
    db = tinyverse.connect(url, "go", retry_for=5)
    try:
        batch = db.get_batch(list(range(1, 7)))
    finally:
        db.close()
    seats, ended = batch["observations.seat"], batch["terminated"]
    moved = seats[:, 1:] != seats[:, :-1]
    assert (moved | ended).all(), "self-play: every move within a game hands the board to the other seat"
    masks, actions = batch["observations.action_mask"][:, :-1], batch["actions"]
    assert np.take_along_axis(masks, actions[..., None], 2).all(), "every move was legal where it was played"
