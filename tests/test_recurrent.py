"""The recurrent agent: memory stored and reset on both backends, the unroll by hand and against the players,
masked CartPole and ViZDoom wrappers, and both games end to end through the CLI (CPU, tiny budgets)."""

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
import recurrent  # noqa: E402
from recurrent import DoomScreen, Flicker, ObservationSubset  # noqa: E402

EXP = ROOT / "examples" / "recurrent.py"
CPU = {"TINYVERSE_DEVICE": "cpu"}


@pytest.fixture(autouse=True)
def on_cpu(monkeypatch):
    monkeypatch.setenv("TINYVERSE_DEVICE", "cpu")


def need_vizdoom(monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)  # ViZDoom writes its _vizdoom.ini into the working directory
    # skipped on a developer machine without it, a failure in CI (the extras install ViZDoom, engine included)
    try:
        from vizdoom import gymnasium_wrapper  # noqa: F401
    except ImportError:
        _missing("vizdoom is not installed: pip install vizdoom")


class Spy:
    """Wraps ``act``: the hidden state each call got (after the player's resets) and returned, per tick."""

    def __init__(self, exp):
        self.act, self.h_in, self.h_out = exp.act, [], []
        exp.act = self

    def __call__(self, observations, memory, greedy=False):
        self.h_in.append(memory["h"].copy())
        actions, memory, outputs = self.act(observations, memory, greedy)
        self.h_out.append(memory["h"].copy())  # before the player resets the envs whose episode ended
        return actions, memory, outputs


# -- the unroll by hand -----------------------------------------------------------------------------------------------
def half_tanh_gru() -> torch.nn.GRUCell:
    """A 1-unit GRU with h' = tanh(x) / 2 + h / 2: both gates are sigmoid(0) = 1/2, the candidate is tanh(x)."""
    cell = torch.nn.GRUCell(1, 1)
    with torch.no_grad():
        for p in cell.parameters():
            p.zero_()
        cell.weight_ih[2, 0] = 1.0  # rows: reset gate, update gate, candidate
    return cell


def test_unroll_from_the_stored_state_by_hand():
    cell = half_tanh_gru()
    x = torch.atanh(torch.tensor([0.8, 0.4, -0.4, 0.2]))  # tanh(x) = 0.8, 0.4, -0.4, 0.2
    features = x[None, :, None].repeat(2, 1, 1)  # two sessions of T = 3 ticks (4 observations)
    h0 = torch.tensor([[0.6], [0.6]])  # the state stored before tick 0
    ended = torch.tensor([[False, True, False], [False, False, False]])  # session 0: an episode ends at tick 1
    states = recurrent.unroll(cell, features, h0, ended)[..., 0]
    # h_0 = 0.4 + 0.3; h_1 = 0.2 + 0.35; session 0 resets to 0 before tick 2: h_2 = -0.2 + 0, h_3 = 0.1 - 0.1
    np.testing.assert_allclose(states[0].detach().numpy(), [0.7, 0.55, -0.2, 0.0], atol=1e-6)
    # without the end, tick 2 carries the memory on: -0.2 + 0.275, then 0.1 + 0.0375
    np.testing.assert_allclose(states[1].detach().numpy(), [0.7, 0.55, 0.075, 0.1375], atol=1e-6)


def test_burn_in_warms_the_state_without_a_gradient():
    cell = half_tanh_gru()
    features = torch.full((1, 5, 1), 0.3, requires_grad=True)
    h0 = torch.tensor([[0.6]], requires_grad=True)
    ended = torch.zeros(1, 4, dtype=torch.bool)
    plain = recurrent.unroll(cell, features, h0, ended)
    burnt = recurrent.unroll(cell, features, h0, ended, burn_in=2)
    torch.testing.assert_close(plain, burnt)  # the same states...
    burnt.sum().backward()
    assert h0.grad is None, "no gradient reaches the stored state through the burn-in"
    grad = features.grad[0, :, 0]
    assert (grad[:2] == 0).all() and (grad[2:] > 0).all(), grad  # ...but only ticks 2.. are trained


