"""Two-player board games of OpenSpiel as Gymnasium environments: the agent plays one seat, an opponent the other.

    pip install -e '.[games]'    # OpenSpiel; for GnuGo: apt-get install gnugo
    env = GameEnv("go", board_size=9, opponent="mcts:200", seed=0)  # or connect_four, tic_tac_toe, othello ...

The agent's seat (0 moves first: Black in Go) alternates by episode, so every measurement plays both colours;
``seat=0`` or ``seat=1`` fixes it. ``reset(seed=...)`` reseeds the opponent, never the alternation.
An observation is a Dict: ``board``, the game's observation tensor from the agent's seat (uint8 planes for the
games in BINARY, float32 for others; Go's planes are absolute: black, white, empty, white to play);
``action_mask``, 1 for each legal action; ``moves``, the actions so far padded with -1 to the game's maximum
length, from which ``replay`` rebuilds the position; ``seat``. Actions are ``Discrete(num_distinct_actions)``.
The reward is the mover's return (+1 win, -1 loss, 0 draw) at the end of the game (``terminated``).
An illegal action is never played: ``step`` raises IllegalMove and leaves the game as it was (mapping it to a
legal move would record one action and play another, and hide an agent that does not mask).
Opponents (``parse_opponent``): ``self``, self-play: the agent plays both seats, each observation from the seat
to move, the reward from the seat that made the last move; ``random``; ``mcts:N``, OpenSpiel's C++ MCTS;
``gnugo:L``, GnuGo at level L over GTP (opponents.py); a callable ``policy(obs) -> action``; ``Drawn`` (a policy
drawn at each reset) and ``Mixture`` (an opponent drawn at each reset); or an object with ``reset(seat, seed)``,
``move(state) -> action`` (None resigns: the agent wins), ``close()`` and a ``name``, which every step's and
reset's info carries as ``info["opponent"]`` (tinyverse stores each game's result by it), but in self-play.
Go: komi 7.5, Tromp-Taylor scoring, a repeated position a draw.
"""

import gymnasium as gym
import numpy as np

from tinyverse import TinyverseError

try:
    import pyspiel
    from open_spiel.python.observation import make_observation
except ImportError:
    raise ImportError("the board games need OpenSpiel: pip install -e '.[games]'", name="pyspiel") from None
from opponents import MCTS, GnuGo, Opponent, Random  # noqa: E402  (after the hint: it imports pyspiel too)

BINARY = ("go", "tic_tac_toe", "connect_four", "othello", "breakthrough", "hex")  # 0/1 planes: a uint8 board
# Go ends at two passes in a row, or at this many moves a point: OpenSpiel's default (2 a point: 162 on 9x9) cut
# 16% of 1,000 random 9x9 games short, each scored mid-fight; 4 a point (324) cut 0.5%. Random play is where every
# learner starts; the moves array grows with it (324 int16, 648 bytes an observation).
GO_MOVES_A_POINT = 4
SIZED = ("go", "hex")  # games whose board_size go.py's and alphazero.py's board_size sets (a square board)
SELF = "self"  # the opponent of self-play: none, the agent plays both seats


class GameError(TinyverseError):
    """A game OpenSpiel does not have or this env cannot play, a bad opponent spec, a step after the end."""


class IllegalMove(GameError):
    """An action that is not legal here; the game is as it was."""


def sized(game: str, board_size: int) -> dict:
    """The params a ``board_size`` setting gives ``game``: its side for the games of SIZED, none for the others."""
    return {"board_size": board_size} if game in SIZED else {}


def load(game: str, **params) -> "pyspiel.Game":
    """The OpenSpiel game ``game`` with ``params``; Go defaults to 9x9, komi 7.5, 4 moves a point at most."""
    if game not in pyspiel.registered_names():
        raise GameError(f"OpenSpiel has no game {game!r}: choose one of {', '.join(BINARY)} (or another of its own)")
    if game == "go":
        params = {"board_size": 9, "komi": 7.5, **params}
        params.setdefault("max_game_length", GO_MOVES_A_POINT * params["board_size"] ** 2)
    try:
        loaded = pyspiel.load_game(game, params)
    except pyspiel.SpielError as e:
        raise GameError(f"{game} with {params}: {str(e).splitlines()[0]}: fix the parameters") from None
    kind = loaded.get_type()
    if not (
        loaded.num_players() == 2
        and kind.dynamics == pyspiel.GameType.Dynamics.SEQUENTIAL
        and kind.chance_mode == pyspiel.GameType.ChanceMode.DETERMINISTIC
        and kind.information == pyspiel.GameType.Information.PERFECT_INFORMATION
        and kind.provides_observation_tensor
    ):
        raise GameError(f"{game} is not a two-player turn-based game of perfect information without chance")
    return loaded


