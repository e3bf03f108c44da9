"""The image-game wrappers on a real ALE game, V-trace by hand, and the Atari agent end to end (CPU, tiny budgets)."""

import math
import sys

import gymnasium as gym
import numpy as np
import pytest
from conftest import ROOT, _missing, optional, run_cli

from tinyverse.database import connect
from tinyverse.player import play

torch = optional("torch")  # the examples import it too
sys.path.insert(0, str(ROOT / "examples"))
import common  # noqa: E402
from wrappers import ActionSubset, Preprocess, window_indices  # noqa: E402

try:
    import ale_py

    gym.register_envs(ale_py)
except ImportError:
    ale_py = None

EXP = ROOT / "examples" / "atari.py"
PONG_FIELD = (34, 194, 0, 160)


@pytest.fixture(autouse=True)
def need_ale():
    # skipped on a developer machine without it, a failure in CI (the extras install ale-py)
    if ale_py is None:
        _missing("ale-py is not installed: pip install 'tinyverse[test]' (or pip install ale-py)")


def pong(**kwargs) -> gym.Env:
    """Deterministic Pong (no sticky actions) so that two copies stay in lockstep."""
    return gym.make("ALE/Pong-v5", repeat_action_probability=0.0, **kwargs)


def played_frame(env: gym.Env, steps: int = 60, seed: int = 0) -> np.ndarray:
    obs, _ = env.reset(seed=seed)
    for _ in range(steps):  # past the start screen: paddles and ball in the field
        obs, *_ = env.step(0)
    return obs


# -- Preprocess -----------------------------------------------------------------------------------------------------
def test_crop_keeps_the_chosen_rectangle_in_colour():
    env = Preprocess(pong(), crop=PONG_FIELD, size=None, grayscale=False)
    raw = played_frame(pong())
    obs = played_frame(env)
    assert env.observation_space.shape == obs.shape == (160, 160, 3)
    assert obs.dtype == np.uint8
    np.testing.assert_array_equal(obs, raw[34:194, 0:160])


def test_grayscale_matches_the_emulators_own_luminance():
    env = Preprocess(pong(), crop=PONG_FIELD, size=None)
    obs = played_frame(env)
    ale_gray = played_frame(pong(obs_type="grayscale"))[34:194]
    assert obs.shape == (160, 160) and obs.dtype == np.uint8
    assert np.abs(obs.astype(int) - ale_gray).max() <= 1
    assert len(np.unique(obs)) > 2, "the frame shows paddles, ball and field"


def area_mean(image: np.ndarray, size: tuple[int, int]) -> np.ndarray:
    """Reference area downscale: split every pixel into equal parts so that output pixels cover whole blocks."""
    for axis, n in enumerate(size):
        parts = math.lcm(image.shape[axis], n) // image.shape[axis]
        image = np.repeat(image, parts, axis)
        image = image.reshape(*image.shape[:axis], n, -1, *image.shape[axis + 1 :]).mean(axis + 1)
    return np.floor(image + 0.5)


@pytest.mark.parametrize("size", [(80, 80), (84, 84), (105, 80)])
def test_downscale_averages_the_area_each_pixel_covers(size):
    env = Preprocess(pong(), crop=PONG_FIELD, size=size)
    small = played_frame(env)
    full = played_frame(Preprocess(pong(), crop=PONG_FIELD, size=None))
    assert small.shape == env.observation_space.shape == size and small.dtype == np.uint8
    assert np.abs(small - area_mean(full.astype(float), size)).max() <= 1  # float32 vs float64 rounding


def test_the_whole_screen_downscales_to_84_by_its_area_weights():  # what any Atari game but Pong gets
    small = played_frame(Preprocess(pong(obs_type="grayscale"), size=(84, 84)))
    full = played_frame(pong(obs_type="grayscale")).astype(float)
    assert small.shape == (84, 84) and full.shape == (210, 160)
    assert np.abs(small - area_mean(full, (84, 84))).max() <= 1  # float32 vs float64 rounding


def test_grayscale_input_is_only_cropped_and_resized():
    env = Preprocess(pong(obs_type="grayscale"), crop=PONG_FIELD, size=(80, 80))
    obs = played_frame(env)
    full = played_frame(pong(obs_type="grayscale"))[34:194].astype(float)
    assert obs.shape == (80, 80)
    np.testing.assert_array_equal(obs, np.floor(full.reshape(80, 2, 80, 2).mean((1, 3)) + 0.5))


def test_upscaling_is_refused():
    with pytest.raises(AssertionError, match="downscale only"):
        Preprocess(pong(), crop=PONG_FIELD, size=(200, 80))


