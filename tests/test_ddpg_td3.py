"""examples/ddpg_td3.py: presets and options, TD3's target by hand, the exploration noises, the CLI end to end."""

import dataclasses
import json
import math

import gymnasium as gym
import numpy as np
import pytest
from conftest import optional, run_cli

import tinyverse
from tinyverse.database import connect
from tinyverse.loader import load_experiment
from tinyverse.options import store
from tinyverse.player import play

torch = optional("torch")  # the example imports it too
from continuous_examples import (  # noqa: E402
    FILES,
    MODULES,
    PENDULUM_OBS,
    critic_coef,
    linears,
    make,
    set_affine,
    td3_and_sac_batch,
)

FILE = FILES["ddpg_td3"]
ddpg_td3 = MODULES["ddpg_td3"]


@pytest.fixture(autouse=True)
def lone_player(monkeypatch):
    """No worker index from the environment unless a test sets one: a lone player's noise scale."""
    monkeypatch.delenv("TINYVERSE_WORKER_INDEX", raising=False)
    monkeypatch.delenv("TINYVERSE_WORKER_COUNT", raising=False)


# -- options ------------------------------------------------------------------------
def test_presets_fill_what_is_unset():
    td3 = ddpg_td3.Args()  # TD3 on Pendulum-v1: RL-Zoo's td3.yml
    assert (td3.algo, td3.env_id, td3.noise, td3.noise_std) == ("td3", "Pendulum-v1", "gaussian", 0.1)
    assert (td3.gamma, td3.learning_rate, td3.net_arch, td3.learning_starts) == (0.98, 1e-3, "400,300", 10_000)
    assert td3.buffer_transitions == 200_000 and td3.tau == 0.005
    assert ddpg_td3.Args(algo="ddpg", env_id="BipedalWalker-v3").learning_starts == 10_000  # ddpg.yml alike
    assert ddpg_td3.Args(gamma=0.9, learning_starts=5).gamma == 0.9  # given: kept
    assert ddpg_td3.Args(env_id="MountainCarContinuous-v0").learning_starts == 100  # no preset: SB3's defaults
    for bad in (dict(algo="ppo"), dict(noise="pink"), dict(algo="sac")):
        with pytest.raises(tinyverse.TinyverseError, match="noise=|algo=") as e:  # the CLI prints the line alone
            load_experiment(str(FILE), None, bad)
        assert len(str(e.value).splitlines()) == 1
    assert load_experiment(str(FILE), None, {"noise": "none"}).args.noise == "none", "td3 without noise"


def test_every_worker_of_a_run_may_repeat_its_noise_option(tmp_path):
    db = connect(f"sqlite:///{tmp_path / 'options.db'}", "ddpg_td3")
    for _ in range(2):  # the trainer stores the options (at its first write), the player (same --set) agrees
        exp = load_experiment(str(FILE), db, {"algo": "ddpg", "noise": "none"})
        assert exp.args.noise == "none"
        store(exp.run, db)
    with pytest.raises(tinyverse.TinyverseError, match="conflicts"):
        load_experiment(str(FILE), db, {"algo": "td3"})
    db.close()


# -- targets ------------------------------------------------------------------------
def test_td3_target_takes_the_smaller_critic_at_a_smoothed_clipped_action():
    exp = make("td3", gamma=0.9, target_noise=1.0, target_noise_clip=0.9)
    set_affine(linears(exp.target_actor), [0.0] * PENDULUM_OBS, math.atanh(0.5))  # mu'(s) = 0.5
    set_affine(linears(exp.target_q1), critic_coef(1.0, 2.0), 0.0)  # Q1'(s, a) = s0 + 2a: the smaller for a < 0
    set_affine(linears(exp.target_q2), critic_coef(1.0, -1.0), 0.0)  # Q2'(s, a) = s0 - a
    batch, boot_s0, discount = td3_and_sac_batch()
    torch.manual_seed(7)
    _, _, target = exp.critic_targets(batch)
    torch.manual_seed(7)
    eps = torch.randn(100, 1).numpy()[:, 0].astype(np.float64)  # the one draw of smoothing noise
    noise = np.clip(1.0 * eps, -0.9, 0.9)
    action = np.clip(0.5 + noise, -1, 1)
    q = np.minimum(boot_s0 + 2 * action, boot_s0 - action)
    np.testing.assert_allclose(target.numpy(), batch["rewards"].ravel() + discount * q, rtol=1e-5, atol=1e-5)
    # each mechanism had work to do in this draw
    assert (eps < -0.9).any() and (0.5 + noise > 1).any(), "noise clip (a < 0) and action clip (a > 0) engaged"
    assert (action < 0).any() and (action > 0).any(), "each critic was the smaller one somewhere"