class Observer:
    """What a seat sees of a game's states: ``space``, and each state's Dict (for the agent or a policy)."""

    def __init__(self, game: "pyspiel.Game"):
        # fills one float32 buffer in place: 10x faster than observation_tensor's list of floats
        self.tensor = make_observation(game)
        actions = game.num_distinct_actions()
        shape = game.observation_tensor_shape()
        binary = game.get_type().short_name in BINARY
        board = gym.spaces.Box(0, 1, shape, np.uint8) if binary else gym.spaces.Box(-np.inf, np.inf, shape, np.float32)
        moves = gym.spaces.Box(-1, actions - 1, (game.max_game_length(),), np.int16 if actions < 2**15 else np.int32)
        mask = gym.spaces.Box(0, 1, (actions,), np.int8)
        self.space = gym.spaces.Dict(board=board, action_mask=mask, moves=moves, seat=gym.spaces.Discrete(2))
        self.board = board  # read at every move: outside the Dict space, whose lookups showed in profiles
        self.no_moves = np.full(moves.shape, -1, moves.dtype)

    def __call__(self, state: "pyspiel.State", seat: int) -> dict:
        self.tensor.set_from(state, seat)
        history = state.history()
        moves = self.no_moves.copy()
        moves[: len(history)] = history
        return {
            "board": self.tensor.tensor.reshape(self.board.shape).astype(self.board.dtype),
            "action_mask": np.asarray(state.legal_actions_mask(seat), np.int8),
            "moves": moves,
            "seat": np.int64(seat),
        }


def replay(game: "pyspiel.Game", moves: np.ndarray) -> "pyspiel.State":
    """The position after ``moves`` (an observation's, padded with -1): what a search starts from."""
    state = game.new_initial_state()
    for action in moves[moves >= 0]:
        state.apply_action(int(action))
    return state


class Policy(Opponent):
    """A callable ``policy(obs) -> action`` of its own seat's view."""

    name = "policy"

    def __init__(self, policy, game: "pyspiel.Game"):
        self.policy = policy
        self.observe = Observer(game)

    def move(self, state: "pyspiel.State") -> int | None:
        action = self.policy(self.observe(state, state.current_player()))
        return None if action is None else int(action)


class Drawn(Policy):
    """A policy drawn anew at each reset by ``draw() -> (name, policy) | None`` (a stored snapshot of the agent,
    named ``vN``: a league), which plays its own seat's view; uniform random play, named ``random``, while it
    draws none."""

    def __init__(self, draw, game: "pyspiel.Game"):
        super().__init__(None, game)
        self.draw = draw
        self.fallback = Random()
        self.name = "random"

    def reset(self, seat: int, seed: int) -> None:
        self.fallback.reset(seat, seed)
        drawn = self.draw()
        self.name, self.policy = ("random", None) if drawn is None else drawn

    def move(self, state: "pyspiel.State") -> int | None:
        return self.fallback.move(state) if self.policy is None else super().move(state)


class SelfPlay(Opponent):
    """The opponent ``self``: none. GameEnv leaves both seats to the agent in a game whose opponent is named so."""

    name = SELF

    def move(self, state: "pyspiel.State") -> int | None:
        raise GameError("self-play has no opponent to move: GameEnv leaves both seats to the agent")


class Mixture(Opponent):
    """At each reset, one of ``opponents`` drawn with probabilities ``weights``: it plays that game and names it
    (``self``: the agent plays both seats of that game)."""

    def __init__(self, opponents: list, weights: list[float]):
        if len(opponents) != len(weights) or min(weights) < 0 or sum(weights) <= 0:
            raise GameError(f"a mixture of {len(opponents)} opponents, weights {weights}: give each a weight >= 0")
        self.opponents = opponents
        self.weights = np.asarray(weights, np.float64) / sum(weights)
        self.current = opponents[0]

    @property
    def name(self) -> str:
        return self.current.name

    def reset(self, seat: int, seed: int) -> None:
        rng = np.random.default_rng(seed)
        self.current = self.opponents[rng.choice(len(self.opponents), p=self.weights)]
        self.current.reset(seat, int(rng.integers(2**31)))

    def move(self, state: "pyspiel.State") -> int | None:
        return self.current.move(state)

    def close(self) -> None:
        for opponent in self.opponents:
            opponent.close()