# -- ActionSubset -----------------------------------------------------------------------------------------------------
def test_action_subset_maps_names_to_the_games_actions():
    env = ActionSubset(pong(), ["NOOP", "RIGHT", "LEFT"])
    assert env.action_space == gym.spaces.Discrete(3)
    assert [env.action(i) for i in range(3)] == [0, 2, 3]  # Pong: NOOP, FIRE, RIGHT, LEFT, ...
    twin = pong()
    env.reset(seed=1)
    twin.reset(seed=1)
    for i in [1, 1, 1, 2, 2, 0] * 10:
        obs = env.step(i)[0]
        np.testing.assert_array_equal(obs, twin.step(env.action(i))[0])


def test_action_subset_by_ids_and_bad_names():
    assert ActionSubset(pong(), [3, 0]).action(0) == 3
    with pytest.raises(AssertionError, match="not one of this game's actions"):
        ActionSubset(pong(), ["NOOP", "JUMP"])


# -- the window of frames, kept as memory ---------------------------------------------------------------------------
def test_frame_memory_windows_are_the_last_frames_with_zeros_before_the_episode():
    from atari import FrameMemory

    size = (80, 80)
    single = gym.wrappers.TimeLimit(Preprocess(pong(), crop=PONG_FIELD, size=size), 5)
    fm = FrameMemory(4, size)
    obs, _ = single.reset(seed=4)
    memory, episode = fm.initial(1), [obs]
    for _ in range(12):
        window, memory = fm.push(obs[None], memory)
        assert window.shape == (1, 4, 80, 80) and window.dtype == np.uint8
        last = episode[-4:]  # the frames of this episode so far, zeros before its first
        expected = np.stack([np.zeros(size, np.uint8)] * (4 - len(last)) + last)
        np.testing.assert_array_equal(window[0], expected)
        obs, _, term, trunc, _ = single.step(2)
        episode.append(obs)
        if term or trunc:
            obs, _ = single.reset()
            memory, episode = fm.initial(1), [obs]
    assert len(episode) < 12, "an episode ended and the memory restarted with zeros"


@pytest.mark.parametrize("episode", [3, 7])
def test_trainer_rebuilds_every_window_the_player_acted_on(tmp_path, monkeypatch, episode):
    """The real player records sessions crossing episode ends; window_indices gets back its exact windows."""
    import atari

    db = connect(f"sqlite:///{tmp_path / 'w.db'}", "w")
    exp = atari.make_experiment(atari.Args(max_episode_steps=episode))
    seen = []
    act = exp.act
    monkeypatch.setattr(exp, "act", lambda o, m, greedy=False: (seen.append(exp.frames.push(o, m)[0]), act(o, m))[1])
    play(exp, db, batch_size=2, rounds=2, seed=0)
    seen = np.stack(seen, axis=1)  # (B, rounds x T, K, H, W)
    K, T = exp.args.window, exp.run.settings.session_length
    batch = db.get_batch([1, 2, 3, 4])
    assert batch["id"].tolist() == [1, 2, 3, 4]
    windows = exp.windows(batch)[0]  # the trainer's own gather: the same windows
    for n in range(4):
        s = {k: v[n] for k, v in batch.items()}  # ids 1, 2: round 0, envs 0, 1; ids 3, 4: round 1
        rnd, env = divmod(n, 2)
        term, trunc = s["terminated"][None], s["truncated"][None]
        assert trunc.sum() >= T // episode - 1 and not term.any()
        idx, final = window_indices(term, trunc, K)
        seq = np.concatenate([np.zeros_like(s["observations"][:1]), s["memory.frames"], s["observations"]])
        seq = np.concatenate([seq, s["final_observations"]])
        acted = seen[env, rnd * T : rnd * T + T]
        np.testing.assert_array_equal(seq[idx[0, :T]], acted)
        np.testing.assert_array_equal(windows[n, :T].numpy(), acted)
        if rnd == 0:  # the window after the last tick is the first of the next round
            np.testing.assert_array_equal(seq[idx[0, T]], seen[env, T])
        for t in np.nonzero(trunc[0])[0]:  # the episode's last window: what it saw, then its final frame
            expected = np.concatenate([acted[t, 1:], s["final_observations"][t][None]])
            np.testing.assert_array_equal(seq[final[0, t]], expected)
    db.close()


# -- V-trace ----------------------------------------------------------------------------------------------------------
def vtrace_of(behaviour, target, rewards, values, next_values, ended, gamma, rho_bar=1.0, c_bar=1.0, lam=1.0):
    t = (torch.tensor(np.asarray(x)[None]) for x in (behaviour, target, rewards, values, next_values, ended))
    vs, qs = common.vtrace(*t, gamma, rho_bar, c_bar, lam)
    return vs[0].numpy(), qs[0].numpy()


