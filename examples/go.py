"""DQN on OpenSpiel's two-player board games (games.py), Go 9x9 by default, learnt by self-play, in PyTorch.

    pip install -e '.[examples,games]'
    python -m tinyverse examples/go.py run                                # Go 9x9; --set game=connect_four ...
    python -m tinyverse examples/go.py eval -n 50 --opponent random    # or mcts:200, gnugo:1, league, v120

dqn.py's improvements on a board: double Q-learning, dueling heads, n-step returns and Ape-X's spread of epsilons,
illegal moves masked in the greedy move, in exploration (uniform over the legal ones) and in the bootstrap's max.
The net: a few 3x3 convolutions on the board's planes and a plane of the seat to move. Self-play (``opponent``
self): the agent plays both seats, each tick a move seen from the mover's side, and the target is negamax's
(``negamax_transitions``): the next position's value counts against the mover where the other seat moves next.
``league_games`` of the games are played against an older version of the agent instead: one of the ``vN``
snapshots the trainers keep, drawn at each game (``league``). ``tightening``: optimality tightening (He et al.
2016, https://arxiv.org/abs/1611.01606), bounds on Q from the session's longer returns and earlier ticks
(``tightening_bounds``). Design and measured results: docs/examples.rst.
"""

from dataclasses import dataclass

import games
import gymnasium as gym
import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
from common import derive_pace, get_weights, load_weights

import tinyverse
from tinyverse import explore, nstep_transitions

BUILTIN = ("self", "random", "mcts", "gnugo")  # opponents games.py makes from their spec; others are stored params
CACHED_NETS = 8  # networks of stored versions a player keeps loaded for its league opponents


