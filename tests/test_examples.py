"""Smoke tests: the real example files, tiny budgets, through the real CLI."""

import ast
import importlib.util
import subprocess
import sys
import time

import numpy as np
import pytest
from conftest import ROOT, cli_env, optional, run_cli, wait_for

from tinyverse.database import connect
from tinyverse.settings import NAMES

torch = optional("torch")

CARTPOLE = ["cartpole_dqn.py", "cartpole_numpy.py"]
EXAMPLES = [*CARTPOLE, "dqn.py", "atari.py", "ddpg_td3.py", "sac.py", "naf.py"]


def load(name: str):
    """The example as a module, its neighbours importable, as the loader makes them (examples/ on sys.path)."""
    if str(ROOT / "examples") not in sys.path:
        sys.path.insert(0, str(ROOT / "examples"))
    spec = importlib.util.spec_from_file_location(name.removesuffix(".py"), ROOT / "examples" / name)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("example", CARTPOLE)
def test_play_train_eval(example, tmp_path):
    exp, db = ROOT / "examples" / example, f"sqlite:///{tmp_path / 'smoke.db'}"
    run_cli(exp, "play", "-n", "2", "--db", db, "--set", "learning_starts=0", cwd=tmp_path, timeout=60)
    run_cli(exp, "train", "-b", "2", "-n", "5", "--db", db, cwd=tmp_path, timeout=60)  # adopts learning_starts
    out = run_cli(exp, "eval", "-n", "1", "--no-record", "--db", db, cwd=tmp_path, timeout=60).stdout
    assert "mean return" in out and "params v2" in out  # the player's init, then the trainer's 5 updates


@pytest.mark.parametrize("example", EXAMPLES)
def test_examples_leave_the_pace_and_publishing_to_the_loops(example):
    source = (ROOT / "examples" / example).read_text()
    for banned in ("sleep(", "save_params", "sync_params", "wait_for", "TINYVERSE_ATARI", "DQN_"):
        assert banned not in source, f"{example} still has {banned}"
    exp = load(example).make_experiment(load(example).Args())
    ratio = exp.run.settings.updates_per_step
    assert ratio is not None and ratio > 0  # it declares its pace instead, in its options (tinyverse.Settings)
    assert not set(vars(exp)) & set(NAMES), "no setting copied onto the experiment"


def waiting_player(db, after: float = 0.0) -> dict | None:
    """The heartbeat, sent after the time ``after``, of a player that says it waits for the trainers."""
    beats = [w for w in db.workers() if w["role"] == "player" and w["time"] > after]
    return next((w for w in beats if "for the trainers" in (w.get("waiting") or "")), None)


def test_player_waits_for_the_trainer_and_the_pace_holds(tmp_path):
    """A real player and trainer of cartpole_dqn.py: the player waits, the ratio stays within the slack."""
    exp, url = ROOT / "examples" / "cartpole_dqn.py", f"sqlite:///{tmp_path / 'pace.db'}"
    args = load("cartpole_dqn.py").Args()
    ratio, starts, slack, T = args.updates_per_step, args.learning_starts, args.pace_slack, 32
    cmd = [sys.executable, "-m", "tinyverse", str(exp)]
    player = subprocess.Popen(
        [*cmd, "play", "-n", "40", "--db", url], cwd=tmp_path, env=cli_env(), stderr=subprocess.PIPE, text=True
    )
    trainer = None
    db = connect(url, "cartpole_dqn", retry_for=30)
    leads, deadline = [], time.monotonic() + 60
    try:
        while player.poll() is None and time.monotonic() < deadline:
            u1 = db.counter("updates")
            played = db.count_sessions()[1] * T
            u2 = db.counter("updates")
            # updates read before and after the steps: each bound checked with the reading that favours it
            assert max(0, played - starts) - u1 / ratio >= -slack, (played, u1)
            assert max(0, played - starts) - u2 / ratio <= slack + T, (played, u2)  # one round of -b 1 past
            leads.append(max(0, played - starts) - u2 / ratio)
            if trainer is None and played >= starts + slack:  # the player must be waiting by now: no trainer yet
                first = wait_for(lambda: waiting_player(db), 30, "the player to wait for the trainers")
                held = db.count_sessions()[1] * T
                # a heartbeat 2 s later that still says it waits: its waiting loop went round, it played no round
                wait_for(lambda t=first["time"]: waiting_player(db, t), 30, "a later heartbeat of the waiting player")
                assert db.count_sessions()[1] * T == held <= starts + slack + T, "the player did not wait"
                trainer = subprocess.Popen([*cmd, "train", "-n", "100", "--db", url], cwd=tmp_path, env=cli_env())
            time.sleep(0.05)
        _, err = player.communicate(timeout=60)
        assert player.returncode == 0, err
        assert trainer is not None and trainer.wait(timeout=60) == 0
    finally:
        for p in (player, trainer):
            if p is not None and p.poll() is None:
                p.kill()
    assert "waiting for the trainers" in err
    played, updates = db.count_sessions()[1] * T, db.counter("updates")
    assert played == 40 * T and updates == 100
    assert -slack <= max(0, played - starts) - updates / ratio <= slack + T
    assert len(leads) > 10
    db.close()