def test_vtrace_without_lag_is_the_n_step_return_to_the_sessions_end():
    # equal log-probabilities: every weight is 1 and v_s = r_s + g r_s+1 + ... + g^(T-s) V(x_T)
    gamma, rewards, values = 0.5, [1.0, 0.0, 2.0], [0.3, -0.2, 0.7]
    next_values = [-0.2, 0.7, 4.0]  # V(x_1), V(x_2), V(x_3): the session's bootstrap
    logp = np.log([0.2, 0.5, 0.9])
    vs, qs = vtrace_of(logp, logp, rewards, values, next_values, [False] * 3, gamma)
    np.testing.assert_allclose(vs, [1 + 0.25 * 2 + 0.125 * 4, 0 + 0.5 * 2 + 0.25 * 4, 2 + 0.5 * 4], rtol=1e-6)
    # the policy gradient's Q estimates: r_s + g v_s+1, with v_3 = V(x_3)
    np.testing.assert_allclose(qs, [1 + 0.5 * vs[1], 0 + 0.5 * vs[2], 2 + 0.5 * 4], rtol=1e-6)


def test_vtrace_with_lambda_is_the_lambda_return():
    # no lag, lambda 0.5: v_s = r_s + g ((1 - l) V(x_s+1) + l v_s+1), bootstrapped with V(x_T) at the end
    gamma, lam, rewards, values, next_values = 0.5, 0.5, [1.0, 0.0, 2.0], [0.3, -0.2, 0.7], [-0.2, 0.7, 4.0]
    logp = np.log([0.2, 0.5, 0.9])
    vs, _ = vtrace_of(logp, logp, rewards, values, next_values, [False] * 3, gamma, lam=lam)
    v2 = 2 + 0.5 * 4
    v1 = 0 + 0.5 * (0.5 * 0.7 + 0.5 * v2)
    v0 = 1 + 0.5 * (0.5 * -0.2 + 0.5 * v1)
    np.testing.assert_allclose(vs, [v0, v1, v2], rtol=1e-6)


def test_vtrace_cuts_at_terminations_and_bootstraps_truncations():
    gamma, rewards, values = 0.5, [1.0, 1.0, 1.0, 1.0], [0.1, 0.2, 0.3, 0.4]
    logp = np.zeros(4)
    # terminated at tick 1 (nothing follows: 0), a new episode from tick 2, truncated at tick 3 (V(final) = 8)
    ended, next_values = [False, True, False, True], [0.2, 0.0, 0.4, 8.0]
    vs, qs = vtrace_of(logp, logp, rewards, values, next_values, ended, gamma)
    np.testing.assert_allclose(vs, [1 + 0.5 * 1, 1, 1 + 0.5 * (1 + 0.5 * 8), 1 + 0.5 * 8], rtol=1e-6)
    np.testing.assert_allclose(qs[1], 1 + 0.5 * 0.0, rtol=1e-6)  # no target flows across the end
    np.testing.assert_allclose(qs[3], 1 + 0.5 * 8, rtol=1e-6)


def test_vtrace_clips_the_importance_weights():
    # tick 0: the current policy likes the action 3x more than the player did (clipped to 1);
    # tick 1: half as much (weight 0.5, not clipped); c_bar = 0.8 caps how much of tick 1 flows back
    gamma, rewards, values, next_values = 0.9, [1.0, 2.0], [0.5, 1.5], [1.5, 3.0]
    behaviour, target = np.log([0.2, 0.6]), np.log([0.6, 0.3])
    vs, qs = vtrace_of(behaviour, target, rewards, values, next_values, [False, False], gamma, 1.0, 0.8)
    d0, d1 = 1.0 * (1 + 0.9 * 1.5 - 0.5), 0.5 * (2 + 0.9 * 3.0 - 1.5)
    np.testing.assert_allclose(vs, [0.5 + d0 + 0.9 * 0.8 * d1, 1.5 + d1], rtol=1e-6)
    np.testing.assert_allclose(qs, [1 + 0.9 * vs[1], 2 + 0.9 * 3.0], rtol=1e-6)


