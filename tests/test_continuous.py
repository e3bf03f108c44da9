"""What ddpg_td3.py, sac.py and naf.py do alike: targets that respect episode ends, updates of every network,
params, actions within the bounds, the pace, and the loops in-process. Each algorithm's own: its test file."""

import fnmatch
import math

import numpy as np
import pytest
from conftest import optional

from tinyverse.database import connect
from tinyverse.player import play
from tinyverse.trainer import train

torch = optional("torch")  # the examples import it too
from continuous_examples import (  # noqa: E402
    ALGOS,
    FILES,
    critic_coef,
    linears,
    make,
    module_of,
    session_batch,
    set_affine,
)


@pytest.fixture(autouse=True)
def lone_player(monkeypatch):
    """No worker index from the environment unless a test sets one: a lone player's noise scale."""
    monkeypatch.delenv("TINYVERSE_WORKER_INDEX", raising=False)
    monkeypatch.delenv("TINYVERSE_WORKER_COUNT", raising=False)


@pytest.mark.parametrize("name", FILES)
def test_the_loops_own_the_pace_and_publishing(name):
    source = FILES[name].read_text()
    for banned in ("sleep(", "save_params", "sync_params", "wait_for"):  # the loops own the pace and publishing
        assert banned not in source, f"{name}.py has {banned}"
    for banned in ("NotImplementedError", "class Continuous"):  # each file reads top to bottom
        assert banned not in source, f"{name}.py has {banned}"


@pytest.mark.parametrize("algo", ALGOS)
def test_the_pace_is_declared(algo):
    exp = make(algo, updates_per_step=0.5, learning_starts=300, pace_slack=200, session_length=8, train_batch_size=4)
    settings = exp.run.settings  # what the loops read: the options, nothing copied onto the experiment
    assert (settings.updates_per_step, settings.learning_starts, settings.pace_slack) == (0.5, 300, 200)
    assert (settings.session_length, settings.train_batch_size) == (8, 4)
    assert settings.buffer_size == exp.args.buffer_transitions // 8
    assert make("td3", session_length=8).run.settings.buffer_size == 200_000 // 8  # RL-Zoo's buffer on Pendulum


# -- targets ------------------------------------------------------------------------
@pytest.mark.parametrize("algo", ALGOS)
def test_terminated_episodes_never_bootstrap_truncated_ones_bootstrap_from_their_final_observation(algo):
    exp = make(algo, gamma=0.5)
    if algo == "naf":  # V'(s) = 3 s0 + 1
        set_affine([*linears(exp.target.trunk), exp.target.value], [3.0, 0.0, 0.0], 1.0)
    else:  # Q'(s, a) = 3 s0 + 1 for every target critic, whatever the action
        for q in [exp.target_q1] + ([exp.target_q2] if hasattr(exp, "target_q2") else []):
            set_affine(linears(q), critic_coef(3.0, 0.0), 1.0)
    if algo == "sac":
        exp.log_alpha.data.fill_(-60.0)  # no entropy bonus to speak of
    # s0: 1..5; tick 1 terminates (final s0 7), tick 2 is truncated (final s0 10)
    batch = session_batch([[1, 2, 3, 4, 5]], [[1, 1, 1, 1]], [[0, 1, 0, 0]], [[0, 0, 1, 0]], 0.0)
    batch["final_observations"][0, 1, 0], batch["final_observations"][0, 2, 0] = 7.0, 10.0
    _, _, target = exp.critic_targets(batch)
    np.testing.assert_allclose(target.numpy(), [1 + 0.5 * 7, 1, 1 + 0.5 * 31, 1 + 0.5 * 16], rtol=1e-5)


# -- updates and params -----------------------------------------------------------------
def random_batch(exp, B=4, T=8, seed=0):
    rng = np.random.default_rng(seed)
    return {
        "observations": rng.standard_normal((B, T + 1, exp.n_obs)).astype(np.float32),
        "final_observations": rng.standard_normal((B, T, exp.n_obs)).astype(np.float32),
        "actions": exp.box.to_env(rng.uniform(-1, 1, (B, T, exp.n_act))),
        "rewards": rng.standard_normal((B, T)).astype(np.float32),
        "terminated": rng.random((B, T)) < 0.1,
        "truncated": rng.random((B, T)) < 0.1,
    }


def changed(before: dict, after: dict, glob: str) -> bool:
    names = [k for k in before if fnmatch.fnmatchcase(k, glob)]
    assert names, glob
    return any(not np.array_equal(before[k], after[k]) for k in names)


def assert_soft_update(before: dict, after: dict, online: str, target: str, tau: float):
    for k in (k for k in after if k.startswith(f"{online}.")):
        old = before[f"{target}{k[len(online) :]}"]
        np.testing.assert_allclose(after[f"{target}{k[len(online) :]}"], old + tau * (after[k] - old), atol=1e-6)


@pytest.mark.parametrize("algo", ALGOS)
def test_an_update_trains_every_network_and_soft_updates_the_targets(algo):
    exp = make(algo, tau=0.1)
    exp.prepare_training()
    batch = random_batch(exp)
    p0 = exp.get_params()
    metrics = exp.train_step(batch)
    assert all(isinstance(v, float) and math.isfinite(v) for v in metrics.values()) and "loss" in metrics
    p1 = exp.get_params()
    assert p1["updates"] == 1
    online = {"naf": ["naf"], "sac": ["actor", "q1", "q2"]}.get(
        algo, ["actor", "q1"] + (["q2"] if algo == "td3" else [])
    )
    if algo == "td3":  # delayed: the first update trains the critics only
        assert changed(p0, p1, "q1.*") and changed(p0, p1, "q2.*")
        assert not changed(p0, p1, "actor.*") and not changed(p0, p1, "target.*")
        exp.train_step(batch)
        p1, p0 = exp.get_params(), p1  # the second trains the actor and moves every target
        assert p1["updates"] == 2
    for net in online:
        assert changed(p0, p1, f"{net}.*"), net
        if f"target.{net}.{next(iter(exp.nets[net].state_dict()))}" in p1:
            assert_soft_update(p0, p1, net, f"target.{net}", 0.1)
    if algo == "sac":
        assert p1["log_alpha"] != p0["log_alpha"] and "alpha" in metrics and "entropy" in metrics
        assert not any(k.startswith("target.actor") for k in p1)  # SAC's actor has no target