@dataclass
class Args(tinyverse.Settings):
    TUNABLE = ("learning_rate", "tau", "eps_start", "eps_updates", "tightening_penalty")  # tune --set: read each step
    game: str = "go"
    """an OpenSpiel two-player game with a board of planes: go, tic_tac_toe, connect_four, othello, ..."""
    board_size: int = 9
    """the side of Go's and Hex's board (games.SIZED; other games ignore it)"""
    opponent: str = "self"
    """the other seat: self (the agent, both seats), league (a stored version drawn at each game), latest, vN or a
    snapshot's name, random, mcts:SIMULATIONS, gnugo:LEVEL (eval --opponent NAME: another, for that eval only)"""
    league_games: float = 0.2
    """with opponent self: the share of games played against a league opponent instead"""
    league_pick: str = "uniform"
    """how the league draws a kept version: uniform, or weighted towards those the agent scores least against"""
    channels: int = 32
    """channels of each 3x3 convolution"""
    layers: int = 4
    """3x3 convolutions (4: each point sees the whole 9x9 board)"""
    hidden: int = 64
    """units of the value stream's hidden layer"""
    learning_rate: float = 2.5e-4
    """Adam step size (at 5e-4 the greedy agent's score against random swung 0.89-0.97 between versions)"""
    gamma: float = 0.99
    """discount factor (below 1: a quicker win is worth more)"""
    n_step: int = 3
    """n of n-step returns, each reward signed from the first mover's side"""
    tau: float = 0.005
    """target net update rate: target += tau x (online - target) after every update"""
    max_grad_norm: float = 10.0
    """gradient clipping (global L2 norm)"""
    eps_start: float = 1.0
    """exploration epsilon before any update"""
    eps_end: float = 0.05
    """exploration epsilon of a lone player after eps_updates updates"""
    eps_spread: float = 7.0
    """Ape-X: the spread of the players' final epsilons around eps_end"""
    eps_updates: int = 3000
    """updates over which epsilon decays linearly"""
    tightening: bool = False
    """optimality tightening: penalize Q outside the bounds of the session's other ticks"""
    tightening_steps: int = 4
    """K: ticks forward and back the bounds reach"""
    tightening_penalty: float = 4.0
    """lambda: weight of the squared violations of the bounds"""
    max_reuse: float = 8.0
    """the pace: times each recorded move is trained on, on average (sets updates_per_step when left None)"""
    buffer_transitions: int = 100_000
    """moves the database keeps (sets buffer_size when left None)"""
    # the core's settings (tinyverse.Settings) this file sets otherwise
    session_length: int = 16
    """moves a recorded session"""
    train_batch_size: int = 32
    """sessions a minibatch (default of train -b)"""
    play_batch_size: int = 16
    """games a player plays at once (default of play -b): one forward pass a move for all of them"""
    learning_starts: int = 2000
    """moves played before the first update"""
    updates_per_step: float | None = None
    """the pace: updates a move played (None: max_reuse / the moves of an update)"""
    pace_slack: int | None = None
    """moves either side may run ahead of the pace (None: the moves of an update)"""
    save_every: int = 50
    """updates between publications"""
    keep_every: int = 20
    """a league: every 20th version kept as a snapshot vN (1,000 updates, 1-2 minutes on 2 cores)"""
    local_params: tuple[str, ...] = ("target.*",)
    """params each trainer keeps its own of: with several trainers, the target net"""

    def __post_init__(self):
        """The pace and the buffer from max_reuse and buffer_transitions, where left None."""
        derive_pace(self, slack=self.train_batch_size * self.session_length)  # an update's moves ahead at most
        if self.buffer_size is None:
            self.buffer_size = max(1, self.buffer_transitions // self.session_length)


def negamax_transitions(batch: dict, n: int, gamma: float) -> tinyverse.Transitions:
    """nstep_transitions from the side of each tick's mover, for games whose seats may alternate.

    Tick t's observation is from the seat to move, sigma_t = ``observations["seat"][:, t]``, and its reward r_t is
    that seat's (GameEnv: the return of the seat that made the move). Seats are absolute (0 moves first), so
    r_t (1 - 2 sigma_t) is the reward from seat 0's side; n-step returns summed on that side and multiplied by
    (1 - 2 sigma_t) again are from the first mover's side, each reward signed by who got it:

        y_t = sum_k<m gamma^k s_k r_t+k  +  gamma^m s_m max_a' Q(s_t+m, a')
        s_k = +1 where sigma_t+k = sigma_t: the same seat moves again (a game against a fixed opponent, whose
              moves happen inside the env); -1 where the other seat moves (self-play, every other tick)

    as Q(s, a) of the mover is r + gamma s' max_a' Q(s', a'), the value of s' for its own mover, against the
    first mover when that is the other seat (negamax). The bootstrap's sign s_m is folded into ``discounts``
    (negative where the seat to move at s_t+m is the other one): ``returns + discounts * max_a' Q(s', a')`` is the
    target as for one player. m <= n stops where the episode or the session ends, as in nstep_transitions; a
    terminated game is not bootstrapped (discount 0). ``batch``: train_step's, observations nested.
    """
    seats = batch["observations"]["seat"]
    T = batch["rewards"].shape[1]
    side = (1 - 2 * seats[:, :T]).astype(np.float32)  # +1 where seat 0 moves, -1 where seat 1 does
    t = nstep_transitions(batch | {"rewards": batch["rewards"] * side}, n, gamma)
    next_side = (1 - 2 * t.next_observations["seat"]).astype(np.float32)
    return t._replace(returns=t.returns * side, discounts=t.discounts * side * next_side)


def tightening_bounds(rewards, seats, ended, terminated, values, taken, gamma: float, steps: int):
    """Optimality tightening's bounds on Q(s_t, a_t) within a session: (lower, upper), each (B, T), -inf and +inf
    where none holds.

    ``rewards`` (B, T), each from its mover's side; ``seats`` (B, T+1); ``ended``, ``terminated`` (B, T);
    ``values`` (B, T+1): max_a Q(s_t, a) over the legal moves; ``taken`` (B, T): Q(s_t, a_t) (the target net's);
    ``steps``: K. With c_i = +1 where tick t+i's seat is tick t's and -1 where it is the other one,

        R_k = sum_i<k gamma^i c_i r_t+i + gamma^k c_k V(s_t+k)       (no V where the game ended at t+k-1)

    Q(s, a) = r + gamma c max_a' Q(s', a') >= r + gamma c Q(s', a') of the move played where c = +1, <= where -1:
    R_k (k >= 2) bounds Q(s_t, a_t) from below where c_1 .. c_k-1 are all +1 (one seat moving throughout: the
    paper's case, a game against a fixed opponent), from above where they are all -1 (the other seat: in
    self-play R_2 = r_t - gamma r_t+1 + gamma^2 V(s_t+2)), not at all where they mix. From an earlier tick
    u = t - k likewise Q(s_u, a_u) >= or <= S + gamma^k c_k Q(s_t, a_t), S = sum_i<k gamma^i c_i r_u+i (c from
    seat u's side): both give the upper bound c_k (Q(s_u, a_u) - S) / gamma^k where c_1 .. c_k are all +1 or all
    -1. Only ticks of one episode count.
    """
    B, T = rewards.shape
    powers = gamma ** np.arange(steps + 1, dtype=np.float64)
    lower = np.full((B, T), -np.inf)
    upper = np.full((B, T), np.inf)
    for k in range(1, min(steps, T) + 1):
        # forward: R_k of the ticks t whose k ticks t .. t+k-1 lie in the session
        t = np.arange(T - k + 1)
        window = t[:, None] + np.arange(k + 1)  # (ticks, k+1): t .. t+k
        c = np.where(seats[:, window] == seats[:, t, None], 1.0, -1.0)  # (B, ticks, k+1)
        summed = (powers[:k] * c[..., :k] * rewards[:, window[:, :k]]).sum(-1)
        last = t + k - 1
        boot = np.where(terminated[:, last], 0.0, powers[k] * c[..., k] * values[:, t + k])
        bound = summed + boot
        alive = ~ended[:, window[:, : k - 1]].any(-1) & (terminated[:, last] | ~ended[:, last])  # not truncated
        if k >= 2:
            below = alive & (c[..., 1:k] > 0).all(-1)
            above = alive & (c[..., 1:k] < 0).all(-1)
            lower[:, t] = np.where(below, np.maximum(lower[:, t], bound), lower[:, t])
            upper[:, t] = np.where(above, np.minimum(upper[:, t], bound), upper[:, t])
        # backward: tick t = u + k from each earlier tick u, its k ticks u .. t-1 in one episode
        u = np.arange(T - k)
        window = u[:, None] + np.arange(k + 1)  # u .. t
        c = np.where(seats[:, window] == seats[:, u, None], 1.0, -1.0)
        summed = (powers[:k] * c[..., :k] * rewards[:, window[:, :k]]).sum(-1)
        bound = c[..., k] * (taken[:, u] - summed) / powers[k]
        alike = (c[..., 1:] > 0).all(-1) | (c[..., 1:] < 0).all(-1)
        ok = alike & ~ended[:, window[:, :k]].any(-1)
        upper[:, u + k] = np.where(ok, np.minimum(upper[:, u + k], bound), upper[:, u + k])
    return lower.astype(np.float32), upper.astype(np.float32)


class QNet(nn.Module):
    """Q(s, .) from the mover's side: 3x3 convolutions on the board's planes (C, H, W) and a plane of the seat to
    move, then dueling streams, V (1x1 convolution, a hidden layer) and A (1x1 convolution to 2 planes, linear)."""

    def __init__(self, shape: tuple[int, int, int], actions: int, channels: int, layers: int, hidden: int):
        super().__init__()
        planes, height, width = shape
        convs = [nn.Conv2d(planes + 1, channels, 3, padding=1), nn.ReLU()]
        for _ in range(layers - 1):
            convs += [nn.Conv2d(channels, channels, 3, padding=1), nn.ReLU()]
        self.trunk = nn.Sequential(*convs)
        self.value = nn.Sequential(
            nn.Conv2d(channels, 1, 1), nn.ReLU(), nn.Flatten(), nn.Linear(height * width, hidden), nn.ReLU()
        )
        self.value_out = nn.Linear(hidden, 1)
        self.advantage = nn.Sequential(nn.Conv2d(channels, 2, 1), nn.ReLU(), nn.Flatten())
        self.advantage_out = nn.Linear(2 * height * width, actions)

    def forward(self, boards: torch.Tensor, seats: torch.Tensor) -> torch.Tensor:
        seat = seats.to(torch.float32)[:, None, None, None].expand(-1, 1, *boards.shape[2:])
        x = self.trunk(torch.cat([boards.to(torch.float32), seat], 1))
        a = self.advantage_out(self.advantage(x))
        return self.value_out(self.value(x)) + a - a.mean(1, keepdim=True)


def masked(q: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Q with the illegal moves at -inf."""
    return q.masked_fill(~mask, -torch.inf)


class GoDQN(tinyverse.Experiment):
    def __init__(self, db=None, args: Args | None = None):
        self.args = a = args or Args()
        super().__init__(a)
        self.db = db  # where the league's snapshots are drawn from (None: no league)
        self.game_params = games.sized(a.game, a.board_size)
        self.game = games.load(a.game, **self.game_params)
        if a.league_pick not in ("uniform", "weighted"):
            raise games.GameError(f"league_pick={a.league_pick!r}: choose uniform or weighted")
        self.shape = tuple(self.game.observation_tensor_shape())
        if len(self.shape) != 3:
            raise games.GameError(f"{a.game}'s observation is {self.shape}, not planes (C, H, W): choose another game")
        self.actions = self.game.num_distinct_actions()
        self.q, self.target = self.net(), self.net()
        self.target.load_state_dict(self.q.state_dict())
        self.updates = 0  # trainer updates so far, shared through params
        self.layout = self.get_params()  # what stored params of a league opponent must match
        self.rng = np.random.default_rng()
        self.final_epsilon = explore.apex_epsilon(a.eps_end, a.eps_spread, *explore.player_slot())
        self.nets = {}  # version -> the network of a league opponent (CACHED_NETS at most)

    def net(self) -> QNet:
        return QNet(self.shape, self.actions, self.args.channels, self.args.layers, self.args.hidden)

    # -- the environment and its opponents -------------------------------------------------------------------------
    def make_env(self, render_mode=None):  # GameEnv renders text only: eval records no video
        a = self.args
        opponent = self.opponent(a.opponent)
        if a.opponent == games.SELF and a.league_games > 0:
            parts = [games.SelfPlay(), self.opponent("league")]
            opponent = games.Mixture(parts, [1 - a.league_games, a.league_games])
        env = games.GameEnv(a.game, opponent=opponent, **self.game_params)
        # the moves so far are for a search to replay; the Q-net reads the board (410 bytes a 9x9 move, not 1,060)
        return gym.wrappers.FilterObservation(env, ["board", "action_mask", "seat"])

    def opponent(self, spec: str):
        """games.py's opponent spec as it is, or a Drawn opponent playing this network with stored params: league
        (drawn at each game among the kept versions vN, else the latest params, else random play), latest, or a
        fixed snapshot's name or vN (looked up once)."""
        if spec.partition(":")[0] in BUILTIN:
            return spec
        if spec in ("league", "latest"):
            return games.Drawn(lambda: self.draw(spec), self.game)
        found = None if self.db is None else self.db.find_params(spec)
        if found is None:
            fix = "choose one that info lists, league, latest, or self, random, mcts:SIMULATIONS, gnugo:LEVEL"
            raise games.GameError(f"opponent {spec!r}: no such params in the database: {fix}")
        fixed = self.greedy_policy(*found)
        return games.Drawn(lambda: fixed, self.game)

    def draw(self, spec: str) -> tuple | None:
        """A league opponent's (name, policy) for the next game: a kept version drawn as ``league_pick`` says
        (league), else the latest params; None (random play) while none are stored."""
        if self.db is None:
            return None
        found = self.db.draw_params(self.args.league_pick) if spec == "league" else None
        found = found or self.db.find_params("latest")
        return None if found is None else self.greedy_policy(*found)

    def greedy_policy(self, version: int, params: dict) -> tuple:
        """(``vN``, the greedy masked policy of this network with these params on one observation)."""
        net = self.nets.get(version)
        if net is None:
            where = f"the database (prefix {self.db.prefix}), version {version} drawn as an opponent"
            tinyverse.check_params(self.layout, params, where, "choose another opponent, or use another --prefix")
            net = self.net()
            load_weights({"q": net}, params)
            if len(self.nets) >= CACHED_NETS:
                self.nets.pop(next(iter(self.nets)))  # the oldest loaded
            self.nets[version] = net

        @torch.no_grad()
        def policy(obs: dict) -> int:
            q = net(torch.as_tensor(obs["board"])[None], torch.as_tensor(obs["seat"])[None])
            return int(masked(q, torch.as_tensor(obs["action_mask"], dtype=torch.bool)[None]).argmax())

        return f"v{version}", policy

    # -- players -----------------------------------------------------------------------------------------------------
    def epsilon(self) -> float:
        # decays with trainer updates, not this player's moves: exploration shrinks as the Q-function learns
        return explore.linear(self.args.eps_start, self.final_epsilon, self.updates / self.args.eps_updates)

    @torch.no_grad()
    def act(self, observations, memory, greedy=False):
        q = self.q(torch.as_tensor(observations["board"]), torch.as_tensor(observations["seat"])).numpy()
        epsilon = 0.0 if greedy else self.epsilon()
        return explore.epsilon_greedy(q, epsilon, self.rng, observations["action_mask"]), memory

    def session_info(self):
        return {"epsilon": self.epsilon()}

    # -- trainer -----------------------------------------------------------------------------------------------------
    def prepare_training(self):
        self.optimizer = torch.optim.Adam(self.q.parameters(), lr=self.args.learning_rate, fused=True)
        self.pairs = list(self.target.parameters()), list(self.q.parameters())  # for Polyak averaging

    def train_step(self, batch):
        a = self.args
        B, T = batch["rewards"].shape
        obs = batch["observations"]
        t = negamax_transitions(batch, a.n_step, a.gamma)
        boards = torch.as_tensor(obs["board"]).flatten(0, 1)
        seats = torch.as_tensor(obs["seat"]).flatten(0, 1)
        legal = torch.as_tensor(obs["action_mask"], dtype=torch.bool)  # (B, T+1, A)
        # one forward of each net over all T+1 positions: Q(s_t, a_t), and the bootstrap's s_t+m among them
        q_all = self.q(boards, seats).view(B, T + 1, -1)
        with torch.no_grad():
            target_all = self.target(boards, seats).view(B, T + 1, -1)
            # double Q at s' = s_t+m: the online net picks among the legal moves, the target net values the pick;
            # GameEnv never truncates, so an episode cut in the session terminated: no bootstrap (index -1)
            rows = torch.arange(B)[:, None]
            index = torch.as_tensor(t.next_index).clamp(min=0)
            pick = masked(q_all.detach()[rows, index], legal[rows, index]).argmax(-1, keepdim=True)
            value = target_all[rows, index].gather(-1, pick).squeeze(-1)
            discounts = torch.as_tensor(np.where(t.next_index < 0, 0, t.discounts))
            y = torch.as_tensor(t.returns) + discounts * value
        actions = torch.as_tensor(t.actions, dtype=torch.int64)[..., None]
        q = q_all[:, :T].gather(-1, actions).squeeze(-1)
        td = F.mse_loss(q, y)
        loss = td
        metrics = {"td_loss": td.item()}
        if a.tightening:
            penalty = self.tightening_penalty(batch, q, target_all, legal, actions)
            loss = loss + a.tightening_penalty * penalty
            metrics["tightening"] = penalty.item()
        for group in self.optimizer.param_groups:  # tunable: a tune --set reaches the next step
            group["lr"] = a.learning_rate
        self.optimizer.zero_grad()
        loss.backward()
        nn.utils.clip_grad_norm_(self.q.parameters(), a.max_grad_norm)
        self.optimizer.step()
        with torch.no_grad():  # Polyak averaging of the target net
            torch._foreach_lerp_(*self.pairs, a.tau)
        self.updates += max(1, round(B / a.train_batch_size))  # counted as the pace counts
        return metrics | {"loss": loss.item(), "q": q.mean().item(), "target": y.mean().item()}

    def tightening_penalty(self, batch, q, target_all, legal, actions) -> torch.Tensor:
        """Mean squared violation of optimality tightening's bounds by Q(s_t, a_t) (``tightening_bounds``, the
        target net's values)."""
        T = q.shape[1]
        best = masked(target_all, legal).max(-1).values
        values = torch.where(legal.any(-1), best, 0.0).numpy()
        taken = target_all[:, :T].gather(-1, actions).squeeze(-1).numpy()
        seats = batch["observations"]["seat"]
        terminated = batch["terminated"]
        ended = terminated | batch["truncated"]
        a = self.args
        bounds = tightening_bounds(
            batch["rewards"], seats, ended, terminated, values, taken, a.gamma, a.tightening_steps
        )
        lower, upper = (torch.as_tensor(b) for b in bounds)
        below = torch.where(lower.isfinite(), F.relu(lower - q), 0.0)
        above = torch.where(upper.isfinite(), F.relu(q - upper), 0.0)
        return (below.square() + above.square()).mean()

    # -- params ------------------------------------------------------------------------------------------------------
    def get_params(self):
        return get_weights({"q": self.q, "target": self.target}) | {"updates": np.array(self.updates, np.int64)}

    def set_params(self, params):
        load_weights({"q": self.q, "target": self.target}, params)
        self.updates = int(params["updates"])


def make_experiment(db, args: Args):
    return GoDQN(db, args)
