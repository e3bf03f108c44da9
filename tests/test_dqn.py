"""examples/dqn.py: the sum tree, double-Q targets, prioritized replay on a real database, smoke runs; and
examples/cartpole_dqn.py copied out of the repository on its own."""

import ast
import dataclasses
import importlib.util
import itertools
import json
import shutil
import sys

import numpy as np
import pytest
from conftest import ROOT, optional, run_cli

from tinyverse import explore, nstep_transitions
from tinyverse.database import connect
from tinyverse.player import play
from tinyverse.trainer import train
from tinyverse.workers import Worker

optional("torch")  # the example imports it: skip on a developer machine, fail in CI
DQN_FILE = ROOT / "examples" / "dqn.py"
sys.path.insert(0, str(ROOT / "examples"))  # as the loader does: dqn.py imports its neighbour common.py
_spec = importlib.util.spec_from_file_location("dqn_example", DQN_FILE)
dqn = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(dqn)
torch = dqn.torch


# -- sum tree -------------------------------------------------------------------
def test_sum_tree_draws_in_proportion_to_priority():
    tree = dqn.SumTree(5)  # 8 leaves: 3 stay empty
    tree.set(np.arange(5), np.array([1.0, 2.0, 0.0, 3.0, 4.0]))
    assert tree.total == 10.0
    leaves = tree.find(np.random.default_rng(0).random(100_000) * tree.total)
    counts = np.bincount(leaves, minlength=tree.size)
    assert counts[2] == 0 and counts[5:].sum() == 0  # zero priority: never drawn
    np.testing.assert_allclose(counts[:5] / len(leaves), [0.1, 0.2, 0.0, 0.3, 0.4], atol=0.01)


def test_sum_tree_updates_keep_every_node_the_sum_of_its_children():
    rng = np.random.default_rng(1)
    tree = dqn.SumTree(1000)
    for _ in range(20):
        leaves = rng.integers(0, 1000, size=rng.integers(1, 50))  # repeats included
        tree.set(leaves, rng.random(len(leaves)) * 10)
    inner = np.arange(1, tree.size)
    np.testing.assert_allclose(tree.tree[inner], tree.tree[2 * inner] + tree.tree[2 * inner + 1])
    np.testing.assert_allclose(tree.total, tree.get(np.arange(1000)).sum())
    # the edges of the cumulative ranges land on the right leaves
    tree = dqn.SumTree(4)
    tree.set(np.arange(4), np.array([1.0, 1.0, 1.0, 1.0]))
    assert list(tree.find(np.array([0.0, 0.999, 1.0, 2.5, 3.999, 4.0]))) == [0, 0, 1, 2, 3, 3]


class CountingArray(np.ndarray):
    """An array that counts the elements read or written through indexing."""

    touched = 0

    def __getitem__(self, index):
        CountingArray.touched += np.size(index)
        return np.asarray(super().__getitem__(index))

    def __setitem__(self, index, value):
        CountingArray.touched += np.size(index)
        super().__setitem__(index, value)


def touched_per_operation(capacity: int) -> tuple[int, int]:
    tree = dqn.SumTree(capacity)
    tree.tree = tree.tree.view(CountingArray)
    tree.set(np.arange(capacity), np.ones(capacity))
    rng = np.random.default_rng(0)
    CountingArray.touched = 0
    tree.set(rng.integers(0, capacity, 32), np.full(32, 2.0))
    updated = CountingArray.touched
    CountingArray.touched = 0
    tree.find(rng.random(32) * tree.total)
    return updated, CountingArray.touched


def test_sum_tree_update_and_draw_touch_log_n_nodes():
    # 32 leaves set or drawn: a few node reads or writes per leaf on each of the log2 N levels,
    # whatever N (a scan would touch N nodes: 2^20 here)
    for levels in (10, 20):
        updated, drawn = touched_per_operation(2**levels)
        assert updated <= 32 * (1 + 3 * levels) and drawn <= 32 * (1 + 2 * levels), (levels, updated, drawn)


@pytest.mark.parametrize("shared_hidden", [False, True])
def test_dueling_streams_have_their_own_second_hidden_layer_unless_shared(shared_hidden):
    h, n_obs, n_act = 16, 4, 3
    q = dqn.QNet(n_obs, n_act, h, dueling=True, shared_hidden=shared_hidden)
    hidden_layers = (h * h + h) * (1 if shared_hidden else 2)  # in the trunk, or one in each stream
    assert sum(p.numel() for p in q.parameters()) == (n_obs * h + h) + hidden_layers + (h + 1) + (h * n_act + n_act)
    x = torch.randn(5, n_obs)
    with torch.no_grad():
        z = q.trunk(x)
        v, a = q.value(z), q.advantage(z)
        torch.testing.assert_close(q(x), v + a - a.mean(1, keepdim=True))


