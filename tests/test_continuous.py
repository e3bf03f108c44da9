"""examples/continuous.py: targets by hand, NAF's Q, exploration noises, the loops, the CLI end to end."""

import dataclasses
import fnmatch
import importlib.util
import math
import sys

import gymnasium as gym
import numpy as np
import pytest
from conftest import ROOT, optional, run_cli

import tinyverse
from tinyverse.database import connect
from tinyverse.loader import load_experiment
from tinyverse.options import store
from tinyverse.player import play
from tinyverse.trainer import train

FILE = ROOT / "examples" / "continuous.py"
torch = optional("torch")  # the example imports it too
sys.path.insert(0, str(ROOT / "examples"))  # as the loader does: continuous.py imports its neighbour common.py
_spec = importlib.util.spec_from_file_location("continuous_example", FILE)
cont = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(cont)

ALGOS = ["ddpg", "td3", "sac", "naf"]
PENDULUM_OBS = 3  # Pendulum-v1: observations (cos, sin, angular velocity), one action in [-2, 2]


@pytest.fixture(autouse=True)
def lone_player(monkeypatch):
    """No worker index from the environment unless a test sets one: a lone player's noise scale."""
    monkeypatch.delenv("TINYVERSE_WORKER_INDEX", raising=False)
    monkeypatch.delenv("TINYVERSE_WORKER_COUNT", raising=False)


def make(algo: str, env_id: str = "Pendulum-v1", **options):
    args = cont.Args(algo=algo, env_id=env_id, **{"net_arch": "8,8", "seed": 0, **options})
    return cont.make_experiment(None, args)


def linears(module) -> list[torch.nn.Linear]:
    return [m for m in module.modules() if isinstance(m, torch.nn.Linear)]


def set_affine(layers: list[torch.nn.Linear], coef, const: float) -> None:
    """Make Linear layers with ReLU between them compute coef . x + const (for coef . x > -100) in output 0."""
    with torch.no_grad():
        for m in layers:
            m.weight.zero_()
            m.bias.zero_()
        first, *middle, last = layers
        first.weight[0] = torch.tensor(coef, dtype=torch.float32)
        first.bias[0] = 100.0  # keeps the unit in the ReLU's linear part
        for m in middle:
            m.weight[0, 0] = 1.0
        last.weight[0, 0] = 1.0
        last.bias[0] = const - 100.0


def critic_coef(s0: float, a0: float) -> list[float]:
    """Coefficients of a Pendulum critic's input [s, a]: on the observation's first entry and the action."""
    return [s0, 0.0, 0.0, a0]


def session_batch(s0, rewards, terminated, truncated, final_s0, n_act=1):
    """One or more sessions of Pendulum-shaped observations whose first entry is s0 (B, T+1), the rest 0."""
    s0 = np.asarray(s0, np.float32)
    B, T = np.shape(rewards)
    obs = np.zeros((B, T + 1, PENDULUM_OBS), np.float32)
    obs[..., 0] = s0
    final = np.zeros((B, T, PENDULUM_OBS), np.float32)
    final[..., 0] = final_s0
    return {
        "observations": obs,
        "final_observations": final,
        "actions": np.zeros((B, T, n_act), np.float32),
        "rewards": np.asarray(rewards, np.float32),
        "terminated": np.asarray(terminated, bool),
        "truncated": np.asarray(truncated, bool),
    }