def test_targets_without_vtrace_ignore_the_players_policy():
    """``vtrace=False``: the targets are the on-policy n-step returns (as PPO's advantages) however the players'
    log-probabilities differ from the trainer's; the ratios are still measured and returned."""
    import atari

    targets = common.appo_targets
    a = atari.Args(vtrace=False, gamma=0.5)
    rewards, values, next_values = [[1.0, 0.0, 2.0]], [[0.3, -0.2, 0.7, 9.0]], [[-0.2, 0.7, 4.0]]
    logp, recorded = torch.log(torch.tensor([[0.2, 0.5, 0.9]])), torch.log(torch.tensor([[0.6, 0.25, 0.9]]))
    ticks = (logp, recorded, *map(torch.tensor, (values, next_values, rewards)), torch.zeros(1, 3, dtype=bool))
    vs, advantages, ratios, metrics = targets(*ticks, a)
    returns = [1 + 0.25 * 2 + 0.125 * 4, 0 + 0.5 * 2 + 0.25 * 4, 2 + 0.5 * 4]  # as with no lag at all
    np.testing.assert_allclose(vs[0].numpy(), returns, rtol=1e-6)
    q = [1 + 0.5 * returns[1], 0 + 0.5 * returns[2], 2 + 0.5 * 4]
    np.testing.assert_allclose(advantages[0].numpy(), np.subtract(q, [0.3, -0.2, 0.7]), rtol=1e-6)
    np.testing.assert_allclose(ratios[0].numpy(), [1 / 3, 2, 1], rtol=1e-6)
    assert metrics["rho_clipped"] == pytest.approx(1 / 3)
    a.vtrace = True  # with it, the same ticks weigh tick 0's TD error by 1/3: the targets differ
    assert not torch.allclose(targets(*ticks, a)[0], vs)


def test_vtrace_matches_the_papers_sum_on_random_sessions():
    """v_s = V(x_s) + sum_t g^(t-s) (c_s ... c_t-1) rho_t delta_t within each episode (Espeholt et al., eq. 1)."""
    rng = np.random.default_rng(0)
    T, gamma, rho_bar, c_bar = 12, 0.9, 1.0, 0.9
    rewards, values, final = rng.normal(size=T), rng.normal(size=T + 1), rng.normal(size=T)
    behaviour, target = np.log(rng.uniform(0.1, 1, T)), np.log(rng.uniform(0.1, 1, T))
    terminated, truncated = np.zeros(T, bool), np.zeros(T, bool)
    terminated[3], truncated[8] = True, True
    next_values = values[1:].copy()
    next_values[truncated], next_values[terminated] = final[truncated], 0.0
    ratio = np.exp(target - behaviour)
    rho, c = np.minimum(rho_bar, ratio), np.minimum(c_bar, ratio)
    delta = rho * (rewards + gamma * next_values - values[:T])
    expected = np.zeros(T)
    for start, end in [(0, 4), (4, 9), (9, T)]:
        for s in range(start, end):
            expected[s] = values[s] + sum(gamma ** (t - s) * np.prod(c[s:t]) * delta[t] for t in range(s, end))
    ended = terminated | truncated
    vs, _ = vtrace_of(behaviour, target, rewards, values[:T], next_values, ended, gamma, rho_bar, c_bar)
    np.testing.assert_allclose(vs, expected, rtol=1e-5)


def test_train_step_runs_on_uint8_sessions_and_changes_the_params(tmp_path):
    import atari

    db = connect(f"sqlite:///{tmp_path / 't.db'}", "t")
    exp = atari.make_experiment(atari.Args(max_episode_steps=9))
    play(exp, db, batch_size=2, rounds=2, seed=0)
    batch = db.get_batch([1, 2, 3, 4])
    assert batch["observations"].dtype == np.uint8 and batch["observations"].shape[1:] == (26, 80, 80)
    assert exp.sample(db, 5) == {}  # not enough sessions yet: "not yet", at once (the loop waits, not sample)

    before = exp.get_params()
    exp.prepare_training()
    assert exp.device.type == ("cuda" if torch.cuda.is_available() else "cpu")
    batch = exp.sample(db, 4)
    assert batch["outputs.logp"].shape == (4, 25) and (batch["outputs.logp"] <= 0).all(), "the players' log-probs"
    metrics = exp.train_step(batch)
    assert all(np.isfinite(v) for v in metrics.values()) and metrics["entropy"] > 1.0  # ~log 3 at first
    # the same params acted and trained: every importance weight is 1 (up to float error)
    assert metrics["rho_mean"] == pytest.approx(1.0, abs=1e-4) and metrics["policy_lag"] == 0
    after = exp.get_params()
    assert any(not np.array_equal(before[k], after[k]) for k in before)
    assert all(v.dtype == before[k].dtype and v.shape == before[k].shape for k, v in after.items())
    db.close()