@pytest.mark.parametrize("shared_hidden", [False, True])
def test_double_q_target_from_one_online_forward_equals_two_forwards(monkeypatch, shared_hidden):
    # the pick of the online net at s_{t+m} read from its forward over the session, as one
    # forward of the bootstrap observations would give it, truncations included
    exp = dqn.DQN(dqn.Args(hidden=16, n_step=3, double=True, dueling=True, shared_hidden=shared_hidden))
    exp.prepare_training()
    rng = np.random.default_rng(0)
    B, T = 32, 8
    obs, final = rng.normal(size=(B, T + 1, 4)).astype(np.float32), rng.normal(size=(B, T, 4)).astype(np.float32)
    ended = rng.random((B, T)) < 0.2
    terminated = ended & (rng.random((B, T)) < 0.5)
    truncated = ended & ~terminated
    rewards, actions = rng.normal(size=(B, T)).astype(np.float32), rng.integers(0, 2, (B, T))
    batch = {"observations": obs, "final_observations": final, "rewards": rewards, "actions": actions}
    batch |= {"terminated": terminated, "truncated": truncated}
    targets = []
    monkeypatch.setattr(dqn.F, "smooth_l1_loss", lambda q, target, **kw: targets.append(target) or (q - target) ** 2)
    before = {k: v.clone() for k, v in exp.q.state_dict().items()}
    exp.train_step(batch)
    exp.q.load_state_dict(before)
    t = nstep_transitions(batch, 3, exp.args.gamma)
    with torch.no_grad():
        boot = torch.as_tensor(t.next_observations).flatten(0, 1)
        best = exp.q(boot).argmax(1, keepdim=True)
        value = exp.target(boot).gather(1, best).squeeze(1)
    expected = torch.as_tensor(t.returns).flatten() + torch.as_tensor(t.discounts).flatten() * value
    torch.testing.assert_close(targets[0], expected)


# -- prioritized replay against a real database ----------------------------------
def fake_session(i: int, T: int = 4) -> dict:
    return {
        "observations": np.full((T + 1, 4), i, np.float32),
        "final_observations": np.zeros((T, 4), np.float32),
        "actions": np.zeros(T, np.int64),
        "rewards": np.ones(T, np.float32),
        "terminated": np.zeros(T, bool),
        "truncated": np.zeros(T, bool),
        "version": np.int64(0),
        "worker": np.int64(0),
    }


def test_prioritized_replay_cycle(db):
    exp = dqn.DQN(dqn.Args(session_length=4, hidden=16, per_alpha=1.0, per_beta=1.0))
    db.add_sessions([fake_session(i) for i in range(1, 21)], capacity=10)  # ids 11..20 stay
    batch = exp.sample(db, 8)
    assert len(batch["id"]) == 8 and set(batch["id"].tolist()) <= set(range(11, 21))
    assert (batch["is_weight"] == 1.0).all()  # all new: max priority, uniform
    assert (batch["observations"][:, 0, 0] == batch["id"]).all()  # each id is its own session

    exp.per.update(np.array([13]), np.array([100.0]))  # 100x the others' priority (alpha 1)
    ids = [i for _ in range(50) for i in exp.sample(db, 8)["id"].tolist()]
    assert ids.count(13) / len(ids) > 0.85  # 100 / 109
    batch = exp.sample(db, 64)
    weights = dict(zip(batch["id"].tolist(), batch["is_weight"].tolist(), strict=True))
    assert weights.get(13, 0) < min(weights[i] for i in weights if i != 13)  # IS weights undo the bias

    db.add_sessions([fake_session(i) for i in range(21, 26)], capacity=10)  # evicts 11..15, 13 included
    ids = [i for _ in range(50) for i in exp.sample(db, 8)["id"].tolist()]
    assert set(ids) <= set(range(16, 26))
    assert set(range(21, 26)) <= set(ids)  # new ids enter at the max priority: drawn a lot
    assert min(ids.count(i) for i in range(21, 26)) > max(ids.count(i) for i in range(16, 21))

    # train_step sets the batch's priorities from its TD errors
    exp.prepare_training()
    before = exp.per.tree.get(np.arange(16, 26) % exp.per.tree.capacity).copy()
    batch = exp.sample(db, 4)
    exp.train_step(batch)
    after = exp.per.tree.get(np.arange(16, 26) % exp.per.tree.capacity)
    changed = {i for i, b, a in zip(range(16, 26), before, after, strict=True) if b != a}
    assert changed and changed <= {int(i) for i in batch["id"]}

    # ids evicted between reading the range and fetching are redrawn, never returned
    exp.per.sync(*db.session_range())
    db.add_sessions([fake_session(i) for i in range(26, 34)], capacity=10)  # evicts 16..23
    exp.per.sync = lambda lo, hi: None  # the trainer's view is stale: it still holds 16..25
    batch = exp.sample(db, 8)
    assert len(batch["id"]) == 8 and (batch["id"] >= 24).all()