# -- memory stored and reset, replayed by the trainer -----------------------------------------------------------------
def test_memory_is_stored_at_session_start_and_reset_at_episode_ends(db):
    torch.manual_seed(0)  # the players' draws: episodes that end by falling and by time (16 steps)
    exp = recurrent.make_experiment(recurrent.Args(max_episode_steps=16))
    spy = Spy(exp)
    rounds, B, T = 3, 2, exp.run.settings.session_length
    assert play(exp, db, batch_size=B, rounds=rounds, seed=0) == rounds * B
    batch = db.get_batch(list(range(1, rounds * B + 1)))
    assert batch["memory.h"].shape == (rounds * B, 64) and batch["memory.h"].dtype == np.float32
    ended = (batch["terminated"] | batch["truncated"]).reshape(rounds, B, T).transpose(1, 0, 2).reshape(B, -1)
    assert batch["terminated"].any() and (batch["truncated"] & ~batch["terminated"]).any()
    for n in range(rounds * B):  # ids 1, 2: round 0, envs 0, 1; ids 3, 4: round 1 ...
        r, i = divmod(n, B)
        np.testing.assert_array_equal(batch["memory.h"][n], spy.h_in[r * T][i])  # the state the session began with
    assert not batch["memory.h"][:B].any() and batch["memory.h"][B:].any()  # zeros at the start, then carried
    for g in range(1, rounds * T):
        for i in range(B):
            if ended[i, g - 1]:  # a new episode starts from zeros...
                assert not spy.h_in[g][i].any()
            else:  # ...any other tick from the state the last one returned, also across sessions
                np.testing.assert_array_equal(spy.h_in[g][i], spy.h_out[g - 1][i])

    # the trainer's unroll from the stored states recomputes every state and log-probability the players had
    exp.prepare_training()
    logits, values, next_values, states = exp.forward(batch)
    for n in range(rounds * B):
        r, i = divmod(n, B)
        acted = np.stack([spy.h_out[r * T + t][i] for t in range(T + (r < rounds - 1))])
        np.testing.assert_allclose(states[n, : len(acted)].detach().numpy(), acted, atol=1e-5)
    logp = logits[:, :T].log_softmax(-1).gather(-1, torch.from_numpy(batch["actions"])[..., None])[..., 0]
    np.testing.assert_allclose(logp.detach().numpy(), batch["outputs.logp"], atol=1e-5)
    # a truncated episode bootstraps from one more tick on its final observation, from the state it ended in
    b, t = np.nonzero(batch["truncated"] & ~batch["terminated"])
    final = exp.net.encode(torch.from_numpy(batch["final_observations"][b, t])[:, None])
    expected = exp.net.heads(exp.net.step(final, states[b, t]))[1]
    torch.testing.assert_close(next_values[b, t], expected.detach())
    assert (next_values[torch.from_numpy(batch["terminated"])] == 0).all()


@pytest.mark.parametrize("net,window", [("ff", 1), ("ff", 3), ("gru", 3)])
def test_the_trainer_replays_what_the_players_saw(tmp_path, net, window):
    """Windows of past observations (memory.frames) with or without a GRU: the recorded log-probabilities again."""
    db = connect(f"sqlite:///{tmp_path / 'w.db'}", "w")
    exp = recurrent.make_experiment(recurrent.Args(net=net, window=window, max_episode_steps=9))
    play(exp, db, batch_size=2, rounds=2, seed=1)
    batch = db.get_batch([1, 2, 3, 4])
    assert ("memory.frames" in batch) == (window > 1) and ("memory.h" in batch) == (net == "gru")
    if window > 1:
        assert batch["memory.frames"].shape == (4, window - 1, 2) and batch["observations"].shape == (4, 26, 2)
    exp.prepare_training()
    logits = exp.forward(batch)[0]
    logp = logits[:, :-1].log_softmax(-1).gather(-1, torch.from_numpy(batch["actions"])[..., None])[..., 0]
    np.testing.assert_allclose(logp.detach().numpy(), batch["outputs.logp"], atol=1e-5)
    db.close()


