"""The board games of examples/games.py: seats, rewards, masks, replays, illegal moves, and each opponent, GnuGo
over GTP against the real engine."""

import os
import sys
import warnings

import numpy as np
import pytest
from conftest import ROOT, _missing, optional, wait_for
from gymnasium.utils.env_checker import check_env

import tinyverse
from tinyverse import TinyverseError, player

pyspiel = optional("pyspiel")
if str(ROOT / "examples") not in sys.path:  # as the loader makes them: examples/ importable
    sys.path.insert(0, str(ROOT / "examples"))
import games  # noqa: E402
import opponents  # noqa: E402


def random_agent(seed: int):
    """A uniform policy over the legal moves an observation marks."""
    rng = np.random.default_rng(seed)
    return lambda obs: int(rng.choice(np.flatnonzero(obs["action_mask"])))


def script(*actions):
    """An opponent that plays ``actions`` in turn, and checks that it sees its own seat."""
    moves = iter(actions)

    def policy(obs):
        assert obs["seat"] == len(np.flatnonzero(obs["moves"] >= 0)) % 2  # the mover's view
        return next(moves)

    return policy


def play(env, agent, obs) -> tuple[list, dict]:
    """Play ``agent`` from ``obs`` to the end: the rewards, the last info."""
    rewards = []
    terminated = False
    while not terminated:
        obs, reward, terminated, truncated, info = env.step(agent(obs))
        rewards.append(reward)
        assert not truncated
    return rewards, info


def test_the_seat_alternates_by_episode_also_when_each_reset_reseeds():
    env = games.GameEnv("tic_tac_toe", seed=0)
    for episode, seat in enumerate([0, 1, 0, 1]):
        obs, info = env.reset(seed=episode)  # as tinyverse's eval resets: a seed an episode
        assert obs["seat"] == info["seat"] == seat
        assert (obs["moves"] >= 0).sum() == seat  # the opponent moved first where the agent has seat 1
        assert obs["board"][0].sum() == 9 - seat  # the empty points (tic-tac-toe's planes: empty, O, X)
    fixed = games.GameEnv("tic_tac_toe", seat=1, seed=0)
    assert [fixed.reset()[0]["seat"] for _ in range(3)] == [1, 1, 1]


@pytest.mark.parametrize(
    "seat, agent, opponent, rewards",
    [
        (0, [0, 1, 2], [3, 4], [0, 0, 1]),  # X completes the top row
        (1, [3, 4], [0, 1, 2], [0, -1]),  # the opponent's X does, after the agent's second move
        (0, [0, 8, 7, 2, 3], [4, 6, 1, 5], [0, 0, 0, 0, 0]),  # a full board, no line: a draw
    ],
)
def test_rewards_are_the_agents_at_the_end_of_the_game(seat, agent, opponent, rewards):
    env = games.GameEnv("tic_tac_toe", opponent=script(*opponent), seat=seat, seed=0)
    obs, _ = env.reset()
    got, info = play(env, script(*agent), obs)
    assert got == rewards and info == {"seat": seat, "resigned": False, "opponent": "policy"}
    assert env.state.is_terminal()


@pytest.mark.parametrize("game", games.BINARY)
def test_the_mask_board_and_moves_are_openspiels(game):
    """Every observation: the mask is OpenSpiel's legal moves, the uint8 board its tensor, the moves rebuild it."""
    env = games.GameEnv(game, seed=1)
    agent = random_agent(1)
    for _ in range(2):  # both seats
        obs, _ = env.reset()
        terminated = False
        while not terminated:
            assert env.observation_space.contains(obs)
            state = games.replay(env.game, obs["moves"])
            assert str(state) == str(env.state) and state.history() == env.state.history()
            tensor = np.asarray(state.observation_tensor(env.seat), np.float32).reshape(obs["board"].shape)
            assert np.array_equal(obs["board"], tensor)
            assert np.flatnonzero(obs["action_mask"]).tolist() == state.legal_actions(env.seat)
            obs, _, terminated, _, _ = env.step(agent(obs))
        assert not obs["action_mask"].any() and env.state.is_terminal()