@pytest.mark.parametrize("net", ["a3c", "nature"])
def test_the_channels_last_net_computes_what_the_plain_layout_does(net):
    """The torso runs NHWC for speed; its outputs, grads and stored params are those of the usual NCHW net."""
    import atari

    torch.manual_seed(0)
    fast = atari.ActorCritic(net, 4, 80, 3)
    conv = next(m for m in fast.torso if isinstance(m, torch.nn.Conv2d))
    assert conv.weight.is_contiguous(memory_format=torch.channels_last) and not conv.weight.is_contiguous()
    params = {k: v.detach().numpy().copy() for k, v in fast.state_dict().items()}
    assert all(v.flags.c_contiguous for v in params.values()), "stored params are plain C arrays"

    plain = torch.nn.Sequential(*(torch.nn.Conv2d(m.in_channels, m.out_channels, m.kernel_size, m.stride)
                                  if isinstance(m, torch.nn.Conv2d) else m for m in fast.torso))  # fmt: skip
    names = [f"torso.{k}" for k in plain.state_dict()]
    plain.load_state_dict({k: torch.from_numpy(params[n]) for k, n in zip(plain.state_dict(), names, strict=True)})
    frames = torch.randint(0, 256, (6, 4, 80, 80), dtype=torch.uint8)
    hidden = plain(frames.float() / 255.0)
    logits, values = fast(frames)
    torch.testing.assert_close(logits, fast.policy(hidden))
    torch.testing.assert_close(values, fast.value(hidden).squeeze(-1))
    values.sum().backward()
    fast.value(plain(frames.float() / 255.0)).sum().backward()
    torch.testing.assert_close(conv.weight.grad, plain[0].weight.grad)


@pytest.mark.parametrize(
    "options", [{}, {"clip": 0.0}, {"clip": 0.0, "vtrace": False, "normalize_advantages": False}], ids=str
)
def test_every_policy_loss_trains(tmp_path, options):
    """APPO's clipped surrogate (default), IMPALA's weighted policy gradient, and plain A2C (no correction)."""
    import atari

    db = connect(f"sqlite:///{tmp_path / 'l.db'}", "l")
    exp = atari.make_experiment(atari.Args(max_episode_steps=9, **options))
    play(exp, db, batch_size=2, rounds=2, seed=0)
    exp.prepare_training()
    batch = exp.sample(db, 4)
    batch["outputs.logp"] = batch["outputs.logp"] - 0.5  # the players' policy liked these actions less: lag
    before = exp.get_params()
    metrics = exp.train_step(batch)
    assert all(np.isfinite(v) for v in metrics.values())
    assert metrics["rho_mean"] == pytest.approx(np.exp(0.5), rel=1e-3) and metrics["rho_clipped"] == 1.0
    assert any(not np.array_equal(before[k], v) for k, v in exp.get_params().items())
    db.close()


def test_input_normalization_keeps_each_pixels_statistics_and_they_travel_with_the_params(tmp_path):
    """normalize_input: the trainer folds the frames it trains on into per-pixel running statistics (equal to
    those of all the frames at once), the net sees (x / 255 - mean) / std clipped to +-5, players get the
    statistics in the params; without the option the params are the net's alone, as stored runs have them. On by
    default on Atari games, off on CarRacing (measured without it)."""
    import atari

    db = connect(f"sqlite:///{tmp_path / 'n.db'}", "n")
    exp = atari.make_experiment(atari.Args(max_episode_steps=9, normalize_input=True))
    play(exp, db, batch_size=2, rounds=2, seed=0)
    exp.prepare_training()
    batches = [db.get_batch([1, 2]), db.get_batch([3, 4])]
    for batch in batches:
        exp.train_step(batch)
    frames = np.concatenate([b["observations"].reshape(-1, 80, 80) for b in batches]) / 255.0
    net = exp.net
    np.testing.assert_allclose(net.pixel_mean.numpy(), frames.mean(0), atol=1e-12)
    np.testing.assert_allclose(net.pixel_var.numpy(), frames.var(0), atol=1e-12)
    assert net.pixel_count.item() == len(frames) and frames.var(0).max() > 0, "Pong's ball and paddles move"

    window = torch.from_numpy(batches[0]["observations"][:2, :4].copy())  # two windows of 4 frames
    std = np.sqrt(net.pixel_var.numpy() + 1e-5)
    seen = np.clip((window.numpy() / 255.0 - net.pixel_mean.numpy()) / std, -5, 5)
    plain = atari.ActorCritic("a3c", 4, 80, 3)
    plain.load_state_dict({k: v for k, v in net.state_dict().items() if not k.startswith("pixel_")})
    hidden = plain.torso(torch.from_numpy(seen).float())
    torch.testing.assert_close(net(window)[0], plain.policy(hidden), rtol=1e-4, atol=1e-5)

    player = atari.make_experiment(atari.Args(max_episode_steps=9, normalize_input=True))
    player.set_params(exp.get_params())
    torch.testing.assert_close(player.net(window)[0], net(window)[0])
    assert {"pixel_mean", "pixel_var", "pixel_count"} <= set(exp.get_params())
    plain_params = atari.make_experiment(atari.Args(normalize_input=False)).get_params()
    assert not any(k.startswith("pixel_") for k in plain_params)
    with pytest.raises(AssertionError, match="--set normalize_input=false"):  # a run stored before the default
        player.set_params(plain_params)
    assert atari.Args().normalize_input and not atari.Args(env_id="CarRacing-v3").normalize_input, "the games' own"
    db.close()