def test_numpy_example_needs_no_deep_learning_framework():
    code = (
        "import sys, numpy as np; from tinyverse.loader import load_experiment\n"
        f"exp = load_experiment({str(ROOT / 'examples' / 'cartpole_numpy.py')!r})\n"
        "exp.act(np.zeros((3, 4), np.float32), exp.initial_memory(3))\n"
        "exp.prepare_training()\n"
        "bad = [m for m in ('torch', 'tensorflow', 'jax') if m in sys.modules]\n"
        "assert not bad, bad\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


DOCUMENTED = [*EXAMPLES, "recurrent.py", "racing.py", "alphazero.py", "go.py"]
SHARED = ["common.py", "wrappers.py"]


@pytest.mark.parametrize("example", DOCUMENTED + SHARED)
def test_each_docstring_fits_in_twenty_lines_and_names_its_install_line(example):
    (node, *_) = ast.parse((ROOT / "examples" / example).read_text()).body
    assert isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant), f"{example} has no docstring"
    assert node.end_lineno - node.lineno + 1 <= 20, f"{example}: its results belong in docs/examples.rst"
    if example in DOCUMENTED:
        assert "pip install -e '.[examples" in node.value.value, example


def test_shared_pieces_have_one_home():
    sources = {p.name: p.read_text() for p in (ROOT / "examples").glob("*.py")}
    for alone in ("mountaincar.py", "cartpole_dqn.py"):  # a new user's file, and the README's: each stands alone
        own = sources.pop(alone)
        assert "nstep_transitions" in own and "def n_step" not in own and "from common" not in own
    for piece in ("set_num_threads(1)", "def layer_init", "os.environ", "def get_weights", "def vtrace"):
        assert [name for name, text in sources.items() if piece in text] == ["common.py"], piece
    for gone in ("def n_step", "def nstep_targets", "sys.path"):  # n-step returns: tinyverse.nstep_transitions
        assert not [name for name, text in sources.items() if gone in text], gone
    for gone in ("TINYVERSE_WORKER_INDEX", "def epsilon_greedy", "def apex", "def linear"):  # tinyverse.explore
        assert not [name for name, text in sources.items() if gone in text], gone