def test_the_environment_passes_gymnasiums_checker():
    env = games.GameEnv("connect_four", seat=0, seed=0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the checker's advice; its errors still raise
        check_env(env, skip_render_check=True)


def test_an_illegal_move_never_reaches_openspiel():
    env = games.GameEnv("go", seat=0, seed=0)
    obs, _ = env.reset()
    obs, *_ = env.step(40)  # tengen
    history = env.state.history()
    assert not obs["action_mask"][40]
    stones = [action for action in history if action != 81]
    for action in (*stones, -1, 82, 10_000):  # occupied points, and no action at all
        with pytest.raises(games.IllegalMove, match=f"action {action} is illegal"):
            env.step(action)
        assert env.state.history() == history  # nothing was played
    env.step(81)  # a pass: the game goes on
    assert env.state.history()[: len(history) + 1] == [*history, 81]

    cheat = games.GameEnv("tic_tac_toe", opponent=script(4, 4), seat=0, seed=0)  # the opponent plays 4 twice
    cheat.reset()
    cheat.step(0)
    with pytest.raises(games.GameError, match="opponent chose the illegal action 4"):
        cheat.step(8)
    assert cheat.state.history() == [0, 4, 8]  # the opponent's second 4 was not played


def test_a_resigning_opponent_loses_and_a_finished_game_takes_no_step():
    env = games.GameEnv("go", opponent=lambda obs: None, seat=0, seed=0)
    env.reset()
    _, reward, terminated, _, info = env.step(40)
    assert (reward, terminated, info["resigned"]) == (1.0, True, True)
    with pytest.raises(games.GameError, match="call reset"):
        env.step(41)


def test_go_is_9x9_with_komi_and_room_for_long_games():
    env = games.GameEnv("go")
    assert env.game.get_parameters() == {"board_size": 9, "handicap": 0, "komi": 7.5, "max_game_length": 324}
    assert env.observation_space["moves"].shape == (324,) and env.action_space.n == 82
    assert games.load("go", board_size=13).max_game_length() == 4 * 13 * 13


@pytest.mark.parametrize(
    "game, params, says",
    [
        ("chekers", {}, "OpenSpiel has no game 'chekers'"),
        ("go", {"komi": "x"}, "Wrong type for parameter komi"),
        ("kuhn_poker", {}, "not a two-player turn-based game of perfect information"),
        ("go", {"opponent": "mcts"}, "opponent 'mcts': choose"),
        ("go", {"opponent": "mcts:0"}, "opponent 'mcts:0': choose"),
        ("go", {"opponent": "alphazero:1"}, "choose self, random, mcts:SIMULATIONS or gnugo:LEVEL"),
        ("go", {"opponent": "gnugo:11"}, "choose a level from 0 to 10"),
        ("tic_tac_toe", {"opponent": "gnugo:1"}, "GnuGo plays Go"),
        ("go", {"seat": 2}, "seat=2: choose 0"),
    ],
)
def test_bad_input_is_one_line_naming_the_fix(game, params, says):
    with pytest.raises(TinyverseError, match=says) as caught:
        games.GameEnv(game, **params)
    assert "\n" not in str(caught.value)


def test_the_spec_parser_builds_each_opponent_named_by_its_spec():
    game = games.load("connect_four")
    assert isinstance(games.parse_opponent("random", game), opponents.Random)
    mcts = games.parse_opponent("mcts:200", game)
    assert isinstance(mcts, opponents.MCTS) and mcts.simulations == 200
    assert isinstance(games.parse_opponent(lambda obs: 0, game), games.Policy)
    assert isinstance(games.parse_opponent("self", game), games.SelfPlay)
    assert games.parse_opponent(mcts, game) is mcts
    names = [games.parse_opponent(spec, game).name for spec in ("random", "mcts:200", "self", lambda obs: 0)]
    assert names == ["random", "mcts:200", "self", "policy"]
    for spec in ("random", "mcts:20"):  # every reset's and step's info names the opponent
        env = games.GameEnv("connect_four", opponent=spec, seat=0, seed=0)
        assert env.reset()[1]["opponent"] == env.step(3)[4]["opponent"] == spec


def test_a_mixture_draws_an_opponent_a_game_and_self_play_leaves_both_seats_to_the_agent():
    drawn = games.Drawn(lambda: ("v7", lambda obs: int(np.flatnonzero(obs["action_mask"])[-1])), games.load("go"))
    env = games.GameEnv("go", opponent=games.Mixture([games.SelfPlay(), drawn], [1, 3]), seed=0)
    seen = []
    for _ in range(40):
        obs, info = env.reset()
        seen.append(info.get("opponent", "self"))  # self-play names no opponent: no result is rated
        obs, _, _, _, info = env.step(40)
        if "opponent" not in info:  # self-play: the agent moves again, as White
            assert obs["seat"] == info["seat"] == 1 and env.state.history() == [40]
        else:  # the drawn policy played its last legal move (a pass) after the agent's, or before it
            assert 81 in env.state.history() and obs["seat"] == info["seat"] == env.seat
    assert 5 <= seen.count("self") <= 15 and seen.count("v7") == 40 - seen.count("self"), seen
    nothing = games.GameEnv("tic_tac_toe", opponent=games.Drawn(lambda: None, games.load("tic_tac_toe")), seat=1)
    assert nothing.reset(seed=0)[1]["opponent"] == "random" and len(nothing.state.history()) == 1


def test_mcts_with_200_simulations_beats_random_play():
    env = games.GameEnv("connect_four", opponent="mcts:200", seed=0)
    agent = random_agent(0)
    results = [play(env, agent, env.reset()[0])[0][-1] for _ in range(6)]  # 3 games on each seat
    assert results.count(-1.0) >= 5, results


@pytest.mark.parametrize("size", [9, 19])
def test_gtp_vertices_translate_both_ways_as_openspiel_names_them(size):
    state = pyspiel.load_game("go", {"board_size": size}).new_initial_state()
    for action in range(size * size + 1):
        name = opponents.vertex(action, size)
        assert state.action_to_string(0, action).split()[1].lower() == name.lower()  # "B a1" ... "B PASS"
        assert opponents.action(name, size) == opponents.action(name.lower(), size) == action
    assert opponents.vertex(8, size) == "J1" and "I" not in "".join(opponents.vertex(a, size) for a in range(size))


def gnugo_stones(engine, colour: str) -> set[int]:
    """The points GnuGo has ``colour``'s stones on, as OpenSpiel actions."""
    return {opponents.action(v, 9) for v in engine.command(f"list_stones {colour}").split()}


def openspiel_stones(env) -> tuple[set[int], set[int]]:
    """Black's and White's points in OpenSpiel's Go board (planes 0 and 1)."""
    planes = np.asarray(env.state.observation_tensor(0)).reshape(4, 81)
    return set(np.flatnonzero(planes[0]).tolist()), set(np.flatnonzero(planes[1]).tolist())


@pytest.fixture
def gnugo_binary():
    if not os.access(opponents.GNUGO, os.X_OK):
        _missing(f"no GnuGo at {opponents.GNUGO}: apt-get install gnugo")
    return opponents.GNUGO


@pytest.mark.parametrize("seat", [0, 1])
def test_a_few_moves_against_the_real_gnugo_keep_both_boards_equal(gnugo_binary, seat):
    env = games.GameEnv("go", opponent="gnugo:1", seat=seat, seed=0)
    try:
        obs, _ = env.reset()
        agent = random_agent(seat)
        for move in range(6):
            action = 81 if move == 2 else agent(obs)  # a pass too: GnuGo plays on
            obs, _, terminated, _, _ = env.step(action)
            assert not terminated
            black, white = openspiel_stones(env)
            assert (gnugo_stones(env.opponent, "black"), gnugo_stones(env.opponent, "white")) == (black, white)
        assert len(black | white) >= 8  # GnuGo's moves landed where it played them, the agent's where it meant
    finally:
        process = env.opponent.process
        env.close()
    wait_for(lambda: process.poll() is not None, 10, "GnuGo to exit when the env closes")


def test_gnugo_resigns_a_lost_game(gnugo_binary):
    game = games.load("go")
    state = game.new_initial_state()
    for point in ["C3", "D3", "E3", "F3", "G3", "C7", "D7", "E7", "F7", "G7", "C4", "C5", "C6", "G4", "G5", "G6"]:
        state.apply_action(opponents.action(point, 9))  # Black builds a wall around the centre ...
        state.apply_action(81)  # ... while White passes
    state.apply_action(opponents.action("E5", 9))
    engine = opponents.GnuGo(game, level=1)
    try:
        engine.reset(1, 0)
        assert engine.move(state) is None  # resign
    finally:
        engine.close()


@pytest.mark.parametrize(
    "body, says", [("exec sleep 30", "did not answer 'clear_board' within 0.5 s"), ("exit 3", "exited \\(code 3\\)")]
)
def test_a_stuck_or_dead_engine_is_one_clear_error(tmp_path, body, says):
    engine_file = tmp_path / "engine"
    engine_file.write_text(f"#!/bin/sh\n{body}\n")
    engine_file.chmod(0o755)
    engine = opponents.GnuGo(games.load("go"), binary=str(engine_file), timeout=0.5)
    with pytest.raises(opponents.EngineError, match=says):
        engine.reset(0, 0)
    engine.close()
    assert engine.process.poll() is not None  # killed, not left behind


class RandomLegal(tinyverse.Experiment):
    """Tic-tac-toe against a random opponent, a uniformly random legal move a turn (the mask honoured)."""

    session_length = 6

    def __init__(self, db=None):
        super().__init__(db)
        self.rng = np.random.default_rng(0)
        self.seen = []  # the observations act got

    def make_env(self, render_mode=None):
        return games.GameEnv("tic_tac_toe", seed=int(self.rng.integers(2**31)))

    def act(self, observations, memory, greedy=False):
        self.seen.append({k: v.copy() for k, v in observations.items()})
        scores = self.rng.random(observations["action_mask"].shape) * observations["action_mask"]
        return scores.argmax(1), memory

    def train_step(self, batch):
        return {}

    def get_params(self):
        return {"w": np.zeros(1, np.float32)}

    def set_params(self, params):
        pass


def test_tic_tac_toe_plays_under_the_player_with_its_dict_observations(db):
    B, rounds = 3, 4
    exp = RandomLegal(db)
    assert player.play(exp, db, batch_size=B, rounds=rounds, seed=0) == B * rounds  # an illegal move would raise
    space = exp.make_env().observation_space
    assert [sorted(s) for s in exp.seen] == [sorted(space.keys())] * (rounds * exp.session_length)
    assert exp.seen[0]["board"].shape == (B, *space["board"].shape) and exp.seen[0]["board"].dtype == np.uint8
    assert exp.seen[0]["seat"].shape == (B,)
    batch = db.get_batch(list(range(db.session_range()[0], db.session_range()[1] + 1)))
    masks, actions = batch["observations.action_mask"], batch["actions"]
    assert np.take_along_axis(masks[:, :-1], actions[..., None], 2).all(), "every move was legal where it was played"
    assert batch["terminated"].sum() >= 3 and set(np.unique(batch["rewards"])) <= {-1.0, 0.0, 1.0}
    ended = batch["terminated"]
    assert batch["final_observations.moves"][ended].max(1).min() >= 0  # a finished game's moves
    assert not batch["final_observations.board"][~ended].any()