@pytest.mark.parametrize("burn_in", [0, 5])
def test_train_step_trains_and_measures_the_lag(tmp_path, burn_in):
    db = connect(f"sqlite:///{tmp_path / 't.db'}", "t")
    exp = recurrent.make_experiment(recurrent.Args(burn_in=burn_in))
    play(exp, db, batch_size=4, rounds=2, seed=0)
    exp.prepare_training()
    assert exp.sample(db, 16) == {}, "too few sessions yet: 'not yet', at once"
    batch = exp.sample(db, 8)
    before = exp.get_params()
    metrics = exp.train_step(batch)
    assert all(np.isfinite(v) for v in metrics.values())
    # the params that acted are the params that trained: every ratio is 1, the first tick's too
    assert metrics["policy_lag"] == 0 and metrics["rho_mean"] == pytest.approx(1.0, abs=1e-4)
    assert metrics["rho_dev_first"] < 1e-4 and metrics["rho_dev_rest"] < 1e-4
    assert all(not np.array_equal(before[k], v) for k, v in exp.get_params().items())
    again = exp.train_step(batch)
    assert again["rho_dev_rest"] > 1e-4, "after an update the players' probabilities are off the trainer's"
    db.close()


def test_the_pace_and_the_presets():
    exp = recurrent.make_experiment(recurrent.Args())
    s = exp.run.settings
    assert s.updates_per_step == pytest.approx(8.0 / (16 * 25)) and s.pace_slack == 32 * 25
    assert exp.make_env().observation_space.shape == (2,) and exp.args.reward_scale == 0.1
    assert exp.initial_memory(3)["h"].shape == (3, 64)
    assert recurrent.make_experiment(recurrent.Args(net="ff")).initial_memory(3) == {}
    full = recurrent.make_experiment(recurrent.Args(keep="all"))
    assert full.make_env().observation_space.shape == (4,)


def test_vtrace_is_the_papers_sum_within_each_episode():
    rng = np.random.default_rng(3)
    T, gamma, lam = 10, 0.9, 0.8
    rewards, values, next_values = rng.normal(size=T), rng.normal(size=T), rng.normal(size=T)
    behaviour, target = np.log(rng.uniform(0.1, 1, T)), np.log(rng.uniform(0.1, 1, T))
    ended = np.zeros(T, bool)
    ended[4] = True
    ratio = np.exp(target - behaviour)
    rho, c = np.minimum(1, ratio), lam * np.minimum(1, ratio)
    delta = rho * (rewards + gamma * next_values - values)
    expected = np.array([
        values[s] + sum(gamma ** (t - s) * np.prod(c[s:t]) * delta[t] for t in range(s, 5 if s < 5 else T))
        for s in range(T)
    ])  # fmt: skip
    t = (torch.tensor(x[None]) for x in (behaviour, target, rewards, values, next_values, ended))
    vs, qs = common.vtrace(*t, gamma, lam=lam)
    np.testing.assert_allclose(vs[0].numpy(), expected, rtol=1e-6)
    assert qs[0, 4].item() == pytest.approx(rewards[4] + gamma * next_values[4])  # nothing across the end
    assert qs[0, 3].item() == pytest.approx(rewards[3] + gamma * expected[4])


# -- wrappers ---------------------------------------------------------------------------------------------------------
def test_masked_cartpole_sees_position_and_angle_only():
    env = ObservationSubset(gym.make("CartPole-v1"), [0, 2])
    assert env.observation_space.shape == (2,) and env.observation_space.high[1] == pytest.approx(0.418, abs=1e-3)
    obs, _ = env.reset(seed=0)
    for _ in range(5):
        state = np.array(env.unwrapped.state, np.float32)  # x, x_dot, theta, theta_dot
        np.testing.assert_array_equal(obs, state[[0, 2]])
        obs, *_ = env.step(1)
    with pytest.raises(AssertionError, match="out of"):
        ObservationSubset(gym.make("CartPole-v1"), [0, 4])