def test_replay_follows_a_cleared_and_growing_ring():
    per = dqn.PrioritizedReplay(4, alpha=1.0)
    per.sync(1, 4)
    per.update(np.array([2]), np.array([5.0]))
    per.sync(1, 10)  # the capacity grew beyond the tree: it grows, priorities kept
    assert per.tree.capacity >= 10 and per.tree.get(np.array([2 % per.tree.capacity]))[0] == 5.0
    assert set(per.draw(1000)[0]) == set(range(1, 11))
    per.sync(11, 10)  # cleared (Redis keeps counting: lo = seq + 1)
    assert per.tree.total == 0 and len(per.draw(4)[0]) == 0
    per.sync(11, 12)
    assert set(per.draw(100)[0]) == {11, 12}


# -- exploration ------------------------------------------------------------------
def test_apex_epsilons_and_presets(monkeypatch):
    args = dqn.Args()
    eps = [explore.apex_epsilon(args.eps_end, args.apex_alpha, i, 4) for i in range(4)]
    np.testing.assert_allclose(eps, [0.04 ** ((1 + 7 * (i + 0.5) / 4) / 4.5) for i in range(4)])
    assert eps == sorted(eps, reverse=True) and np.exp(np.log(eps).mean()) == pytest.approx(0.04)
    assert args.eps_end == 0.04 and explore.apex_epsilon(args.eps_end, args.apex_alpha, 0, 1) == pytest.approx(0.04)
    two = [explore.apex_epsilon(args.eps_end, args.apex_alpha, i, 2) for i in range(2)]
    assert 0.1 < two[0] < 0.2 and 0.005 < two[1] < 0.02  # not 0.4 for one of two: half the data random
    acrobot = dqn.Args(env_id="Acrobot-v1", per=False, n_step=5, learning_rate=1e-3)
    assert (acrobot.per, acrobot.n_step, acrobot.learning_rate) == (False, 5, 1e-3)  # given: kept
    assert (acrobot.updates_per_step, acrobot.train_batch_size, acrobot.learning_starts) == (1.0, 8, 0)  # the preset
    assert dqn.Args(env_id="MountainCar-v0").updates_per_step == 0.5  # no preset: CartPole's
    exp = dqn.DQN(acrobot)
    pace = exp.run.settings
    assert (pace.updates_per_step, pace.learning_starts, pace.pace_slack) == (1.0, 0, 1000)  # the pace, declared
    monkeypatch.setenv("TINYVERSE_WORKER_INDEX", "2")
    monkeypatch.setenv("TINYVERSE_WORKER_COUNT", "3")
    exp = dqn.DQN(dqn.Args(hidden=8, eps_start=0.5))
    last = 0.04 ** ((1 + 7 * 2.5 / 3) / 4.5)
    assert exp.final_epsilon == pytest.approx(last)
    assert exp.session_info() == {"epsilon": 0.5}  # before any update
    exp.updates = 10**6
    assert exp.session_info() == {"epsilon": pytest.approx(last)}


# -- the loops, in-process, for every combination of improvements ------------------
@pytest.mark.parametrize("double,dueling,per", list(itertools.product([False, True], repeat=3)))
def test_play_and_train_in_process(tmp_path, monkeypatch, double, dueling, per):
    monkeypatch.setenv("TINYVERSE_WORKER_INDEX", "0")
    monkeypatch.setenv("TINYVERSE_WORKER_COUNT", "2")
    db = connect(f"sqlite:///{tmp_path / 't.db'}", "dqn", retry_for=5)
    args = dqn.Args(hidden=16, double=double, dueling=dueling, per=per, n_step=1 if per else 3, learning_starts=0)
    assert play(dqn.DQN(args), db, batch_size=2, rounds=2) == 4
    exp = dqn.DQN(args)
    assert train(exp, db, batch_size=2, updates=3, save_every=2) >= 2
    assert exp.updates == 3 and (exp.per is not None) == per
    assert db.sample_batch(1)["info.epsilon"][0] == 1.0  # recorded per session; no update was seen yet
    db.close()


