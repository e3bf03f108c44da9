"""AlphaZero with Gumbel search on OpenSpiel's two-player board games (games.py), in PyTorch.

    pip install -e '.[examples,games]'
    python -m tinyverse examples/alphazero.py run                 # Connect Four by self-play
    python -m tinyverse examples/alphazero.py play -b 16 --set game=go --set opponent=gnugo:1 &   # or the parts
    python -m tinyverse examples/alphazero.py train --set game=go --set opponent=gnugo:1 &

The search is Gumbel AlphaZero's (Danihelka et al. 2022, https://openreview.net/forum?id=bERaNdoegnO), not PUCT:
CPU players afford 2-16 simulations a move, where PUCT's visit counts are a poor target and may not improve on
the prior, while sequential halving over Gumbel-sampled actions and the completed-Q policy are a policy
improvement at any count. It searches the B games of a player at once: each simulation step evaluates the
leaves of all B trees in one forward pass. ``outputs.policy`` is that improved policy, which the net fits.
Self-play (``opponent`` self, the default): the agent plays both seats, every move searched with the B games'
leaves batched and recorded, each tick seen from its mover's seat. Value targets: the game's outcome from each
tick's mover (gamma 1, negamax: a tick whose next tick is the other seat's takes the negative of that tick's
target). Sessions cross episode boundaries whatever their length, so a tick whose game goes on past the session
takes the value net's estimate of the session's last position instead, from that position's mover. A share of
the games (``rated_games``) is played against ``rated_opponent``, whose results ``info`` rates as the run goes.
"""

import math
from dataclasses import dataclass

import games
import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
from common import derive_pace, get_weights, load_weights, pick_device

import tinyverse

C_VISIT, C_SCALE = 50.0, 0.1  # sigma(q) = (C_VISIT + max visits) * C_SCALE * q: the paper's constants


@dataclass
class Args(tinyverse.Settings):
    TUNABLE = ("simulations",)  # tune --set (players adopt it at their next move); eval --set: that eval's only
    game: str = "connect_four"
    """an OpenSpiel two-player game with a board of planes: connect_four, tic_tac_toe, go, othello, ..."""
    board_size: int = 9
    """the side of Go's and Hex's board (games.SIZED; other games ignore it)"""
    opponent: str = "self"
    """who plays the other seat: self (the agent: both seats recorded), random, mcts:SIMULATIONS, gnugo:LEVEL (Go)"""
    rated_games: float = 0.1
    """in self-play, the share of games played against rated_opponent instead (results stored and rated)"""
    rated_opponent: str = "mcts:100"
    """the fixed opponent of those games: random, mcts:SIMULATIONS, gnugo:LEVEL (Go)"""
    simulations: int = 16
    """simulations a move (each: one leaf per game, evaluated in one batched forward pass)"""
    max_considered: int = 16
    """root actions sequential halving starts from (Gumbel top-k)"""
    channels: int = 32
    """convolution channels of the residual tower"""
    blocks: int = 2
    """residual blocks"""
    learning_rate: float = 1e-3
    """Adam step size"""
    weight_decay: float = 1e-4
    """L2 penalty of AdamW"""
    value_coef: float = 1.0
    """weight of the value loss next to the policy's cross-entropy"""
    max_reuse: float = 4.0
    """the pace: times each recorded move is trained on, on average (sets updates_per_step when left None)"""
    # the core's settings (tinyverse.Settings) this file sets otherwise
    session_length: int = 16
    """agent moves a recorded session"""
    train_batch_size: int = 32
    """sessions an update (default of train -b)"""
    play_batch_size: int = 16
    """games a player searches together (default of play -b): one forward pass a simulation step for all"""
    buffer_size: int | None = 5000
    """sessions the replay buffer keeps"""
    updates_per_step: float | None = None
    """the pace: updates an agent move (None: max_reuse / the moves of an update)"""
    pace_slack: int | None = None
    """moves either side may run ahead of the pace (None: the moves of an update)"""

    def __post_init__(self):
        """The pace from max_reuse, where left None."""
        derive_pace(self, slack=self.train_batch_size * self.session_length)  # an update's moves ahead at most


