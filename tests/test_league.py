"""Game results and ratings: a hand-computed Bradley-Terry table and Wilson interval, junk results skipped,
opponents drawn towards the snapshots the agent loses to, and, as a user runs them, players storing every game
with both sides, ``info`` rating them, ``eval --opponent`` playing a named opponent and scoring the match."""

import math
import random
from pathlib import Path

import numpy as np
import pytest
from conftest import run_cli
from matplotlib.image import imread

from tinyverse import league
from tinyverse.database import connect

GAME = str(Path(__file__).parent / "game_experiment.py")


def elo(found: list[league.Rating]) -> dict[str, float]:
    return {r.name: r.elo for r in found}


def test_ratings_match_a_hand_computed_bradley_terry_table():
    # A beats B 3 games of 4: the maximum-likelihood strengths are 3:1, 400 log10(3) = 190.8 Elo apart; the prior
    # (a virtual draw each against rating 0) pulls a side of 400 games less than 2 Elo
    played = [("A", "random", 1.0)] * 300 + [("A", "random", 0.0)] * 100
    found = elo(league.ratings(played))
    assert found["random"] == 0.0
    assert found["A"] == pytest.approx(400 * math.log10(3), abs=2.0)
    # a chain never played end to end: A 3:1 over B, B 3:1 over random, so A is 9:1 over random (381.7 Elo);
    # draws count half a win: 200 draws and 200 wins of 600 games are a 2:1 score (120.4 Elo)
    chain = [("A", "B", 1.0)] * 300 + [("A", "B", 0.0)] * 100 + [("B", "random", 1.0)] * 300
    chain += [("B", "random", 0.0)] * 100 + [("C", "random", 0.5)] * 200 + [("C", "random", 1.0)] * 200
    chain += [("C", "random", 0.0)] * 200
    found = elo(league.ratings(chain))
    assert found["A"] == pytest.approx(2 * 400 * math.log10(3), abs=4.0)
    assert found["B"] == pytest.approx(400 * math.log10(3), abs=4.0)
    assert found["C"] == pytest.approx(0.0, abs=2.0)  # 1:1 with the draws halved: even with random
    without_random = elo(league.ratings([("x", "y", 1.0)] * 30 + [("x", "z", 1.0)] * 10))
    assert without_random["x"] == 0.0  # no random played: the side with the most games is the anchor
    assert without_random["y"] < without_random["z"] < 0.0  # losing 30 of 30 is worse evidence than 10 of 10


def test_versions_of_few_games_each_are_pooled_in_order_into_groups_of_ten():
    played = [(f"v{n}", "random", float(n > 20)) for n in range(1, 31)]  # 30 versions, a game each
    played += [("v31", "mcts:100", 1.0)] * 12 + [("v32", "random", 1.0)] * 3  # one of 12 games, one of 3
    pooled = league.pooled(played)
    sides = [side for side, _, _ in pooled]
    assert sides == ["v1-v10"] * 10 + ["v11-v20"] * 10 + ["v21-v30"] * 10 + ["v31"] * 12 + ["v32"] * 3  # v32: short
    rated = {r.name: r.elo for r in league.ratings(pooled)}
    assert rated["v21-v30"] > rated["random"] > rated["v11-v20"]
    between = [("v1", "v3", 1.0), ("v2", "v30", 0.0)] + [(f"v{n}", "random", 0.5) for n in range(3, 31)]
    pooled = league.pooled(between)  # v1-v9 (10 games with v3's two), v10-v19, v20-v29, v30
    assert pooled[0] == ("v1-v9", "v30", 0.0) and len(pooled) == len(between) - 1  # a game within a group: left out
    assert league.pooled([("v1", "random", 1.0)]) == [("v1", "random", 1.0)]


def test_a_match_scores_with_wilsons_interval():
    # Wilson's 95% interval of 180 wins in 200 (z = 1.96): centre (0.9 + 1.9208/200) / (1 + 3.8416/200) = 0.89246,
    # half width 1.96 sqrt(0.09/200 + 3.8416/160000) / (1 + 3.8416/200) = 0.04187
    low, high = league.interval(0.9, 200)
    assert (low, high) == (pytest.approx(0.85059, abs=1e-4), pytest.approx(0.93433, abs=1e-4))
    assert league.interval(1.0, 10)[1] == 1.0 and league.interval(0.0, 10)[0] == 0.0
    line = league.match_line("mcts:200", [1.0] * 180 + [0.5] * 4 + [0.0] * 16)
    assert line.startswith("against mcts:200: 180 won, 4 drawn, 16 lost of 200: score 0.910 (95% interval 0.8")