def parse_opponent(spec, game: "pyspiel.Game"):
    """An opponent from ``self``, ``random``, ``mcts:SIMULATIONS``, ``gnugo:LEVEL`` (Go), a callable or an
    opponent."""
    if hasattr(spec, "move"):
        return spec
    if callable(spec):
        return Policy(spec, game)
    name, _, arg = str(spec).partition(":")
    if spec == SELF:
        return SelfPlay()
    if name == "random" and not arg:
        return Random()
    if name == "mcts" and arg.isdigit() and int(arg) > 0:
        return MCTS(game, int(arg))
    if name == "gnugo" and arg.isdigit():
        return GnuGo(game, int(arg))
    raise GameError(f"opponent {spec!r}: choose self, random, mcts:SIMULATIONS or gnugo:LEVEL, e.g. mcts:200")


class GameEnv(gym.Env):
    """``game`` (``load``'s name and parameters) against ``opponent`` (``parse_opponent``'s); see the module."""

    metadata = {"render_modes": ["ansi"]}
    render_mode = "ansi"  # render() returns the board as text

    def __init__(self, game="go", opponent="random", seat=None, seed=None, **params):
        if seat not in (None, 0, 1):
            raise GameError(f"seat={seat!r}: choose 0 (moves first), 1, or None to alternate by episode")
        self.game = load(game, **params)
        self.observe = Observer(self.game)
        self.action_space = gym.spaces.Discrete(self.game.num_distinct_actions())
        self.observation_space = self.observe.space
        self.opponent = parse_opponent(opponent, self.game)
        self.fixed_seat = seat
        self.first_seed = seed  # the first reset's, unless it gets its own
        self.episodes = 0
        self.state = None  # no game before the first reset

    def reset(self, *, seed=None, options=None):
        super().reset(seed=self.first_seed if seed is None else seed)
        self.first_seed = None
        self.seat = self.episodes % 2 if self.fixed_seat is None else self.fixed_seat
        self.episodes += 1
        self.state = self.game.new_initial_state()
        self.resigned = False
        self.opponent.reset(self.seat, int(self.np_random.integers(2**31)))
        if self.opponent.name == SELF:  # self-play: the agent has the seat to move, whichever it is
            self.seat = self.state.current_player()
        self._opponent_moves()
        return self.observe(self.state, self.seat), self._named({"seat": self.seat})

    def step(self, action):
        if self.state is None or self._over():
            raise GameError("step() after the game ended: call reset() first")
        if not (0 <= action < self.action_space.n and self.state.legal_actions_mask(self.seat)[action]):
            raise IllegalMove(f"action {action} is illegal here: choose one that obs['action_mask'] marks 1")
        mover = self.seat
        self.state.apply_action(int(action))
        if self.opponent.name == SELF and not self.state.is_terminal():
            self.seat = self.state.current_player()  # the agent moves again, on the other seat (or the same)
        self._opponent_moves()  # none in self-play: the seat to move is the agent's
        info = self._named({"seat": self.seat, "resigned": self.resigned})
        return self.observe(self.state, self.seat), self._reward(mover), self._over(), False, info

    def _named(self, info: dict) -> dict:
        """``info`` with ``opponent``, the opponent's name, by which tinyverse rates the game's result; a self-play
        game names none: it has no opponent, and its reward is the last mover's, not the agent's against anyone;
        nor does an opponent named None (the agent itself on the other seat, as alphazero.py's ``self``)."""
        return info if self.opponent.name in (SELF, None) else info | {"opponent": self.opponent.name}

    def _opponent_moves(self) -> None:
        """Let the opponent move until it is the agent's turn, the game ends, or it resigns."""
        while not self.state.is_terminal() and self.state.current_player() != self.seat:
            action = self.opponent.move(self.state)
            if action is None:
                self.resigned = True
                return
            if action not in self.state.legal_actions():
                raise GameError(f"the opponent chose the illegal action {action}: fix {type(self.opponent).__name__}")
            self.state.apply_action(int(action))

    def _reward(self, mover: int) -> float:
        """The return of ``mover``, the seat that made the last move (the agent's), at the end (an opponent that
        resigns loses), 0 before. In self-play the observation at the end is the mover's too."""
        if self.resigned:
            return 1.0
        return self.state.returns()[mover] if self.state.is_terminal() else 0.0

    def _over(self) -> bool:
        return self.resigned or self.state.is_terminal()

    def render(self) -> str:
        return str(self.state)

    def close(self) -> None:
        self.opponent.close()