def test_ddpg_target_is_the_one_target_critic_at_the_target_policy():
    exp = make("ddpg", gamma=0.9)
    set_affine(linears(exp.target_actor), [0.0] * PENDULUM_OBS, math.atanh(0.5))  # mu'(s) = 0.5
    set_affine(linears(exp.target_q1), critic_coef(1.0, 2.0), 0.0)  # Q'(s, a) = s0 + 2a
    batch, boot_s0, discount = td3_and_sac_batch()
    _, _, target = exp.critic_targets(batch)
    expected = batch["rewards"].ravel() + discount * (boot_s0 + 2 * 0.5)
    np.testing.assert_allclose(target.numpy(), expected, rtol=1e-5, atol=1e-5)
    assert not hasattr(exp, "q2") and "q2" not in exp.nets


# -- exploration --------------------------------------------------------------------------------
def test_ou_noise_follows_its_process_in_memory():
    exp = make("ddpg", noise="ou", noise_std=0.0, ou_theta=0.5, ou_dt=0.1)
    exp.updates = 1
    obs = np.zeros((2, PENDULUM_OBS), np.float32)
    mu, _ = exp.act(obs, {}, greedy=True)
    memory = {"ou": np.array([[0.5], [-0.25]], np.float32)}
    actions, memory = exp.act(obs, memory)
    np.testing.assert_allclose(memory["ou"], [[0.5 * 0.95], [-0.25 * 0.95]])  # the drift: x - theta x dt
    np.testing.assert_allclose(exp.box.from_env(actions), exp.box.from_env(mu) + memory["ou"], atol=1e-6)
    exp = make("ddpg", noise="ou", noise_std=0.3, ou_theta=0.5, ou_dt=0.04)
    exp.updates = 1
    _, memory = exp.act(np.zeros((4000, PENDULUM_OBS), np.float32), exp.initial_memory(4000))
    assert np.std(memory["ou"]) == pytest.approx(0.3 * 0.2, rel=0.05)  # the diffusion: s sqrt(dt) N(0, 1)
    assert exp.initial_memory(3)["ou"].shape == (3, 1) and not exp.initial_memory(3)["ou"].any()


class ShortEpisodes(ddpg_td3.DDPG):
    """Real Pendulum episodes of 5 ticks."""

    def make_env(self, render_mode=None):
        return gym.make("Pendulum-v1", render_mode=render_mode, max_episode_steps=5)


def test_ou_state_is_kept_per_environment_and_reset_when_its_episode_ends(tmp_path):
    db = connect(f"sqlite:///{tmp_path / 'ou.db'}", "ou", retry_for=5)
    args = ddpg_td3.Args(algo="ddpg", noise="ou", noise_std=0.5, net_arch="8,8", session_length=4, random_warmup=False)
    assert play(ShortEpisodes(args), db, batch_size=2, rounds=6) == 12
    batch = db.get_batch(list(range(1, 13)))  # stored in order: round r holds ids 2r+1 (env 0) and 2r+2 (env 1)
    assert batch["id"].tolist() == list(range(1, 13))
    ou = batch["memory.ou"][:, 0].reshape(6, 2)  # the noise state at each round's start, per environment
    ends = batch["truncated"].reshape(6, 2, 4)
    assert ends[:, 0].ravel().tolist() == ends[:, 1].ravel().tolist() == [t % 5 == 4 for t in range(24)]
    # rounds start at ticks 0, 4, 8, 12, 16, 20; episodes at 0, 5, 10, 15, 20
    assert (ou[[0, 5]] == 0).all(), "reset at an episode's start"
    assert (ou[1:5] != 0).all(), "carried through the episode"
    assert (ou[1:5, 0] != ou[1:5, 1]).all(), "one process per environment"
    db.close()


