"""DQN with n-step returns on MountainCar-v0, in PyTorch: the experiment that docs/experiment.rst walks through.

pip install -e '.[examples]'
python -m tinyverse examples/mountaincar.py run --target-eval 10 --target-return -120
"""

import copy
from dataclasses import dataclass

import gymnasium as gym
import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

from tinyverse import Experiment, Settings, explore, nstep_transitions

torch.set_num_threads(1)  # several workers share the cores


@dataclass
class Args(Settings):  # the core's settings, with this file's defaults, and its own options
    session_length: int = 32
    play_batch_size: int = 4
    train_batch_size: int = 16
    """default of train -b: sessions an update, 512 transitions"""
    prefetch: int = 0
    """batches are cheap: fetched in the training thread"""
    updates_per_step: float | None = 0.25
    learning_starts: int = 2000
    env_id: str = "MountainCar-v0"
    """the Gymnasium environment"""
    hidden: int = 128
    """units in each of the two hidden layers"""
    learning_rate: float = 1e-3
    """Adam step size"""
    gamma: float = 0.99
    """discount factor"""
    n_step: int = 8
    """n-step returns: the reward at the flag reaches n ticks back in one update"""
    target_every: int = 500
    """updates between copies of the online net into the target net"""
    eps_end: float = 0.05
    """exploration epsilon after eps_updates updates (1.0 before the first)"""
    eps_updates: int = 3000
    """updates over which epsilon decays linearly"""


class MountainCarDQN(Experiment):
    def __init__(self, args: Args):
        super().__init__(args)  # the core reads its settings there
        self.args, self.rng = args, np.random.default_rng()
        env = self.make_env()
        n_obs, self.n_act, h = env.observation_space.shape[0], int(env.action_space.n), args.hidden
        env.close()
        self.q = nn.Sequential(nn.Linear(n_obs, h), nn.ReLU(), nn.Linear(h, h), nn.ReLU(), nn.Linear(h, self.n_act))

    def make_env(self, render_mode=None):  # observations scaled to [-1, 1]: the velocity spans only +-0.07
        return gym.wrappers.RescaleObservation(gym.make(self.args.env_id, render_mode=render_mode), -1, 1)

    @torch.no_grad()
    def act(self, observations, memory, greedy=False):
        q = self.q(torch.as_tensor(observations)).numpy()
        return explore.epsilon_greedy(q, 0.0 if greedy else self.session_info()["epsilon"], self.rng), memory

    def session_info(self):  # epsilon falls linearly with the run's updates, all trainers', restarts included
        return {"epsilon": explore.linear(1.0, self.args.eps_end, self.run.updates / self.args.eps_updates)}

    def prepare_training(self):
        self.optimizer = torch.optim.Adam(self.q.parameters(), lr=self.args.learning_rate)
        self.target = copy.deepcopy(self.q)  # trainers only: each of several keeps its own
        self.next_copy = 0  # the update count at which the target net is next copied

    def train_step(self, batch):
        if self.run.updates >= self.next_copy:  # the run's count, all trainers', restarts included
            self.target.load_state_dict(self.q.state_dict())
            self.next_copy = self.run.updates + self.args.target_every
        t = nstep_transitions(batch, self.args.n_step, self.args.gamma)
        obs, actions, returns, next_obs, discounts = (torch.as_tensor(x).flatten(0, 1) for x in t[:5])
        target = returns + discounts * self.target(next_obs).max(1).values.detach()
        q = self.q(obs).gather(1, actions[:, None].long()).squeeze(1)
        loss = F.smooth_l1_loss(q, target)
        self.optimizer.zero_grad()
        loss.backward()
        self.optimizer.step()
        return {"loss": loss.item(), "q": q.mean().item()}

    def get_params(self):
        return {k: v.numpy().copy() for k, v in self.q.state_dict().items()}

    def set_params(self, params):
        self.q.load_state_dict({k: torch.from_numpy(v) for k, v in params.items()})


def make_experiment(args: Args):
    return MountainCarDQN(args)