# -- the search ------------------------------------------------------------------------------------------------------
class Node:
    """A position of a search tree: its state, the mover, the net's prior logits (-inf where illegal) and value, and
    each action's visits and summed value, both from the mover's side."""

    def __init__(self, state):
        self.state = state
        self.player = state.current_player()
        self.terminal = state.is_terminal()
        self.returns = np.asarray(state.returns()) if self.terminal else None
        self.children = {}  # action -> Node

    def expand(self, logits: np.ndarray, legal: np.ndarray, value: float) -> None:
        self.legal = legal
        self.logits = np.where(legal, logits, -np.inf)  # illegal moves are masked here too, whatever the net says
        self.prior = softmax(self.logits)
        self.value = value
        self.visits = np.zeros(len(legal))
        self.values = np.zeros(len(legal))


def softmax(logits: np.ndarray) -> np.ndarray:
    e = np.exp(logits - logits.max())
    return e / e.sum()


def considered_visits(considered: int, simulations: int) -> list[int]:
    """Sequential halving's schedule: the visit count of the root action simulation k visits (mctx's table).
    Each phase visits ``considered`` actions equally, then keeps the better half."""
    if considered <= 1:
        return list(range(simulations))
    phases = math.ceil(math.log2(considered))
    sequence = []
    visits = [0] * considered
    while len(sequence) < simulations:
        extra = max(1, int(simulations / (phases * considered)))
        for _ in range(extra):
            sequence.extend(visits[:considered])
            visits[:considered] = [v + 1 for v in visits[:considered]]
        considered = max(2, considered // 2)
    return sequence[:simulations]


class GumbelSearch:
    """Gumbel AlphaZero's search on B games at once. ``evaluate(boards, masks) -> (logits, values)`` is the net
    on a batch of positions (boards from the mover's seat, values from the mover's side)."""

    def __init__(self, game, evaluate, simulations: int, max_considered: int = 16):
        self.game = game
        self.observe = games.Observer(game)
        self.evaluate = evaluate
        self.simulations = simulations
        self.max_considered = max_considered

    def run(self, observations: dict, gumbel: np.ndarray) -> tuple[np.ndarray, np.ndarray, list[Node]]:
        """The actions, the improved policies (B, A) and the roots for a batch of observations, each root rebuilt
        from its ``moves``; ``gumbel`` (B, A): the root's Gumbel noise (zeros: greedy)."""
        roots = [Node(games.replay(self.game, moves)) for moves in observations["moves"]]
        masks = observations["action_mask"].astype(bool)
        logits, values = self.evaluate(observations["board"], masks)
        for root, row, legal, value in zip(roots, logits, masks, values, strict=True):
            if root.terminal or not legal.any():
                raise games.GameError("a search from a finished game: act on positions with a legal move")
            root.expand(row, legal, value)
        schedules = [considered_visits(min(self.max_considered, root.legal.sum()), self.simulations) for root in roots]
        for k in range(self.simulations):
            firsts = [self.root_action(root, g, s[k]) for root, g, s in zip(roots, gumbel, schedules, strict=True)]
            self.simulate(roots, firsts)
        actions = np.array([self.final_action(root, g) for root, g in zip(roots, gumbel, strict=True)], np.int64)
        policies = np.stack([self.improved_policy(root) for root in roots]).astype(np.float32)
        return actions, policies, roots

    def simulate(self, roots: list[Node], firsts: list[int]) -> None:
        """One simulation in every tree: descend, evaluate all new leaves in one forward pass, back up."""
        paths = [self.descend(root, action) for root, action in zip(roots, firsts, strict=True)]
        leaves = [path[-1][0].children[path[-1][1]] for path in paths]
        new = [leaf for leaf in leaves if not leaf.terminal]  # a tree's one non-terminal leaf is new
        if new:
            seen = [self.observe(leaf.state, leaf.player) for leaf in new]
            boards = np.stack([o["board"] for o in seen])
            masks = np.stack([o["action_mask"] for o in seen]).astype(bool)
            logits, values = self.evaluate(boards, masks)
            for leaf, row, legal, value in zip(new, logits, masks, values, strict=True):
                leaf.expand(row, legal, value)
        for path, leaf in zip(paths, leaves, strict=True):
            backup(path, leaf)

    def descend(self, root: Node, action: int) -> list[tuple[Node, int]]:
        """The path (node, action) from the root down to an unexpanded or terminal child, which it creates (a
        clone of its parent's state with the action applied) if the tree lacks it."""
        path = [(root, action)]
        node = root
        while action in node.children:
            child = node.children[action]
            if child.terminal:
                return path
            node = child
            action = self.interior_action(node)
            path.append((node, action))
        node.children[action] = self.new_child(node, action)
        return path

    def new_child(self, node: Node, action: int) -> Node:
        """The position after ``action``: a clone of the node's state, the action applied."""
        state = node.state.clone()
        state.apply_action(int(action))
        return Node(state)

    def root_action(self, root: Node, gumbel: np.ndarray, visits: int) -> int:
        """Sequential halving: among the considered actions with ``visits`` visits, the best by g + logits + sigma(q)
        (the unvisited best by g + logits at first: the Gumbel top-k)."""
        score = gumbel + root.logits + self.sigma_q(root)
        scheduled = np.where(root.visits == visits, score, -np.inf)
        return int(np.argmax(scheduled if np.isfinite(scheduled).any() else score))

    def final_action(self, root: Node, gumbel: np.ndarray) -> int:
        """The most visited considered action with the best g + logits + sigma(q)."""
        score = gumbel + root.logits + self.sigma_q(root)
        return int(np.argmax(np.where(root.visits == root.visits[root.legal].max(), score, -np.inf)))

    def interior_action(self, node: Node) -> int:
        """Below the root, deterministic: the action whose visit share lags the improved policy most."""
        lag = self.improved_policy(node) - node.visits / (1 + node.visits.sum())
        return int(np.argmax(np.where(node.legal, lag, -np.inf)))

    def improved_policy(self, node: Node) -> np.ndarray:
        """softmax(logits + sigma(completed q)): 0 on illegal moves."""
        return softmax(node.logits + self.sigma_q(node))

    @staticmethod
    def sigma_q(node: Node) -> np.ndarray:
        """sigma(completed q) (mctx's qtransform_completed_by_mix_value): visited actions' mean values, the others
        the mixed value (the net's value and the visited q under the prior), rescaled to [0, 1] over the legal."""
        visited = node.visits > 0
        q = node.values / np.maximum(node.visits, 1)
        total = node.visits.sum()
        mixed = node.value
        if total:
            prior = node.prior * visited
            mixed = (node.value + total * (prior @ q) / prior.sum()) / (1 + total)
        completed = np.where(visited, q, mixed)
        legal = completed[node.legal]
        low = legal.min()
        rescaled = (completed - low) / max(legal.max() - low, 1e-8)
        return (C_VISIT + node.visits.max()) * C_SCALE * rescaled


def backup(path: list[tuple[Node, int]], leaf: Node) -> None:
    """Add the leaf's value to every edge of the path, from the side of the player who chose it (negamax)."""
    if leaf.terminal:
        values = leaf.returns
    else:
        values = np.full(2, -leaf.value)
        values[leaf.player] = leaf.value
    for node, action in path:
        node.visits[action] += 1
        node.values[action] += values[node.player]


# -- the network ---------------------------------------------------------------------------------------------------
class Residual(nn.Module):
    def __init__(self, channels: int):
        super().__init__()
        self.conv1 = nn.Conv2d(channels, channels, 3, padding=1)
        self.conv2 = nn.Conv2d(channels, channels, 3, padding=1)

    def forward(self, x):
        return F.relu(x + self.conv2(F.relu(self.conv1(x))))


class PolicyValueNet(nn.Module):
    """A residual tower on the board's planes (C, H, W); policy logits over the actions, illegal ones at -1e9
    (no NaN in a cross-entropy whose target is 0 there), and a value in [-1, 1] from the mover's side."""

    def __init__(self, shape: tuple[int, int, int], actions: int, channels: int = 32, blocks: int = 2):
        super().__init__()
        planes, height, width = shape
        self.stem = nn.Conv2d(planes, channels, 3, padding=1)
        self.tower = nn.Sequential(*(Residual(channels) for _ in range(blocks)))
        self.policy = nn.Sequential(
            nn.Conv2d(channels, 2, 1), nn.ReLU(), nn.Flatten(), nn.Linear(2 * height * width, actions)
        )
        value = [nn.Conv2d(channels, 1, 1), nn.ReLU(), nn.Flatten(), nn.Linear(height * width, 64), nn.ReLU()]
        self.value = nn.Sequential(*value, nn.Linear(64, 1), nn.Tanh())

    def forward(self, boards: torch.Tensor, masks: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        x = self.tower(F.relu(self.stem(boards)))
        logits = self.policy(x).masked_fill(~masks, -1e9)
        return logits, self.value(x)[:, 0]


# -- the experiment --------------------------------------------------------------------------------------------------
def value_targets(rewards: np.ndarray, ended: np.ndarray, last_values: np.ndarray, seats: np.ndarray) -> np.ndarray:
    """(B, T) targets, each from its tick's mover: the rewards to the episode's end (gamma 1), or, for an episode
    still going at the session's end, to there plus ``last_values`` (B,), the value of the position after the last
    tick from its mover. ``rewards`` (B, T) are each tick's mover's; ``seats`` (B, T+1) the seat of each tick's
    mover: where the next tick is the other seat's, its target counts against this one (negamax)."""
    targets = np.zeros(rewards.shape, np.float32)
    following = last_values.astype(np.float32)
    for t in reversed(range(rewards.shape[1])):
        side = np.where(seats[:, t + 1] == seats[:, t], 1.0, -1.0).astype(np.float32)
        following = rewards[:, t] + np.where(ended[:, t], 0, side * following)
        targets[:, t] = following
    return targets


class AlphaZero(tinyverse.Experiment):
    def __init__(self, args: Args | None = None):
        self.args = a = args or Args()
        super().__init__(a)
        self.game_params = games.sized(a.game, a.board_size)
        self.game = games.load(a.game, **self.game_params)
        shape = tuple(self.game.observation_tensor_shape())
        if len(shape) != 3:
            raise games.GameError(f"{a.game}'s observation is {shape}, not planes (C, H, W): choose another game")
        self.net = PolicyValueNet(shape, self.game.num_distinct_actions(), a.channels, a.blocks)
        self.search = GumbelSearch(self.game, self.evaluate, a.simulations, a.max_considered)
        self.rng = np.random.default_rng()
        self.device = torch.device("cpu")  # the trainer's may differ (prepare_training)

    def make_env(self, render_mode=None):  # GameEnv renders text only: eval records no video
        a = self.args
        opponent = a.opponent
        if opponent == games.SELF and a.rated_games > 0:  # a share of the games against a fixed, named opponent
            rated = games.parse_opponent(a.rated_opponent, self.game)
            opponent = games.Mixture([games.SelfPlay(), rated], [1 - a.rated_games, a.rated_games])
        return games.GameEnv(a.game, opponent=opponent, **self.game_params)

    @torch.no_grad()
    def evaluate(self, boards: np.ndarray, masks: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The net on a batch of positions, as the search takes it: NumPy logits (N, A) and values (N,)."""
        logits, values = self.net(
            torch.as_tensor(boards, dtype=torch.float32), torch.as_tensor(masks, dtype=torch.bool)
        )
        return logits.numpy(), values.numpy()

    def act(self, observations, memory, greedy=False):
        B = len(observations["moves"])
        shape = (B, self.game.num_distinct_actions())
        gumbel = np.zeros(shape) if greedy else self.rng.gumbel(size=shape)
        self.search.simulations = self.args.simulations  # tunable: read at each move
        actions, policies, _ = self.search.run(observations, gumbel)
        return actions, memory, {"policy": policies}

    def prepare_training(self):
        self.device = pick_device()
        self.net.to(self.device)
        self.optimizer = torch.optim.AdamW(
            self.net.parameters(), self.args.learning_rate, weight_decay=self.args.weight_decay
        )

    def train_step(self, batch):
        obs = batch["observations"]
        T = batch["rewards"].shape[1]
        boards = torch.as_tensor(obs["board"], dtype=torch.float32, device=self.device)
        masks = torch.as_tensor(obs["action_mask"], dtype=torch.bool, device=self.device)
        with torch.no_grad():  # the bootstrap: the value of the position after the session's last tick
            last_values = self.net(boards[:, T], masks[:, T])[1].cpu().numpy()
        ended = batch["terminated"] | batch["truncated"]  # GameEnv never truncates: an episode's end either way
        targets = value_targets(batch["rewards"], ended, last_values, obs["seat"])
        targets = torch.as_tensor(targets, device=self.device)
        logits, values = self.net(boards[:, :T].flatten(0, 1), masks[:, :T].flatten(0, 1))
        policy = torch.as_tensor(batch["outputs.policy"], device=self.device).flatten(0, 1)
        policy_loss = -(policy * F.log_softmax(logits, -1)).sum(-1).mean()
        value_loss = F.mse_loss(values, targets.flatten())
        loss = policy_loss + self.args.value_coef * value_loss
        self.optimizer.zero_grad()
        loss.backward()
        self.optimizer.step()
        metrics = {"loss": loss.item(), "policy_loss": policy_loss.item(), "value_loss": value_loss.item()}
        return metrics | {"value": values.mean().item(), "target": targets.mean().item()}

    def get_params(self):
        return get_weights({"net": self.net})

    def set_params(self, params):
        load_weights({"net": self.net}, params)


def make_experiment(args: Args):
    return AlphaZero(args)