def test_no_example_imports_another():
    files = {p.stem: p for p in (ROOT / "examples").glob("*.py")}
    examples = {name for name, path in files.items() if "def make_experiment" in path.read_text()}
    assert {"atari", "recurrent", "ddpg_td3", "sac", "naf"} <= examples and "racing" not in examples
    for name in examples:
        tree = ast.parse(files[name].read_text())
        imported = {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
        imported |= {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
        assert not imported & (examples - {name}), f"{name}.py imports {imported & examples}"


def test_cartpole_dqn_step_size_decays_with_the_shared_update_count():
    module = load("cartpole_dqn.py")
    args = module.Args(learning_rate=1e-3, lr_end=1e-4, lr_updates=100)
    exp = module.make_experiment(args)
    exp.prepare_training()
    rng, B, T = np.random.default_rng(0), 2, 4
    batch = {
        "observations": rng.normal(size=(B, T + 1, 4)).astype(np.float32),
        "final_observations": np.zeros((B, T, 4), np.float32),
        "actions": rng.integers(2, size=(B, T)),
        "rewards": np.ones((B, T), np.float32),
        "terminated": np.zeros((B, T), bool),
        "truncated": np.zeros((B, T), bool),
    }
    steps = {}
    for updates in (0, 50, 100, 5000):  # as a restarted trainer finds it in the params
        exp.updates = updates
        exp.train_step(batch)
        steps[updates] = exp.optimizer.param_groups[0]["lr"]
    assert steps == pytest.approx({0: 1e-3, 50: 5.5e-4, 100: 1e-4, 5000: 1e-4})
    # the schedules count samples, as the pace does: an update on 2 x train_batch_size sessions counts 2
    exp.updates = 0
    exp.args.train_batch_size = B // 2
    exp.train_step(batch)
    assert exp.updates == 2


def test_cartpole_dqn_layer_norm_normalizes_each_hidden_layer():
    module = load("cartpole_dqn.py")
    plain = module.make_experiment(module.Args(hidden=4, layer_norm=False))
    assert list(plain.q.state_dict()) == ["0.weight", "0.bias", "2.weight", "2.bias", "4.weight", "4.bias"]
    exp = module.make_experiment(module.Args(hidden=4, layer_norm=True))
    with torch.no_grad():
        exp.q[0].weight.zero_()
        exp.q[0].bias.copy_(torch.tensor([1.0, 2.0, 3.0, 4.0]))
        hidden = exp.q[:3](torch.zeros(1, 4))  # Linear, LayerNorm (weight 1, bias 0 at the start), ReLU
    # (x - 2.5) / sqrt(1.25) for pre-activations x = 1..4, then ReLU
    assert hidden[0].tolist() == pytest.approx([0.0, 0.0, 0.5 / 1.25**0.5, 1.5 / 1.25**0.5], rel=1e-4)
    assert isinstance(exp.q[4], torch.nn.LayerNorm) and len(exp.q) == 7  # and the second hidden layer


@pytest.mark.parametrize("greedy_target", [False, True])
def test_cartpole_dqn_greedy_play_may_use_the_target_net(greedy_target):
    module = load("cartpole_dqn.py")
    exp = module.make_experiment(module.Args(eps_end=0.0, greedy_target=greedy_target))
    exp.updates = exp.args.eps_updates  # exploration over: players act greedily on the online net
    with torch.no_grad():
        exp.q[-1].bias.copy_(torch.tensor([100.0, 0.0]))  # the online net's latest step prefers action 0
        exp.target[-1].bias.copy_(torch.tensor([0.0, 100.0]))  # its running average, action 1
    observations = np.zeros((3, 4), np.float32)
    assert exp.act(observations, {})[0].tolist() == [0, 0, 0]
    assert exp.act(observations, {}, greedy=True)[0].tolist() == [int(greedy_target)] * 3


def test_cartpole_dqn_players_of_a_fleet_end_at_their_own_epsilon(monkeypatch):
    module = load("cartpole_dqn.py")
    args = module.Args(eps_end=0.02, eps_spread=7.0)

    def final_epsilon(env: dict) -> float:
        for key in ("TINYVERSE_WORKER_INDEX", "TINYVERSE_WORKER_COUNT"):
            monkeypatch.delenv(key, raising=False)
        for key, value in env.items():
            monkeypatch.setenv(key, value)
        exp = module.make_experiment(args)
        exp.updates = args.eps_updates  # the decay is over
        assert exp.session_info()["epsilon"] == pytest.approx(exp.epsilon())
        return exp.epsilon()

    assert final_epsilon({}) == pytest.approx(0.02)  # a player started by hand
    assert final_epsilon({"TINYVERSE_WORKER_INDEX": "0", "TINYVERSE_WORKER_COUNT": "1"}) == pytest.approx(0.02)
    pair = [final_epsilon({"TINYVERSE_WORKER_INDEX": str(i), "TINYVERSE_WORKER_COUNT": "2"}) for i in (0, 1)]
    assert pair == pytest.approx([0.02 ** (2.75 / 4.5), 0.02 ** (6.25 / 4.5)])  # 0.092 and 0.0044
    assert pair[0] * pair[1] == pytest.approx(0.02**2)  # geometric: centred on eps_end
    exp = module.make_experiment(args)
    exp.updates = 0
    assert exp.epsilon() == 1.0  # every player starts at eps_start


def test_numpy_backprop_matches_finite_differences():
    m = load("cartpole_numpy.py")
    rng = np.random.default_rng(0)
    p = {k: v.astype(np.float64) for k, v in m.init_mlp([4, 8, 8, 2], rng).items()}
    x, w = rng.standard_normal((5, 4)), rng.standard_normal((5, 2))
    q, inputs = m.forward(p, x)
    grads = m.backward(p, inputs, w)  # of sum(q * w)
    for k in p:
        i = (0,) * p[k].ndim
        old = p[k][i]
        p[k][i] = old + 1e-6
        plus = (m.forward(p, x)[0] * w).sum()
        p[k][i] = old - 1e-6
        minus = (m.forward(p, x)[0] * w).sum()
        p[k][i] = old
        assert grads[k][i] == pytest.approx((plus - minus) / 2e-6, rel=1e-5, abs=1e-8), k
