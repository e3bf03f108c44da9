"""What the tests of the continuous-action examples (ddpg_td3.py, sac.py, naf.py) share: the three files as
modules, an experiment of each algorithm with a small network, networks set to compute affine functions, and
batches of Pendulum-shaped sessions."""

import importlib.util
import sys

import numpy as np
import torch
from conftest import ROOT

sys.path.insert(0, str(ROOT / "examples"))  # as the loader does: the examples import their neighbour common.py
FILES = {name: ROOT / "examples" / f"{name}.py" for name in ("ddpg_td3", "sac", "naf")}
FILE_OF = {"ddpg": "ddpg_td3", "td3": "ddpg_td3", "sac": "sac", "naf": "naf"}
ALGOS = ["ddpg", "td3", "sac", "naf"]
PENDULUM_OBS = 3  # Pendulum-v1: observations (cos, sin, angular velocity), one action in [-2, 2]


def load(name: str):
    spec = importlib.util.spec_from_file_location(f"{name}_example", FILES[name])
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


MODULES = {name: load(name) for name in FILES}


def module_of(algo: str):
    return MODULES[FILE_OF[algo]]


def make(algo: str, env_id: str = "Pendulum-v1", **options):
    """An experiment of ``algo`` (ddpg, td3, sac, naf) with 8 x 8 hidden units and seed 0 unless given."""
    options = {"net_arch": "8,8", "seed": 0, **options} | ({"algo": algo} if FILE_OF[algo] == "ddpg_td3" else {})
    module = module_of(algo)
    return module.make_experiment(module.Args(env_id=env_id, **options))


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