def test_rewards_train_scaled_unless_clipped(tmp_path):
    """reward_scale s on rewards r trains as r x s does; clipped rewards ignore the scale."""
    import atari

    db = connect(f"sqlite:///{tmp_path / 's.db'}", "s")
    play(atari.make_experiment(atari.Args(max_episode_steps=9)), db, batch_size=2, rounds=2, seed=0)
    batch = db.get_batch([1, 2, 3, 4])
    batch["rewards"] = np.random.default_rng(0).normal(0, 5, batch["rewards"].shape).astype(np.float32)
    # no advantage normalisation: a scale would cancel in it; the value loss shows it too
    options = dict(max_episode_steps=9, clip_rewards=False, normalize_advantages=False)

    def value_loss(scale, rewards, clip=False):
        torch.manual_seed(0)
        exp = atari.make_experiment(atari.Args(**options | dict(reward_scale=scale, clip_rewards=clip)))
        exp.prepare_training()
        return exp.train_step(batch | {"rewards": rewards})["value_loss"]

    scaled = value_loss(0.1, batch["rewards"])
    assert scaled == pytest.approx(value_loss(1.0, batch["rewards"] * 0.1), rel=1e-4)
    assert scaled != pytest.approx(value_loss(1.0, batch["rewards"]), rel=1e-2)
    assert value_loss(0.1, batch["rewards"], clip=True) == pytest.approx(value_loss(1.0, batch["rewards"], clip=True))
    db.close()


def test_the_surrogate_by_hand():
    """PPO's clipped surrogate, the value loss and the entropy on two ticks computed by hand."""
    import atari

    a = atari.Args(clip=0.1, normalize_advantages=False, vf_coef=0.5, ent_coef=0.01)
    logp_all = torch.log(torch.full((2, 3), 1 / 3))  # uniform over 3 actions: entropy log 3
    recorded = torch.log(torch.tensor([1 / 3 / 1.5, 1 / 3 / 0.5]))  # ratios 1.5 and 0.5
    values, vs, advantages = torch.tensor([0.0, 1.0]), torch.tensor([1.0, 3.0]), torch.tensor([2.0, -2.0])
    total, m = common.appo_surrogate(logp_all, logp_all[:, 0], recorded, values, vs, advantages, a)
    # min(1.5 x 2, 1.1 x 2) = 2.2; min(0.5 x -2, 0.9 x -2) = -1.8; value loss 0.5 x (1 + 4) / 2
    assert m["pg_loss"] == pytest.approx(-(2.2 - 1.8) / 2) and m["value_loss"] == pytest.approx(1.25)
    assert m["entropy"] == pytest.approx(math.log(3)) and total.item() == pytest.approx(
        -0.2 + 0.625 - 0.01 * math.log(3)
    )
    assert m["clip_fraction"] == 1.0  # both ratios outside 1 +- 0.1
    m = common.appo_surrogate(logp_all, logp_all[:, 0], logp_all[:, 0], values, vs, advantages, a)[1]
    assert m["clip_fraction"] == 0.0  # on-policy: every ratio 1
    # normalized over these ticks: [2, -2] / std 2 sqrt 2 = [1, -1] / sqrt 2
    a.normalize_advantages = True
    m = common.appo_surrogate(logp_all, logp_all[:, 0], recorded, values, vs, advantages, a)[1]
    assert m["pg_loss"] == pytest.approx(-(1.1 - 0.9) / 2 / math.sqrt(2))