def test_a_batch_per_player_counts_as_that_many_updates_in_every_schedule(tmp_path):
    db = connect(f"sqlite:///{tmp_path / 't.db'}", "dqn", retry_for=5)
    args = dqn.Args(hidden=16, train_batch_size=2, target_every=4, learning_starts=0, batch_per_player=True)
    play(dqn.DQN(args), db, batch_size=4, rounds=2)
    exp = dqn.DQN(args)
    assert exp.run.settings.batch_per_player and exp.run.settings.train_batch_size == 2
    players = [Worker(db, "player") for _ in range(2)]
    for w in players:
        w.beat(force=True)  # two live players: batches of 4 sessions, each counted as 2 updates
    copies = []
    exp.target.load_state_dict = lambda state: copies.append(exp.updates)
    train(exp, db, batch_size=2, updates=3, save_every=10)
    # 3 updates on 2 x train_batch_size are 6 updates' worth: the target is loaded at 0 (stored params), copied at 4
    assert exp.updates == 6 and copies == [0, 4]
    assert db.counter("updates") == 6, "the core's pace counts the same"
    db.close()


# -- the real file through the CLI ------------------------------------------------
@pytest.mark.parametrize(
    "options",
    [
        ["env_id=CartPole-v1", "learning_starts=0"],  # every improvement on
        ["env_id=Acrobot-v1", "double=0", "dueling=0", "n_step=1", "per=0"],
    ],
    ids=["cartpole-all-on", "acrobot-all-off"],
)
def test_cli_smoke(tmp_path, options):
    url = f"sqlite:///{tmp_path / 't.db'}"
    sets = [a for o in options for a in ("--set", o)]
    run_cli(DQN_FILE, "play", "-n", "2", "-b", "2", "--db", url, "-q", *sets, cwd=tmp_path)
    run_cli(DQN_FILE, "train", "-n", "5", "-b", "2", "--db", url, "-q", cwd=tmp_path)  # adopts the options
    if "env_id=CartPole-v1" in options:  # one eval is enough (each process start costs seconds)
        out = run_cli(DQN_FILE, "eval", "-n", "1", "--no-record", "--db", url, cwd=tmp_path)
        assert "mean return" in out.stdout
    db = connect(url, "dqn", retry_for=5)
    assert db.params_version() >= 2 and db.count_sessions() == (4, 4)
    db.close()


def test_set_options_pick_the_preset_and_a_conflicting_worker_stops(tmp_path):
    url = f"sqlite:///{tmp_path / 't.db'}"
    run_cli(DQN_FILE, "play", "-n", "1", "--db", url, "-q", "--set", "env_id=Acrobot-v1", "--set", "n_step=1")
    db = connect(url, "dqn", retry_for=5)
    stored = db.setting("options")
    assert stored["env_id"] == "Acrobot-v1" and stored["n_step"] == 1  # given
    expected = dqn.PRESETS["Acrobot-v1"]
    assert {k: stored[k] for k in expected} == expected  # the preset, resolved: stored complete
    assert stored == json.loads(json.dumps(dataclasses.asdict(dqn.Args(env_id="Acrobot-v1", n_step=1))))  # as JSON
    # a later worker that disagrees stops with one line naming both values
    out = run_cli(DQN_FILE, "train", "-n", "1", "--db", url, "--set", "n_step=3", check=False)
    assert out.returncode != 0
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and "n_step=3" in lines[0] and "n_step=1" in lines[0], out.stderr
    assert db.setting("options") == stored and db.counter("updates") == 0
    db.close()


# -- cartpole_dqn.py, the README's example: a user copies it out and makes it their own --------------------------
def test_cartpole_dqn_runs_copied_alone_into_a_folder_of_its_own(tmp_path):
    source = ROOT / "examples" / "cartpole_dqn.py"
    tree = ast.parse(source.read_text())
    imported = {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    imported |= {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
    assert {m.split(".")[0] for m in imported} <= {"dataclasses", "gymnasium", "numpy", "torch", "tinyverse"}
    mine = tmp_path / "cartpole_dqn.py"
    shutil.copy(source, mine)  # alone: no common.py, no other example beside it
    url = f"sqlite:///{tmp_path / 'own.db'}"
    run_cli(mine, "play", "-n", "1", "-b", "1", "--db", url, "--set", "learning_starts=0", cwd=tmp_path, timeout=60)
    run_cli(mine, "train", "-n", "1", "-b", "1", "--db", url, cwd=tmp_path, timeout=60)
    out = run_cli(mine, "eval", "-n", "1", "--no-record", "--db", url, cwd=tmp_path, timeout=60).stdout
    assert "mean return" in out and "params v2" in out  # the player's init, then the trainer's update