# -- options ------------------------------------------------------------------------
def test_presets_fill_what_is_unset_and_the_pace_is_declared():
    td3 = cont.Args()  # TD3 on Pendulum-v1: RL-Zoo's td3.yml
    assert (td3.algo, td3.env_id, td3.noise, td3.noise_std) == ("td3", "Pendulum-v1", "gaussian", 0.1)
    assert (td3.gamma, td3.learning_rate, td3.net_arch, td3.learning_starts) == (0.98, 1e-3, "400,300", 10_000)
    assert td3.buffer_transitions == 200_000 and td3.tau == 0.005
    sac = cont.Args(algo="sac")
    assert (sac.noise, sac.learning_rate, sac.gamma, sac.net_arch, sac.learning_starts) == (
        "none",
        1e-3,
        0.99,
        "256,256",
        100,
    )
    walker = cont.Args(algo="sac", env_id="BipedalWalker-v3")
    assert (walker.learning_rate, walker.gamma, walker.tau, walker.buffer_transitions) == (7.3e-4, 0.98, 0.02, 300_000)
    assert cont.Args(algo="naf", env_id="LunarLanderContinuous-v3").learning_starts == 10_000
    assert cont.Args(gamma=0.9, learning_starts=5).gamma == 0.9  # given: kept
    assert cont.Args(env_id="MountainCarContinuous-v0").learning_starts == 100  # no preset: SB3's defaults
    for bad in (dict(algo="ppo"), dict(noise="pink"), dict(algo="sac", noise="gaussian")):
        with pytest.raises(tinyverse.TinyverseError, match="noise=|algo=") as e:  # the CLI prints the line alone
            load_experiment(str(FILE), None, bad)
        assert len(str(e.value).splitlines()) == 1
    assert load_experiment(str(FILE), None, {"noise": "none"}).args.noise == "none", "td3 without noise, not a preset"


def test_every_worker_of_a_run_may_repeat_its_noise_option(tmp_path):
    db = connect(f"sqlite:///{tmp_path / 'options.db'}", "continuous")
    for _ in range(2):  # the trainer stores the options (at its first write), the player (same --set) agrees
        exp = load_experiment(str(FILE), db, {"algo": "sac", "noise": "none"})
        assert exp.args.noise == "none"
        store(exp, db)
    with pytest.raises(tinyverse.TinyverseError, match="conflicts"):
        load_experiment(str(FILE), db, {"algo": "td3"})
    db.close()