def test_bfloat16_trains_what_float32_does(tmp_path):
    """bfloat16 autocast computes the same update to bfloat16's precision: the same losses within 5%, the
    params moved in the same direction; the params the players get stay float32."""
    import atari

    db = connect(f"sqlite:///{tmp_path / 'b.db'}", "b")
    play(atari.make_experiment(atari.Args(max_episode_steps=9)), db, batch_size=2, rounds=2, seed=0)
    batch = db.get_batch([1, 2, 3, 4])
    steps = {}
    for bf16 in (False, True):
        torch.manual_seed(0)
        exp = atari.make_experiment(atari.Args(max_episode_steps=9, bfloat16=bf16))
        exp.prepare_training()
        before, dtypes = exp.get_params(), set()
        exp.net.torso.register_forward_hook(lambda m, inputs, out, seen=dtypes: seen.add(out.dtype))
        metrics = exp.train_step(batch)
        after = exp.get_params()
        assert dtypes == {torch.bfloat16 if bf16 else torch.float32}  # the torso's work, in the chosen type
        assert all(v.dtype == (np.float64 if k.startswith("pixel_") else np.float32) for k, v in after.items())
        steps[bf16] = metrics, np.concatenate([(after[k] - before[k]).ravel() for k in before])
    (m32, d32), (m16, d16) = steps[False], steps[True]
    for key in ("loss", "value_loss", "entropy", "value", "grad_norm"):  # not pg_loss: ~0 (normalized advantages)
        assert m16[key] == pytest.approx(m32[key], rel=0.05), key
    assert np.dot(d16, d32) / (np.linalg.norm(d16) * np.linalg.norm(d32)) > 0.99
    db.close()


def test_the_reuse_bound_is_a_pace():
    """Each update samples train_batch_size sessions of session_length ticks: max_reuse uses of each."""
    import atari

    exp = atari.make_experiment(atari.Args(max_reuse=4.0, recent_sessions=64))
    s = exp.run.settings
    assert s.updates_per_step == pytest.approx(4.0 / (s.train_batch_size * s.session_length))
    assert (s.learning_starts, s.pace_slack) == (0, 32 * s.session_length)


def test_another_game_needs_no_option_but_its_id():
    import atari

    exp = atari.make_experiment(atari.Args(env_id="ALE/Boxing-v5"))  # all its 18 actions, the whole screen
    env = exp.make_env()
    assert (exp.args.actions, exp.args.crop, exp.args.size) == ("all", "0,210,0,160", 84)
    assert env.action_space.n == 18 == exp.net.policy.out_features and env.observation_space.shape == (84, 84)
    assert env.reset(seed=0)[0].shape == (84, 84)
    pong = [atari.Args(env_id=i) for i in ("ALE/Pong-v5", "PongNoFrameskip-v4")]  # Pong keeps its own defaults
    assert {(a.actions, a.crop, a.size) for a in pong} == {("NOOP,RIGHT,LEFT", "34,194,0,160", 80)}


def test_the_game_and_its_actions_are_options():
    import atari

    exp = atari.make_experiment(atari.Args(env_id="ALE/Breakout-v5", actions="NOOP,FIRE,RIGHT,LEFT", size=42))
    env = exp.make_env()
    assert env.action_space.n == 4 and env.observation_space.shape == (42, 42)
    assert env.unwrapped.get_action_meanings()[:4] == ["NOOP", "FIRE", "RIGHT", "LEFT"]
    assert exp.net.policy.out_features == 4
    env = atari.make_experiment(atari.Args(env_id="ALE/Breakout-v5", actions="2,3")).make_env()
    assert env.get_wrapper_attr("ids").tolist() == [2, 3]  # ids work as names do
    with pytest.raises(AssertionError, match="not one of this game's actions"):
        atari.make_experiment(atari.Args(actions="NOOP,JUMP")).make_env()


def test_fast_car_racing_draws_the_stock_frames():
    import racing

    stock, fast = gym.make("CarRacing-v3", continuous=False).unwrapped, racing.FastCarRacing(continuous=False)
    a, _ = stock.reset(seed=3)
    b, _ = fast.reset(seed=3)
    np.testing.assert_array_equal(a, b)  # the zoomed-out first frame
    rng, diffs = np.random.default_rng(0), []
    for _ in range(12):
        action = int(rng.integers(5))
        (a, ra, *_), (b, rb, *_) = stock.step(action), fast.step(action)
        assert ra == rb
        diffs.append(np.abs(a.astype(int) - b))
    # the same polygons, a rounding apart at some edges: (up to 5 levels, on well under 1% of the pixels)
    assert max(d.mean() for d in diffs) < 0.05 and max(d.max() for d in diffs) <= 8
    stock.close()
    fast.close()


class RepeatAction(gym.Wrapper):
    """The stock way to repeat an action: ``skip`` steps, rewards summed, stopped at the episode's end."""

    def __init__(self, env: gym.Env, skip: int):
        super().__init__(env)
        self.skip = skip
        self.metadata = {**env.metadata, "render_fps": max(1, round(env.metadata["render_fps"] / skip))}

    def step(self, action):
        total = 0.0
        for _ in range(self.skip):
            obs, reward, terminated, truncated, info = self.env.step(action)
            total += float(reward)
            if terminated or truncated:
                break
        return obs, total, terminated, truncated, info