def test_flicker_blanks_frames_at_its_rate_and_replays_with_its_seed():
    def blanks(p, seed, n=400):
        env, out = Flicker(gym.make("CartPole-v1"), p), []
        obs, _ = env.reset(seed=seed)
        for _ in range(n):
            out.append(not obs.any())
            state = np.array(env.unwrapped.state, np.float32)
            obs, _, terminated, truncated, _ = env.step(int(state[2] > 0))  # push under the pole: long episodes
            if terminated or truncated:
                obs, _ = env.reset()
        return np.array(out)

    half = blanks(0.5, seed=1)
    assert 0.4 < half.mean() < 0.6  # 400 coin flips: 0.4-0.6 holds with probability 1 - 6e-5
    np.testing.assert_array_equal(half, blanks(0.5, seed=1))  # the same seed blanks the same ticks
    assert not np.array_equal(half, blanks(0.5, seed=2))
    assert not blanks(0.0, seed=1).any() and blanks(1.0, seed=1).all()
    with pytest.raises(AssertionError, match="not in"):
        Flicker(gym.make("CartPole-v1"), 1.5)


def test_doom_screen_keeps_the_screen_and_reports_timeouts_as_truncations(monkeypatch, tmp_path):
    need_vizdoom(monkeypatch, tmp_path)
    make = dict(frame_skip=4, screen_resolution="RES_160X120", episode_timeout=40)
    raw, env = gym.make("VizdoomHealthGathering-v1", **make), DoomScreen(gym.make("VizdoomHealthGathering-v1", **make))
    assert env.observation_space == gym.spaces.Box(0, 255, (120, 160, 3), np.uint8)
    assert env.metadata["render_fps"] == 9  # 35 tics a second, 4 a step
    obs, _ = env.reset(seed=0)
    raw.reset(seed=0)
    assert obs.shape == (120, 160, 3) and obs.std() > 0
    steps, truncated = 0, False
    while not truncated and steps < 20:
        obs, _, terminated, truncated, _ = env.step(3)  # forward: 40 tics do not kill in HealthGathering
        raw_step = raw.step(3)
        steps += 1
    assert steps == 10 and truncated and not terminated, "the timeout cuts the episode: a truncation"
    assert raw_step[2] and raw_step[3], "ViZDoom itself reports it terminated too"
    for e in (env, raw):
        e.close()


def test_doom_frames_and_actions_for_the_agent(monkeypatch, tmp_path):
    need_vizdoom(monkeypatch, tmp_path)
    exp = recurrent.make_experiment(recurrent.Args(env_id="VizdoomDefendCenter-v1"))
    env = exp.make_env()
    assert env.observation_space.shape == (48, 80, 3) and env.action_space == gym.spaces.Discrete(3)
    assert [env.action(i) for i in range(3)] == [1, 2, 3]  # no-op dropped: turn left, turn right, attack
    obs, _ = env.reset(seed=0)
    assert obs.dtype == np.uint8 and obs.shape == (48, 80, 3) and obs.std() > 0
    assert exp.initial_memory(2)["h"].shape == (2, 256) and exp.args.reward_scale == 1.0
    actions, memory, outputs = exp.act(np.stack([obs, obs]), exp.initial_memory(2))
    assert actions.shape == (2,) and memory["h"].shape == (2, 256) and outputs["logp"].shape == (2,)
    env.close()


def test_spatial_attention_by_hand():
    att = recurrent.SpatialAttention(channels=1, heads=2, height=2, width=3)
    x = torch.arange(6.0).view(1, 1, 2, 3)
    with torch.no_grad():
        att.score.weight.zero_(), att.score.bias.zero_()
        out = att(x).view(2, 3)  # uniform weights: the mean of the feature and of the coordinates
        torch.testing.assert_close(out, torch.tensor([[2.5, 0.0, 0.0]] * 2))
        att.score.weight[1] = 100.0  # head 1 scores the largest feature only: the bottom-right place
        out = att(x).view(2, 3)
    torch.testing.assert_close(out[1], torch.tensor([5.0, 1.0, 1.0]))  # its feature, then y and x in [-1, 1]
    assert att.weights.shape == (1, 2, 2, 3) and torch.allclose(att.weights.sum((2, 3)), torch.ones(1, 2))
    assert "coords" not in att.state_dict(), "coordinates are fixed: no param to publish"


