"""DQN on CartPole-v1 in NumPy alone: no deep-learning framework, hand-written backprop and Adam.

    pip install -e '.[examples]'
    python -m tinyverse examples/cartpole_numpy.py play -b 1 &
    python -m tinyverse examples/cartpole_numpy.py train -b 32 &
    python -m tinyverse examples/cartpole_numpy.py eval -n 20 --no-record
    python -m tinyverse examples/cartpole_numpy.py train --set learning_rate=1e-3   # options: --set NAME=VALUE

The core only ever sees NumPy arrays, so an agent needs nothing else. This is
the algorithm of cartpole_dqn.py (double DQN, n-step returns, a Polyak target
network that travels in the params, players and trainer held to the same pace
by the core's loops) with a two-layer MLP written out by hand.
"""

from dataclasses import dataclass

import gymnasium as gym
import numpy as np

import tinyverse
from tinyverse import explore, nstep_transitions


@dataclass
class Args(tinyverse.Settings):
    # the core's settings (tinyverse.Settings) this file sets otherwise
    session_length: int = 16
    buffer_size: int | None = 5000
    """sessions the database keeps: 80k transitions"""
    prefetch: int = 0
    """batches are cheap and updates short: no prefetch thread competing for the GIL (1.3-1.6x)"""
    local_params: tuple[str, ...] = ("target.*",)
    """with several trainers each keeps its own target net"""
    updates_per_step: float | None = 0.25
    """the pace: trainer updates per env step played (the old player bound, 4 env steps an update)"""
    learning_starts: int = 500
    """the pace: env steps played before the first update"""
    pace_slack: int = 500
    """the pace: env steps either side may run ahead (a player waits 1000 steps ahead, as it used to)"""
    # its own
    hidden: int = 64
    """units in each of the two hidden layers"""
    learning_rate: float = 2e-3
    """Adam step size"""
    gamma: float = 0.99
    """discount factor"""
    n_step: int = 5
    """n-step returns, cut at episode ends and at the end of the session"""
    tau: float = 0.01
    """target net update rate: target += tau x (online - target) after every update"""
    eps_end: float = 0.02
    """exploration epsilon after ``eps_updates`` updates (it starts at 1)"""
    eps_updates: int = 2000
    """trainer updates over which epsilon decays linearly (updates, not env steps: see cartpole_dqn.py)"""


def init_mlp(sizes: list[int], rng) -> dict[str, np.ndarray]:
    """He-initialised weights and zero biases of a ReLU MLP."""
    p = {}
    for i, (m, n) in enumerate(zip(sizes[:-1], sizes[1:], strict=True)):
        p[f"w{i}"] = (rng.standard_normal((m, n)) * np.sqrt(2 / m)).astype(np.float32)
        p[f"b{i}"] = np.zeros(n, np.float32)
    return p


def forward(p: dict, x: np.ndarray) -> tuple[np.ndarray, list[np.ndarray]]:
    """Q-values, and the input of every layer for the backward pass."""
    layers, inputs = len(p) // 2, []
    for i in range(layers):
        inputs.append(x)
        x = x @ p[f"w{i}"] + p[f"b{i}"]
        if i < layers - 1:
            x = np.maximum(x, 0)
    return x, inputs


def backward(p: dict, inputs: list[np.ndarray], grad: np.ndarray) -> dict[str, np.ndarray]:
    """Gradients of every weight given d loss / d output."""
    grads = {}
    for i in reversed(range(len(inputs))):
        grads[f"w{i}"], grads[f"b{i}"] = inputs[i].T @ grad, grad.sum(0)
        if i:
            grad = (grad @ p[f"w{i}"].T) * (inputs[i] > 0)  # through the ReLU that made inputs[i]
    return grads


class CartPoleNumPy(tinyverse.Experiment):
    def __init__(self, args: Args | None = None):
        self.args = args or Args()
        super().__init__(self.args)  # the core reads its settings there
        self.rng = np.random.default_rng()
        self.q = init_mlp([4, self.args.hidden, self.args.hidden, 2], self.rng)
        self.target = {k: v.copy() for k, v in self.q.items()}
        self.updates = 0

    def make_env(self, render_mode=None):
        return gym.make("CartPole-v1", render_mode=render_mode)

    def epsilon(self) -> float:
        return explore.linear(1.0, self.args.eps_end, self.updates / self.args.eps_updates)

    def act(self, observations, memory, greedy=False):
        q = forward(self.q, observations.astype(np.float32))[0]
        return explore.epsilon_greedy(q, 0.0 if greedy else self.epsilon(), self.rng), memory

    def session_info(self):
        return {"epsilon": self.epsilon()}

    def prepare_training(self):
        self.m = {k: np.zeros_like(v) for k, v in self.q.items()}  # Adam moments
        self.v = {k: np.zeros_like(v) for k, v in self.q.items()}

    def train_step(self, batch):
        a = self.args
        t = nstep_transitions(batch, a.n_step, a.gamma)  # cut at episode ends and at the end of the session
        obs, next_obs = t.observations.reshape(-1, 4), t.next_observations.reshape(-1, 4)
        actions, returns, discount = t.actions.reshape(-1), t.returns.reshape(-1), t.discounts.reshape(-1)
        # double DQN: the online net picks the next action, the target net values it
        best = forward(self.q, next_obs)[0].argmax(1)
        rows = np.arange(len(obs))
        target = returns + discount * forward(self.target, next_obs)[0][rows, best]
        q, inputs = forward(self.q, obs)
        error = q[rows, actions] - target
        # Huber loss (mean): its gradient is the error clipped to [-1, 1]
        grad = np.zeros_like(q)
        grad[rows, actions] = np.clip(error, -1, 1) / len(obs)
        self.adam(backward(self.q, inputs, grad))
        for k in self.q:  # Polyak averaging of the target net
            self.target[k] += a.tau * (self.q[k] - self.target[k])
        huber = np.where(np.abs(error) < 1, 0.5 * error**2, np.abs(error) - 0.5)
        return {"loss": float(huber.mean()), "q": float(q[rows, actions].mean())}

    def adam(self, grads, beta1=0.9, beta2=0.999, eps=1e-8):
        """One Adam step (https://arxiv.org/abs/1412.6980, Algorithm 1)."""
        self.updates += 1
        lr = self.args.learning_rate * np.sqrt(1 - beta2**self.updates) / (1 - beta1**self.updates)
        for k, g in grads.items():
            self.m[k] += (1 - beta1) * (g - self.m[k])
            self.v[k] += (1 - beta2) * (g * g - self.v[k])
            self.q[k] -= (lr * self.m[k] / (np.sqrt(self.v[k]) + eps)).astype(np.float32)

    def get_params(self):
        params = {f"q.{k}": v.copy() for k, v in self.q.items()}
        params |= {f"target.{k}": v.copy() for k, v in self.target.items()}
        return params | {"updates": np.array(self.updates, np.int64)}

    def set_params(self, params):
        self.q = {k: params[f"q.{k}"] for k in self.q}  # decoded arrays are writable and our own
        self.target = {k: params[f"target.{k}"] for k in self.target}
        self.updates = int(params["updates"])


def make_experiment(args: Args):
    return CartPoleNumPy(args)