@pytest.mark.parametrize(
    "record",
    [
        {"side": "v1", "opponent": "v1", "score": 1.0},  # itself
        {"side": "v1", "opponent": "random", "score": 0.7},  # no game's score
        {"side": "v1", "opponent": "x" * 65, "score": 1.0},  # too long a name
        {"side": "v1", "opponent": "a b", "score": 1.0},  # no name
        {"side": 3, "opponent": "random", "score": 1.0},
        {"opponent": "random", "score": 1.0},
        {"side": "v1", "opponent": "random", "score": "1"},
    ],
)
def test_junk_results_are_skipped(record):
    good = {"side": "v2", "opponent": "random", "score": 0.5}
    assert league.games([record, good]) == [("v2", "random", 0.5)]


def test_weighted_draws_come_towards_the_snapshots_the_agent_loses_to(db):
    for v in (1, 2, 3):
        db.save_snapshot(f"v{v}", {"w": np.full(2, v, np.float32)}, v)
    db.save_snapshot("passed", {"w": np.zeros(2, np.float32)}, 2)  # a named one: never an opponent
    games = [league.result(9, "v1", 1.0, 0.0) for _ in range(50)] + [league.result(9, "v2", -1.0, 0.0)] * 50
    db.add_metrics("games", games)  # v3 never played: in between
    rng = random.Random(0)
    weighted = [db.draw_params("weighted", rng)[0] for _ in range(300)]
    assert weighted.count(2) > weighted.count(3) > weighted.count(1)
    assert weighted.count(1) <= 3 and weighted.count(2) > 180
    uniform = [db.draw_params("uniform", rng)[0] for _ in range(300)]
    assert all(uniform.count(v) > 70 for v in (1, 2, 3))
    with pytest.raises(ValueError, match="'latest', 'uniform' or 'weighted'"):
        db.draw_params("hardest")


def test_players_store_every_game_and_info_and_eval_rate_them(db_url, prefix, tmp_path):
    where = ["--db", db_url, "--prefix", prefix]
    run_cli(GAME, "play", "-b", "2", "--rounds", "3", *where, "--set", "opponent=beaten")
    db = connect(db_url, prefix)
    stored = league.games(db.metrics("games"))
    assert stored == [("v1", "beaten", 1.0)] * 12  # 6 sessions of 4 ticks, 2 a game, with the player's own v1
    run_cli(GAME, "train", "--updates", "2", "-s", "1", "-b", "2", *where)
    latest = f"v{db.params_version()}"
    assert latest != "v1"
    eval_out = run_cli(GAME, "eval", "-n", "5", "--no-record", "--opponent", "unbeaten", *where, cwd=tmp_path).stdout
    assert "against unbeaten: 0 won, 0 drawn, 5 lost of 5: score 0.000 (95% interval 0.000-0.4" in eval_out
    assert league.games(db.metrics("games"))[12:] == [(latest, "unbeaten", 0.0)] * 5  # rated: the match is stored
    assert db.setting("options")["opponent"] == "beaten"  # --opponent is this eval's only, never stored
    plain = run_cli(GAME, "eval", "-n", "2", "--no-record", *where, cwd=tmp_path).stdout
    assert "against beaten: 2 won, 0 drawn, 0 lost of 2" in plain  # the stored opponent, scored
    assert len(db.metrics("games")) == 17  # but only a named match is stored
    info = run_cli(GAME, "info", *where).stdout
    assert "ratings   Elo of 4 sides over 17 games (0: the side with the most games)" in info
    order = [line.split()[0] for line in info.splitlines() if line.startswith(" " * 12)]
    assert sorted(order) == sorted(["beaten", "unbeaten", "v1", latest])
    assert order.index("v1") < order.index("beaten") and order.index("unbeaten") < order.index(latest)
    run_cli(GAME, "plot", "-o", tmp_path / "curve.png", *where)
    assert imread(tmp_path / "curve.png").shape[1] == 1600  # a fourth panel, the ratings: 20 inches at 80 dpi


def test_eval_opponent_needs_an_experiment_that_reads_one(tmp_path, db_url, prefix):
    fake = str(Path(__file__).parent / "fake_experiment.py")
    where = ["--db", db_url, "--prefix", prefix]
    run_cli(fake, "play", "-n", "2", *where)
    proc = run_cli(fake, "eval", "-n", "1", "--no-record", "--opponent", "random", *where, cwd=tmp_path, check=False)
    assert proc.returncode == 1
    assert proc.stderr.strip().splitlines()[-1].endswith("that make_env reads (examples/go.py)")
    bad = run_cli(GAME, "eval", "--opponent", "two words", *where, cwd=tmp_path, check=False)
    assert bad.returncode == 1 and "argument --opponent: want a name such as random" in bad.stderr


def test_a_game_without_a_named_opponent_stores_no_result(db_url, prefix, tmp_path):
    where = ["--db", db_url, "--prefix", prefix]
    run_cli(GAME, "play", "--rounds", "2", *where, "--set", "named=0")
    db = connect(db_url, prefix)
    assert db.metrics("games") == [] and len(db.metrics("episodes")) == 4
    assert "ratings" not in run_cli(GAME, "info", *where).stdout
    run_cli(GAME, "plot", "-o", tmp_path / "curve.png", *where)
    assert imread(tmp_path / "curve.png").shape[1] == 1200  # three panels