@pytest.mark.parametrize("algo", ALGOS)
def test_params_round_trip_and_the_targets_are_local(algo):
    exp = make(algo)
    exp.prepare_training()
    exp.train_step(random_batch(exp))
    params = exp.get_params()
    assert params["updates"].dtype == np.int64
    assert all(v.dtype == np.float32 for k, v in params.items() if k != "updates")
    local = {k for k in params if any(fnmatch.fnmatchcase(k, g) for g in exp.run.settings.local_params)}
    assert local and local == {k for k in params if k.startswith("target.")}
    assert ("log_alpha" in params) == (algo == "sac")
    other = make(algo, seed=1)
    assert not all(np.array_equal(params[k], v) for k, v in other.get_params().items())
    other.set_params(params)
    assert all(np.array_equal(params[k], v) for k, v in other.get_params().items())
    obs = np.random.default_rng(0).standard_normal((5, exp.n_obs)).astype(np.float32)
    np.testing.assert_array_equal(other.act(obs, {}, greedy=True)[0], exp.act(obs, {}, greedy=True)[0])


# -- actions ----------------------------------------------------------------------------------
COMBOS = [("ddpg", "gaussian"), ("ddpg", "ou"), ("td3", "param"), ("td3", "none"), ("sac", "none"), ("naf", "ou")]
COMBOS += [("naf", "param")]


@pytest.mark.parametrize("env_id", ["Pendulum-v1", "LunarLanderContinuous-v3"])
@pytest.mark.parametrize("algo,noise", COMBOS)
def test_actions_are_float32_within_bounds_even_with_wild_noise(algo, noise, env_id):
    wild = {} if algo == "sac" else dict(noise=noise, noise_std=5.0, param_init_std=3.0)  # sac samples its policy
    exp = make(algo, env_id=env_id, **wild)
    space = exp.make_env().action_space
    obs = np.random.default_rng(0).standard_normal((64, exp.n_obs)).astype(np.float32) * 3
    memory = exp.initial_memory(64)
    for updates in (0, 1):  # uniformly at random before any update, then the policy and its noise
        exp.updates = updates
        for greedy in (False, False, True):
            actions, memory = exp.act(obs, memory, greedy=greedy)
            assert actions.dtype == np.float32 and actions.shape == (64, space.shape[0])
            assert (actions >= space.low).all() and (actions <= space.high).all()
            assert all(space.contains(a) for a in actions)
            if updates == 0 and not greedy:  # the warm-up spreads over the whole box
                assert (actions.std(0) > 0.4 * (space.high - space.low) / 2).all()
    if noise != "none":
        memory, explored = exp.initial_memory(64), []
        for _ in range(10):  # OU noise starts at 0 and builds up over steps
            actions, memory = exp.act(obs, memory)
            explored.append(actions)
        explored = np.stack(explored)
        assert (explored == space.low).any() or (explored == space.high).any()  # clipped, not wrapped


def test_actions_map_affinely_onto_the_bounds():
    box = make("td3").box
    box.low, box.high = np.array([0.0, -3.0], np.float32), np.array([4.0, -1.0], np.float32)
    u = np.array([[-1, -1], [0, 0.5], [1, 1]], np.float32)
    np.testing.assert_allclose(box.to_env(u), [[0, -3], [2, -1.5], [4, -1]])
    np.testing.assert_allclose(box.from_env(box.to_env(u)), u, atol=1e-6)


# -- the loops in-process ---------------------------------------------------------------------
@pytest.mark.parametrize("algo,noise", [("ddpg", "ou"), ("td3", "gaussian"), ("sac", "none"), ("naf", "param")])
def test_play_and_train_in_process(tmp_path, algo, noise):
    db = connect(f"sqlite:///{tmp_path / 't.db'}", "cont", retry_for=5)
    module = module_of(algo)
    options = dict(net_arch="16,16", session_length=8, learning_starts=0)
    options |= {} if algo == "sac" else {"noise": noise}
    options |= {"algo": algo} if algo in ("ddpg", "td3") else {}
    args = module.Args(**options)
    assert play(module.make_experiment(args), db, batch_size=2, rounds=2) == 4
    trainer = module.make_experiment(args)
    assert train(trainer, db, batch_size=2, updates=3, save_every=2) >= 2
    assert trainer.updates == 3 and int(db.load_params()[1]["updates"]) == 3
    batch = db.sample_batch(4)
    assert batch["actions"].dtype == np.float32 and batch["actions"].shape == (4, 8, 1)
    assert (np.abs(batch["actions"]) <= 2).all()
    if algo == "sac":  # it explores by sampling its policy: it stores its temperature, no noise scale
        assert (batch["info.alpha"] == 1.0).all() and "info.noise" not in batch
    else:
        assert (batch["info.noise"] == 0.1).all()
    player = module.make_experiment(args)
    play(player, db, batch_size=1, rounds=1)
    assert player.updates == 3  # the trained params reached it: it acts with the policy now
    db.close()