def test_param_noise_perturbs_a_copy_per_environment_and_adapts_its_scale():
    exp = make("td3", noise="param", noise_std=0.1, param_init_std=0.5)
    exp.updates = 1
    obs = np.random.default_rng(0).standard_normal((2, PENDULUM_OBS)).astype(np.float32)
    before = exp.get_params()
    greedy, _ = exp.act(obs, {}, greedy=True)
    memory = exp.initial_memory(2)
    noisy, memory = exp.act(obs, memory)
    assert not np.allclose(noisy, greedy, atol=1e-3), "the perturbed policy acts differently"
    assert all(np.array_equal(before[k], v) for k, v in exp.get_params().items()), "the actor itself is untouched"
    assert memory["fresh"].tolist() == [0, 0]
    eps = [w.clone() for w, _ in exp.noise.eps]
    exp.act(obs, memory)
    assert all(torch.equal(e, w) for e, (w, _) in zip(eps, exp.noise.eps, strict=True)), "kept within an episode"
    memory["fresh"][1] = exp.initial_memory(1)["fresh"][0]  # what the player does when env 1's episode ends
    exp.act(obs, memory)
    for e, (w, _) in zip(eps, exp.noise.eps, strict=True):
        assert torch.equal(e[0], w[0]) and not torch.equal(e[1], w[1]), "redrawn for env 1 only"
    # sigma grows while the actions move less than the target distance, shrinks while they move more
    sigma = exp.noise.sigma
    exp.noise.scale = 100.0
    for _ in range(10):
        exp.act(obs, memory)
    assert exp.noise.sigma == pytest.approx(sigma * 1.01**10)
    exp.noise.scale = 0.0
    for _ in range(20):
        exp.act(obs, memory)
    assert exp.noise.sigma == pytest.approx(sigma * 1.01**-10)
    assert exp.session_info() == {"noise": 0.0, "param_sigma": pytest.approx(sigma * 1.01**-10)}


def test_players_explore_at_their_own_scales(monkeypatch):
    assert make("td3").noise.scale == 0.1  # a lone player
    obs = np.zeros((4000, PENDULUM_OBS), np.float32)
    spreads = {}
    for index in (0, 3):
        monkeypatch.setenv("TINYVERSE_WORKER_INDEX", str(index))
        monkeypatch.setenv("TINYVERSE_WORKER_COUNT", "4")
        exp = make("td3", noise_std=0.1, noise_spread=2.0)
        exp.updates = 1
        # Ape-X's spread (tinyverse.explore.apex_spread): 0.1 x 2 ** (1 - 2q), q = (i + 1/2) / 4
        assert exp.session_info() == {"noise": pytest.approx(0.1 * 2.0 ** (1 - (2 * index + 1) / 4))}
        greedy, _ = exp.act(obs, {}, greedy=True)
        noisy, _ = exp.act(obs, {})
        spreads[index] = np.std(exp.box.from_env(noisy) - exp.box.from_env(greedy))
    assert spreads[0] == pytest.approx(0.1 * 2**0.75, rel=0.1) and spreads[3] == pytest.approx(0.1 * 2**-0.75, rel=0.1)
    monkeypatch.delenv("TINYVERSE_WORKER_INDEX")
    scales = {round(make("td3", noise_players=4).noise.scale, 9) for _ in range(40)}  # no index: one drawn at random
    assert scales <= {round(0.1 * 2 ** (1 - (2 * i + 1) / 4), 9) for i in range(4)} and len(scales) > 1


# -- the real file through the CLI ---------------------------------------------------------------
def test_cli_run_then_eval_with_video(tmp_path):
    url = f"sqlite:///{tmp_path / 'run.db'}"
    sets = ["net_arch=32,32", "learning_starts=500", "train_batch_size=4", "updates_per_step=0.25", "noise_std=0.2"]
    cli = [a for s in sets for a in ("--set", s)]
    out = run_cli(FILE, "run", "-n", 2000, "--players", 2, "--eval-episodes", 1, "--db", url, *cli, cwd=tmp_path)
    assert "run stopped: reached" in out.stdout and "mean return" in out.stdout, out.stdout + out.stderr
    db = connect(url, "ddpg_td3", retry_for=5)
    stored = db.setting("options")
    given = dict(net_arch="32,32", learning_starts=500, train_batch_size=4, updates_per_step=0.25, noise_std=0.2)
    assert stored == json.loads(json.dumps(dataclasses.asdict(ddpg_td3.Args(**given))))  # the preset filled in the rest
    assert db.counter("updates") > 0 and db.params_version() >= 2
    assert db.load_params()[1]["updates"] > 0
    lo, hi = db.session_range()
    batch = db.get_batch(list(range(lo, hi + 1)))
    assert batch["actions"].dtype == np.float32 and batch["actions"].shape[1:] == (4, 1)
    assert (np.abs(batch["actions"]) <= 2).all()
    # players 0 and 1 of 2: noise_std x 2 ** 0.5 and / 2 ** 0.5
    assert sorted(set(batch["info.noise"].tolist())) == pytest.approx([0.2 / 2**0.5, 0.2 * 2**0.5])
    db.close()
    ev = run_cli(FILE, "eval", "-n", 1, "--record", "videos", "--db", url, cwd=tmp_path, timeout=60)
    (video,) = (tmp_path / "videos").glob("*.mp4")
    assert video.read_bytes()[4:8] == b"ftyp" and str(video.relative_to(tmp_path)) in ev.stdout
    assert "mean return" in ev.stdout