def test_the_loops_own_the_pace_and_publishing():
    source = FILE.read_text()
    for banned in ("sleep(", "save_params", "sync_params", "wait_for"):  # the loops own the pace and publishing
        assert banned not in source
    exp = make("td3", replay_ratio=0.5, learning_starts=300, pace_slack=200, session_length=8, batch_sessions=4)
    assert (exp.updates_per_step, exp.learning_starts, exp.pace_slack) == (0.5, 300, 200)
    assert (exp.session_length, exp.train_batch_size, exp.buffer_size) == (8, 4, 200_000 // 8)


# -- targets ------------------------------------------------------------------------
def td3_and_sac_batch():
    """Two sessions of 50 ticks, random s0 in [-1, 1]; a termination and a truncation (final s0 5) in session 0."""
    rng = np.random.default_rng(0)
    terminated, truncated = np.zeros((2, 50), bool), np.zeros((2, 50), bool)
    terminated[0, 10], truncated[0, 20] = True, True
    rewards = rng.standard_normal((2, 50))
    batch = session_batch(rng.uniform(-1, 1, (2, 51)), rewards, terminated, truncated, 5.0)
    ended = terminated | truncated
    boot_s0 = np.where(ended, batch["final_observations"][..., 0], batch["observations"][:, 1:, 0]).ravel()
    return batch, boot_s0, np.where(terminated, 0.0, 0.9).ravel()


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


def test_sac_target_is_the_soft_value_with_the_entropy_bonus():
    exp = make("sac", gamma=0.9, alpha=0.5)
    set_affine(linears(exp.target_q1), critic_coef(1.0, 2.0), 0.0)
    set_affine(linears(exp.target_q2), critic_coef(1.0, 0.0), 0.6)
    with torch.no_grad():  # pi(.|s): tanh of N(0.2, 0.5^2) whatever s
        for head, value in ((exp.actor.mean, 0.2), (exp.actor.log_std, math.log(0.5))):
            head.weight.zero_()
            head.bias.fill_(value)
    batch, boot_s0, discount = td3_and_sac_batch()
    torch.manual_seed(3)
    _, _, target = exp.critic_targets(batch)
    torch.manual_seed(3)
    eps = torch.randn(100, 1).numpy()[:, 0].astype(np.float64)  # the one draw of a' ~ pi(.|s')
    u = 0.2 + 0.5 * eps
    a = np.tanh(u)
    logp = -0.5 * eps**2 - math.log(0.5) - 0.5 * math.log(2 * math.pi) - np.log(1 - a**2)
    soft = np.minimum(boot_s0 + 2 * a, boot_s0 + 0.6) - 0.5 * logp
    np.testing.assert_allclose(target.numpy(), batch["rewards"].ravel() + discount * soft, rtol=1e-4, atol=1e-4)
    assert (a < 0.3).any() and (a > 0.3).any()


def test_squashed_log_prob_matches_torch_distributions():
    mean, log_std = torch.tensor([[0.3, -1.0], [2.0, 0.0]]), torch.tensor([[-1.0, 0.5], [0.2, -3.0]])
    u = mean + log_std.exp() * torch.tensor([[0.5, -1.2], [1.5, 0.1]])
    dist = torch.distributions.TransformedDistribution(
        torch.distributions.Normal(mean, log_std.exp()), torch.distributions.transforms.TanhTransform()
    )
    np.testing.assert_allclose(
        cont.squashed_log_prob(u, mean, log_std), dist.log_prob(torch.tanh(u)).sum(-1), rtol=1e-5
    )
    # far in the tail tanh(u) rounds to 1: the log-probability stays finite
    assert torch.isfinite(cont.squashed_log_prob(torch.tensor([[30.0]]), torch.tensor([[30.0]]), torch.zeros(1, 1)))


def test_naf_q_is_v_at_mu_and_lower_elsewhere():
    exp = make("naf", env_id="LunarLanderContinuous-v3")  # two actions: L has an entry below the diagonal
    rng = np.random.default_rng(1)
    obs = torch.as_tensor(rng.standard_normal((64, 8)), dtype=torch.float32)
    with torch.no_grad():
        v, mu, L = exp.net(obs)
        assert torch.equal(L, L.tril()) and (L.diagonal(dim1=1, dim2=2) > 0).all()
        assert (L[:, 1, 0] != 0).all()
        torch.testing.assert_close(exp.net.q(obs, mu), v)  # Q(s, mu(s)) = V(s)
        act = torch.as_tensor(rng.uniform(-1, 1, (64, 2)), dtype=torch.float32)
        q = exp.net.q(obs, act)
    d = (act - mu).numpy().astype(np.float64)
    P = np.einsum("nij,nkj->nik", L.numpy(), L.numpy())  # L L^T
    np.testing.assert_allclose(q, v.numpy() - 0.5 * np.einsum("ni,nij,nj->n", d, P, d), rtol=1e-4, atol=1e-5)
    assert (q < v).all()  # every sampled action is worse than mu
    exp.updates = 1
    greedy, _ = exp.act(obs.numpy(), {}, greedy=True)
    np.testing.assert_allclose(greedy, exp.to_env(mu.numpy()), rtol=1e-6)


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
        "actions": exp.to_env(rng.uniform(-1, 1, (B, T, exp.n_act))),
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
        if f"target.{net}.{next(iter(exp.nets()[net].state_dict()))}" in p1:
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
    local = {k for k in params if any(fnmatch.fnmatchcase(k, g) for g in exp.local_params)}
    assert local and local == {k for k in params if k.startswith("target.")}
    assert ("log_alpha" in params) == (algo == "sac")
    other = make(algo, seed=1)
    assert not all(np.array_equal(params[k], v) for k, v in other.get_params().items())
    other.set_params(params)
    assert all(np.array_equal(params[k], v) for k, v in other.get_params().items())
    obs = np.random.default_rng(0).standard_normal((5, exp.n_obs)).astype(np.float32)
    np.testing.assert_array_equal(other.act(obs, {}, greedy=True)[0], exp.act(obs, {}, greedy=True)[0])


# -- actions and exploration --------------------------------------------------------------
COMBOS = [("ddpg", "gaussian"), ("ddpg", "ou"), ("td3", "param"), ("td3", "none"), ("sac", "none"), ("naf", "ou")]
COMBOS += [("naf", "param")]


@pytest.mark.parametrize("env_id", ["Pendulum-v1", "LunarLanderContinuous-v3"])
@pytest.mark.parametrize("algo,noise", COMBOS)
def test_actions_are_float32_within_bounds_even_with_wild_noise(algo, noise, env_id):
    exp = make(algo, env_id=env_id, noise=noise, noise_std=5.0, param_init_std=3.0)
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
    exp = make("td3")
    exp.low, exp.high = np.array([0.0, -3.0], np.float32), np.array([4.0, -1.0], np.float32)
    u = np.array([[-1, -1], [0, 0.5], [1, 1]], np.float32)
    np.testing.assert_allclose(exp.to_env(u), [[0, -3], [2, -1.5], [4, -1]])
    np.testing.assert_allclose(exp.from_env(exp.to_env(u)), u, atol=1e-6)


def test_ou_noise_follows_its_process_in_memory():
    exp = make("ddpg", noise="ou", noise_std=0.0, ou_theta=0.5, ou_dt=0.1)
    exp.updates = 1
    obs = np.zeros((2, PENDULUM_OBS), np.float32)
    mu, _ = exp.act(obs, {}, greedy=True)
    memory = {"ou": np.array([[0.5], [-0.25]], np.float32)}
    actions, memory = exp.act(obs, memory)
    np.testing.assert_allclose(memory["ou"], [[0.5 * 0.95], [-0.25 * 0.95]])  # the drift: x - theta x dt
    np.testing.assert_allclose(exp.from_env(actions), exp.from_env(mu) + memory["ou"], atol=1e-6)
    exp = make("ddpg", noise="ou", noise_std=0.3, ou_theta=0.5, ou_dt=0.04)
    exp.updates = 1
    _, memory = exp.act(np.zeros((4000, PENDULUM_OBS), np.float32), exp.initial_memory(4000))
    assert np.std(memory["ou"]) == pytest.approx(0.3 * 0.2, rel=0.05)  # the diffusion: s sqrt(dt) N(0, 1)
    assert exp.initial_memory(3)["ou"].shape == (3, 1) and not exp.initial_memory(3)["ou"].any()


class ShortEpisodes(cont.DDPG):
    """Real Pendulum episodes of 5 ticks."""

    def make_env(self, render_mode=None):
        return gym.make("Pendulum-v1", render_mode=render_mode, max_episode_steps=5)


def test_ou_state_is_kept_per_environment_and_reset_when_its_episode_ends(tmp_path):
    db = connect(f"sqlite:///{tmp_path / 'ou.db'}", "ou", retry_for=5)
    args = cont.Args(algo="ddpg", noise="ou", noise_std=0.5, net_arch="8,8", session_length=4, random_warmup=False)
    assert play(ShortEpisodes(db, args), db, batch_size=2, rounds=6) == 12
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
    eps = [w.clone() for w, _ in exp.param_eps]
    exp.act(obs, memory)
    assert all(torch.equal(e, w) for e, (w, _) in zip(eps, exp.param_eps, strict=True)), "kept within an episode"
    memory["fresh"][1] = exp.initial_memory(1)["fresh"][0]  # what the player does when env 1's episode ends
    exp.act(obs, memory)
    for e, (w, _) in zip(eps, exp.param_eps, strict=True):
        assert torch.equal(e[0], w[0]) and not torch.equal(e[1], w[1]), "redrawn for env 1 only"
    # sigma grows while the actions move less than the target distance, shrinks while they move more
    sigma = exp.param_sigma
    exp.noise_scale = 100.0
    for _ in range(10):
        exp.act(obs, memory)
    assert exp.param_sigma == pytest.approx(sigma * 1.01**10)
    exp.noise_scale = 0.0
    for _ in range(20):
        exp.act(obs, memory)
    assert exp.param_sigma == pytest.approx(sigma * 1.01**-10)
    assert exp.session_info() == {"noise": 0.0, "param_sigma": pytest.approx(sigma * 1.01**-10)}


def test_players_explore_at_their_own_scales(monkeypatch):
    assert make("td3").noise_scale == 0.1  # a lone player
    obs = np.zeros((4000, PENDULUM_OBS), np.float32)
    spreads = {}
    for index in (0, 3):
        monkeypatch.setenv("TINYVERSE_WORKER_INDEX", str(index))
        monkeypatch.setenv("TINYVERSE_WORKER_COUNT", "4")
        exp = make("td3", noise_std=0.1, noise_spread=2.0)
        exp.updates = 1
        assert exp.session_info() == {"noise": pytest.approx(0.1 * 2.0 ** (1 - 2 * index / 3))}
        greedy, _ = exp.act(obs, {}, greedy=True)
        noisy, _ = exp.act(obs, {})
        spreads[index] = np.std(exp.from_env(noisy) - exp.from_env(greedy))
    assert spreads[0] == pytest.approx(0.2, rel=0.1) and spreads[3] == pytest.approx(0.05, rel=0.1)
    assert make("sac").session_info()["noise"] == 0.0 and make("sac").session_info()["alpha"] == pytest.approx(1.0)
    monkeypatch.delenv("TINYVERSE_WORKER_INDEX")
    scales = {round(make("td3", noise_players=4).noise_scale, 9) for _ in range(40)}  # no index: one drawn at random
    assert scales <= {round(0.1 * 2 ** (1 - 2 * i / 3), 9) for i in range(4)} and len(scales) > 1


# -- the loops in-process, and the real file through the CLI ---------------------------------
@pytest.mark.parametrize("algo,noise", [("ddpg", "ou"), ("td3", "gaussian"), ("sac", "none"), ("naf", "param")])
def test_play_and_train_in_process(tmp_path, algo, noise):
    db = connect(f"sqlite:///{tmp_path / 't.db'}", "cont", retry_for=5)
    args = cont.Args(algo=algo, noise=noise, net_arch="16,16", session_length=8, learning_starts=0)
    assert play(cont.make_experiment(db, args), db, batch_size=2, rounds=2) == 4
    trainer = cont.make_experiment(db, args)
    assert train(trainer, db, batch_size=2, updates=3, save_every=2) >= 2
    assert trainer.updates == 3 and int(db.load_params()[1]["updates"]) == 3
    batch = db.sample_batch(4)
    assert batch["actions"].dtype == np.float32 and batch["actions"].shape == (4, 8, 1)
    assert (np.abs(batch["actions"]) <= 2).all() and (batch["info.noise"] == (0.0 if algo == "sac" else 0.1)).all()
    player = cont.make_experiment(db, args)
    play(player, db, batch_size=1, rounds=1)
    assert player.updates == 3  # the trained params reached it: it acts with the policy now
    db.close()


def test_cli_run_then_eval_with_video(tmp_path):
    url = f"sqlite:///{tmp_path / 'run.db'}"
    sets = ["net_arch=32,32", "learning_starts=500", "batch_sessions=4", "replay_ratio=0.25", "noise_std=0.2"]
    cli = [a for s in sets for a in ("--set", s)]
    out = run_cli(FILE, "run", "-n", 2000, "--players", 2, "--eval-episodes", 1, "--db", url, *cli, cwd=tmp_path)
    assert "run stopped: reached" in out.stdout and "mean return" in out.stdout, out.stdout + out.stderr
    db = connect(url, "continuous", retry_for=5)
    stored = db.setting("options")
    given = dict(net_arch="32,32", learning_starts=500, batch_sessions=4, replay_ratio=0.25, noise_std=0.2)
    assert stored == dataclasses.asdict(cont.Args(**given))  # the preset filled in the rest
    assert db.counter("updates") > 0 and db.params_version() >= 2
    assert db.load_params()[1]["updates"] > 0
    lo, hi = db.session_range()
    batch = db.get_batch(list(range(lo, hi + 1)))
    assert batch["actions"].dtype == np.float32 and batch["actions"].shape[1:] == (4, 1)
    assert (np.abs(batch["actions"]) <= 2).all()
    assert set(batch["info.noise"].tolist()) == {0.4, 0.1}  # players 0 and 1 of 2: noise_std x 2 and / 2
    db.close()
    ev = run_cli(FILE, "eval", "-n", 1, "--record", "videos", "--db", url, cwd=tmp_path, timeout=60)
    (video,) = (tmp_path / "videos").glob("*.mp4")
    assert video.read_bytes()[4:8] == b"ftyp" and str(video.relative_to(tmp_path)) in ev.stdout
    assert "mean return" in ev.stdout
