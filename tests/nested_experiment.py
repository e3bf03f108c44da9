"""A tiny NumPy-only experiment observing a nested Dict or Tuple space, for the tests of such observations.

Its env (:class:`NestedEnv`) samples observations of ``SPACES[args.space]`` (nested, with float32, uint8, int64
leaves and a MultiBinary mask), logs every reset and step, and ends its episodes by turns: terminated after 3
steps, truncated after 4. A step whose action the observation's mask marks 0 raises. ``act`` checks that it gets
the observations nested as the space, batched, and picks the first action the mask allows; ``train_step`` checks
the batch alike and keeps it. ``--set space=text`` observes a Text space, which tinyverse refuses.
"""

import copy
import dataclasses

import gymnasium as gym
import numpy as np

from tinyverse import Experiment

FRAME = gym.spaces.Box(0, 255, (3, 4), np.uint8)
POS = gym.spaces.Box(-1, 1, (2,), np.float32)
MASK = gym.spaces.MultiBinary(3)
SPACES = {
    "dict": gym.spaces.Dict(
        pos=POS,
        mask=MASK,
        inner=gym.spaces.Dict(frame=FRAME, count=gym.spaces.Discrete(5)),
        seat=gym.spaces.Discrete(2),
    ),
    "tuple": gym.spaces.Tuple(
        (POS, gym.spaces.Dict(mask=MASK, frame=FRAME), gym.spaces.Tuple((gym.spaces.Discrete(5),)))
    ),
    "text": gym.spaces.Text(8),
}


@dataclasses.dataclass
class Args:
    space: str = "dict"
    """the observation space: dict, tuple (both nested) or text (refused)"""
    session_length: int = 5
    """ticks per session"""


def mask_of(obs):
    """The mask of an observation (or a batch of them) of either space."""
    return obs["mask"] if isinstance(obs, dict) else obs[1]["mask"]


def shaped(value, space, lead: tuple, where: str = "observations") -> None:
    """AssertionError unless ``value`` is nested as ``space``, each array of shape (*lead, *its shape) and its dtype."""
    if isinstance(space, gym.spaces.Dict):
        assert type(value) is dict and list(value) == list(space.keys()), f"{where}: {value!r:.200}"
        for k in space.keys():
            shaped(value[k], space[k], lead, f"{where}.{k}")
    elif isinstance(space, gym.spaces.Tuple):
        assert type(value) is tuple and len(value) == len(space.spaces), f"{where}: {value!r:.200}"
        for i, (v, s) in enumerate(zip(value, space.spaces, strict=True)):
            shaped(v, s, lead, f"{where}.{i}")
    else:
        assert type(value) is np.ndarray, f"{where} is {type(value)}"
        assert (value.shape, value.dtype) == ((*lead, *space.shape), space.dtype), (
            f"{where}: {value.shape} {value.dtype}"
        )


class NestedEnv(gym.Env):
    """Observations of ``space``, sampled; every reset and step logged in ``events``."""

    def __init__(self, space):
        self.observation_space = copy.deepcopy(space)  # its own sampler, seeded by reset
        self.action_space = gym.spaces.Discrete(3)
        self.events = []
        self.episodes = 0

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        if seed is not None:
            self.observation_space.seed(seed)
        self.episodes += 1
        self.t = 0
        self.obs = self.observation_space.sample()
        self.events.append(("reset", copy.deepcopy(self.obs)))
        return self.obs, {}

    def step(self, action):
        mask = mask_of(self.obs)
        if mask.any() and not mask[action]:
            raise ValueError(f"action {action} is masked out by {mask}")
        self.t += 1
        ends = self.t == 3 + self.episodes % 2
        terminated = ends and self.episodes % 2 == 0
        self.obs = self.observation_space.sample()
        self.events.append(
            ("step", copy.deepcopy(self.obs), int(action), float(self.t), terminated, ends and not terminated)
        )
        return self.obs, float(self.t), terminated, ends and not terminated, {}


class NestedExperiment(Experiment):
    play_batch_size = 2
    train_batch_size = 4
    prefetch = 0

    def __init__(self, db=None, space="dict", session_length=5):
        super().__init__(db)
        self.space = SPACES[space]
        self.session_length = session_length
        self.envs = []  # each env made, in order
        self.seen = []  # what act got, copied
        self.batches = []  # what train_step got
        self.w = np.zeros(1, np.float32)

    def make_env(self, render_mode=None):
        self.envs.append(NestedEnv(self.space))
        return self.envs[-1]

    def act(self, observations, memory, greedy=False):
        B = len(mask_of(observations))
        shaped(observations, self.space, (B,))
        self.seen.append(copy.deepcopy(observations))
        actions = np.argmax(mask_of(observations), axis=1)  # the first allowed (0 when none is marked)
        return actions.astype(np.int64), memory

    def train_step(self, batch):
        B, T = batch["rewards"].shape
        shaped(batch["observations"], self.space, (B, T + 1))
        shaped(batch["final_observations"], self.space, (B, T), "final_observations")
        self.batches.append(batch)
        self.w += 1
        return {"sessions": float(B)}

    def get_params(self):
        return {"w": self.w.copy()}

    def set_params(self, params):
        self.w = params["w"].copy()


def make_experiment(db, args: Args):
    return NestedExperiment(db, **dataclasses.asdict(args))