def test_doom_attention_replays_what_the_players_saw_and_draws_it(monkeypatch, tmp_path):
    need_vizdoom(monkeypatch, tmp_path)
    db = connect(f"sqlite:///{tmp_path / 'a.db'}", "a")
    args = recurrent.Args(env_id="VizdoomDefendCenter-v1", attention=2, hidden=32, max_episode_steps=12)
    exp = recurrent.make_experiment(args)
    play(exp, db, batch_size=2, rounds=1, seed=0)
    batch = db.get_batch([1, 2])
    exp.prepare_training()
    logp = exp.forward(batch)[0][:, :-1].log_softmax(-1)
    logp = logp.gather(-1, torch.from_numpy(batch["actions"])[..., None])[..., 0]
    np.testing.assert_allclose(logp.detach().numpy(), batch["outputs.logp"], atol=1e-5)

    env = exp.make_env(render_mode="rgb_array")
    obs, _ = env.reset(seed=0)
    att = exp.net.attention
    att.weights = None
    plain = env.render().astype(int)  # no act yet: nothing to draw
    exp.act(obs[None], exp.initial_memory(1), greedy=True)
    assert att.weights.shape == (1, 2, 4, 8), "48x80 frames: a 4x8 map after the two convolutions"
    att.weights = torch.zeros_like(att.weights)
    att.weights[0, :, 0, 0] = 1.0  # both heads look at the top-left place only
    tinted = env.render().astype(int)
    assert tinted.shape == plain.shape == (120, 160, 3)
    top = int(args.crop.split(",")[0])  # the ceiling above the crop is not the agent's
    corner, far = (slice(top, top + 20), slice(0, 16)), (slice(top + 30, 120), slice(30, 160))
    assert (tinted[corner][..., 0] >= plain[corner][..., 0]).all()
    assert tinted[corner][..., 0].mean() > plain[corner][..., 0].mean() + 20, "redder where the heads look"
    np.testing.assert_array_equal(tinted[far], plain[far])
    np.testing.assert_array_equal(tinted[:top], plain[:top])
    env.close()
    db.close()


# -- end to end through the CLI ---------------------------------------------------------------------------------------
def test_masked_cartpole_run_through_the_cli(tmp_path):
    url = f"sqlite:///{tmp_path / 'run.db'}"
    args = ["run", "-n", 3000, "--train-batch", 4, "--eval-episodes", 1, "--set", "max_episode_steps=60"]
    out = run_cli(EXP, *args, "--db", url, cwd=tmp_path, env=CPU, timeout=90)
    assert "run stopped: reached" in out.stdout and "mean return" in out.stdout, out.stdout + out.stderr
    db = connect(url, "recurrent")
    lo, hi = db.session_range()
    batch = db.get_batch(list(range(lo, hi + 1)))
    assert batch["observations"].shape[2:] == (2,) and batch["memory.h"].shape[1:] == (64,)
    assert batch["memory.h"].any() and db.params_version() > 1, "states carried across sessions; params trained"
    db.close()


def test_doom_play_train_eval_with_video(monkeypatch, tmp_path):
    need_vizdoom(monkeypatch, tmp_path)
    import imageio.v2 as imageio

    url = ["--db", f"sqlite:///{tmp_path / 'doom.db'}"]
    sets = ["--set", "env_id=VizdoomDefendCenter-v1", "--set", "max_episode_steps=30"]
    run_cli(EXP, "play", "-n", 1, "-b", 2, *url, *sets, cwd=tmp_path, env=CPU, timeout=60)
    train = run_cli(EXP, "train", "-n", 2, "-b", 2, *url, cwd=tmp_path, env=CPU, timeout=60)
    assert "stopped after 2 updates" in train.stderr
    ev = run_cli(EXP, "eval", "-n", 1, "--record", "videos", *url, cwd=tmp_path, env=CPU, timeout=60)
    assert "mean return" in ev.stdout and "params v2" in ev.stdout
    (video,) = (tmp_path / "videos").glob("*.mp4")
    reader = imageio.get_reader(video)
    frames = [f for f in reader]  # not list(): the reader reports an infinite length
    assert len(frames) == 31, "the first frame and one per agent step"
    assert frames[0].shape == (120, 160, 3) and frames[-1].std() > 0, "the game's screen in colour"
    assert reader.get_meta_data()["fps"] == 9
