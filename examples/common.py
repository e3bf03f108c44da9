"""What the PyTorch examples share: one torch thread, Ape-X's exploration spread, schedules, weights as params.

    from common import apex_epsilon, epsilon_greedy, layer_init, linear, load_weights, pick_device, ...

Importing it sets torch to one thread: torch's default thread count made a DQN
run 4x slower with several processes on 2 cores.
"""

import os
import random

import numpy as np
import torch
import torch.nn as nn

torch.set_num_threads(1)


def player_slot(players: int = 1) -> tuple[int, int]:
    """(i, n): this player's index in a fleet of n, from TINYVERSE_WORKER_INDEX and TINYVERSE_WORKER_COUNT,
    which ``run`` sets; when they are unset, n is ``players`` and i is drawn at random among them."""
    index, count = os.environ.get("TINYVERSE_WORKER_INDEX"), os.environ.get("TINYVERSE_WORKER_COUNT")
    if index is None or count is None:
        return random.randrange(players), players
    return int(index), int(count)


def apex_epsilon(epsilon: float, spread: float, index: int, count: int) -> float:
    """Ape-X (https://arxiv.org/abs/1803.00933): the final epsilon of player i of n, spread geometrically
    around ``epsilon``: epsilon ** ((1 + spread q) / (1 + spread / 2)), q = (i + 1/2) / n (a lone player: epsilon)."""
    quantile = (index + 0.5) / count
    return epsilon ** ((1 + spread * quantile) / (1 + spread / 2))


def linear(start: float, end: float, fraction: float) -> float:
    """A linear schedule: ``start`` at fraction 0, ``end`` from fraction 1 on."""
    return start + (end - start) * min(1.0, fraction)


def epsilon_greedy(rng: np.random.Generator, actions: np.ndarray, n_actions: int, epsilon: float) -> np.ndarray:
    """``actions``, each replaced with probability ``epsilon`` by one drawn uniformly from ``n_actions``."""
    explore = rng.random(len(actions)) < epsilon
    return np.where(explore, rng.integers(n_actions, size=len(actions)), actions)


def layer_init(layer: nn.Module, std: float = np.sqrt(2), bias: float = 0.0) -> nn.Module:
    """Orthogonal init as in OpenAI baselines / CleanRL."""
    nn.init.orthogonal_(layer.weight, std)
    nn.init.constant_(layer.bias, bias)
    return layer


def get_weights(nets: dict[str, nn.Module]) -> dict[str, np.ndarray]:
    """Every network's state as params named ``<name>.<key>``: NumPy copies, on the CPU."""
    return {
        f"{name}.{k}": v.detach().cpu().numpy().copy()
        for name, net in nets.items()
        for k, v in net.state_dict().items()
    }


def load_weights(nets: dict[str, nn.Module], params: dict[str, np.ndarray]) -> None:
    """The inverse of :func:`get_weights`: load each network's state from the params."""
    for name, net in nets.items():
        net.load_state_dict({k: torch.from_numpy(params[f"{name}.{k}"]) for k in net.state_dict()})


def pick_device() -> torch.device:
    """The trainer's device: $TINYVERSE_DEVICE (``--device``), auto = CUDA when there is one (per process, not an
    option)."""
    device = os.environ.get("TINYVERSE_DEVICE", "auto")
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    assert not device.startswith("cuda") or torch.cuda.is_available(), f"device {device} but no CUDA device"
    return torch.device(device)