def test_fast_car_racing_repeats_actions_as_the_stock_env_under_a_repeat_wrapper():
    import racing

    stock = RepeatAction(gym.make("CarRacing-v3", continuous=False).unwrapped, 4)
    fast = racing.FastCarRacing(4, continuous=False)
    assert fast.metadata["render_fps"] == stock.metadata["render_fps"]
    a, _ = stock.reset(seed=5)
    b, _ = fast.reset(seed=5)
    np.testing.assert_array_equal(a, b)
    rng = np.random.default_rng(1)
    for _ in range(10):  # the frame drawn after each repeat is the stock env's, whose frames in between it skips
        action = int(rng.integers(5))
        (a, ra, ta, *_), (b, rb, tb, *_) = stock.step(action), fast.step(action)
        assert ra == pytest.approx(rb) and ta == tb
        assert np.abs(a.astype(int) - b).mean() < 0.05
    assert fast.t == pytest.approx(stock.unwrapped.t) == pytest.approx(41 / 50)  # reset's frame and 40 more, at 50 fps
    stock.close()
    fast.close()


def test_the_racing_game_goes_through_the_same_learner():
    import atari

    exp = atari.make_experiment(atari.Args(env_id="CarRacing-v3"))
    assert (exp.args.size, exp.args.noop_max, exp.args.clip_rewards, exp.args.reward_scale) == (42, 0, False, 0.1)
    assert atari.Args().crop == "34,194,0,160" and atari.Args().clip_rewards  # Atari's unchanged
    import racing

    env = exp.make_env()
    assert isinstance(env.unwrapped, racing.FastCarRacing)  # racing.py: the game's env, drawn fast
    obs, _ = env.reset(seed=0)
    assert env.action_space.n == 5 and obs.shape == (42, 42) and obs.dtype == np.uint8
    rewards = [env.step(3)[1] for _ in range(3)]  # gas: 4 frames an agent step, -0.1 a frame, summed
    assert all(-0.41 < r < 40 for r in rewards) and any(r != 0 for r in rewards)
    actions, memory, outputs = exp.act(obs[None], exp.initial_memory(1))
    assert actions.shape == (1,) and 0 <= actions[0] < 5 and outputs["logp"].shape == (1,)
    env.close()


# -- end to end through the CLI ---------------------------------------------------------------------------------------
def test_pong_play_train_eval_with_video(tmp_path):
    import imageio.v2 as imageio

    env = {"TINYVERSE_DEVICE": "cpu"}
    url = ["--db", f"sqlite:///{tmp_path / 'pong.db'}"]
    run_cli(EXP, "play", "-n", 2, "-b", 2, *url, "--set", "max_episode_steps=40", cwd=tmp_path, env=env, timeout=60)
    train = run_cli(EXP, "train", "-n", 2, "-b", 4, *url, cwd=tmp_path, env=env, timeout=60)
    assert "stopped after 2 updates" in train.stderr
    ev = run_cli(EXP, "eval", "-n", 1, "--record", "videos", *url, cwd=tmp_path, env=env, timeout=60)
    assert "mean return" in ev.stdout
    (video,) = (tmp_path / "videos").glob("*.mp4")
    reader = imageio.get_reader(video)
    frames = [f for f in reader]
    assert len(frames) == 41, "the first frame and one per agent step"
    assert frames[0].shape == (210, 160, 3) and frames[-1].std() > 0, "real game frames in colour"
    assert reader.get_meta_data()["fps"] == 15


def test_run_with_two_players(tmp_path):
    env = {"TINYVERSE_DEVICE": "cpu"}
    db_path = tmp_path / "run.db"
    # one player alone passed 1,200 env steps before the other stored a session: 600 let it stop the run alone
    args = ["run", "--players", 2, "-n", 4000, "--train-batch", 4, "--eval-episodes", 1]
    # each tick trained on once: the pace's 8 held a run on 2 busy cores (CI's) to 40 env steps a second
    args += ["--set", "max_episode_steps=40", "--set", "max_reuse=1"]
    out = run_cli(EXP, *args, "--db", f"sqlite:///{db_path}", cwd=tmp_path, env=env, timeout=120)
    assert "run stopped: reached" in out.stdout, out.stdout + out.stderr
    assert "mean return" in out.stdout
    db = connect(f"sqlite:///{db_path}", "atari")
    lo, hi = db.session_range()
    workers = set(db.get_batch(list(range(lo, hi + 1)))["worker"].tolist())
    assert len(workers) == 2, "both players recorded sessions"
    assert db.params_version() is not None
    db.close()
