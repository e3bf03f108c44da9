"""The opponents of games.GameEnv that need no agent: uniform random, OpenSpiel's MCTS, GnuGo over GTP.

Each is an ``Opponent``: ``reset(seat, seed)``, ``move(state) -> action`` (None resigns), ``close()``, and a
``name``, the spec that makes it (``random``, ``mcts:200``, ``gnugo:1``), which GameEnv puts in every info.
GnuGo is Debian's ``apt-get install gnugo``, in /usr/games, off root's PATH.
"""

import os
import select
import subprocess
import time

import numpy as np
import pyspiel

from tinyverse import TinyverseError

MCTS_MEMORY_MB = 256  # the tree of a few thousand simulations takes a few MB
GNUGO = "/usr/games/gnugo"
COLUMNS = "ABCDEFGHJKLMNOPQRST"  # GTP's (and OpenSpiel's) Go columns skip the letter I
COLOURS = "BW"  # player 0 is Black


class EngineError(TinyverseError):
    """A Go engine that cannot be started, does not answer in time, or refuses a move."""


class Opponent:
    """What games.GameEnv asks of an opponent; this base does nothing between moves."""

    name = "opponent"  #: who plays, as GameEnv's info["opponent"] says it: set by each kind (at reset, if drawn)

    def reset(self, seat: int, seed: int) -> None:
        """A new game, in which the opponent plays ``1 - seat``; ``seed`` seeds its randomness, if any."""

    def move(self, state: "pyspiel.State") -> int | None:
        """Its action in ``state`` (its turn), or None to resign."""
        raise NotImplementedError

    def close(self) -> None:
        """Free what it holds (a subprocess)."""


class Random(Opponent):
    """Uniform over the legal moves."""

    name = "random"

    def reset(self, seat: int, seed: int) -> None:
        self.rng = np.random.default_rng(seed)

    def move(self, state: "pyspiel.State") -> int:
        legal = state.legal_actions()
        return legal[self.rng.integers(len(legal))]


class MCTS(Opponent):
    """OpenSpiel's C++ MCTS: ``simulations`` a move, each one random rollout, solving what it can reach."""

    def __init__(self, game: "pyspiel.Game", simulations: int, uct_c: float = 2.0):
        self.game = game
        self.simulations = simulations
        self.uct_c = uct_c
        self.name = f"mcts:{simulations}"

    def reset(self, seat: int, seed: int) -> None:
        self.evaluator = pyspiel.RandomRolloutEvaluator(1, seed)  # kept here: the bot holds it by reference
        self.bot = pyspiel.MCTSBot(
            self.game, self.evaluator, self.uct_c, self.simulations, MCTS_MEMORY_MB, True, seed, False
        )

    def move(self, state: "pyspiel.State") -> int:
        return self.bot.step(state)


def vertex(action: int, size: int) -> str:
    """The GTP vertex of an OpenSpiel Go action: row-major from A1 (0) on, ``size * size`` is pass."""
    return "pass" if action == size * size else f"{COLUMNS[action % size]}{action // size + 1}"


def action(name: str, size: int) -> int:
    """The OpenSpiel Go action of a GTP vertex (``pass`` included, any case)."""
    if name.lower() == "pass":
        return size * size
    return (int(name[1:]) - 1) * size + COLUMNS.index(name[0].upper())


class GnuGo(Opponent):
    """GnuGo at ``level`` (0-10) over GTP, on Chinese (area) rules. OpenSpiel scores Tromp-Taylor, every stone
    on the board alive: GnuGo captures all dead stones before it passes. A command waits ``timeout`` seconds."""

    def __init__(self, game: "pyspiel.Game", level: int = 1, timeout: float = 30.0, binary: str = GNUGO):
        params = game.get_parameters()
        if game.get_type().short_name != "go" or params["handicap"]:
            raise EngineError("GnuGo plays Go without handicap only: choose random or mcts:SIMULATIONS")
        if not 0 <= level <= 10:
            raise EngineError(f"gnugo:{level}: choose a level from 0 to 10")
        if not os.access(binary, os.X_OK):
            raise EngineError(f"no GnuGo at {binary}: apt-get install gnugo")
        self.size = params["board_size"]
        self.name = f"gnugo:{level}"
        self.binary = binary
        self.timeout = timeout
        self.sent = 0  # the moves of the game GnuGo has been told
        self.buffer = b""
        command = [binary, "--mode", "gtp", "--boardsize", str(self.size), "--level", str(level)]
        command += ["--chinese-rules", "--capture-all-dead", "--komi", str(params["komi"])]
        self.process = subprocess.Popen(
            command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, bufsize=0
        )

    def reset(self, seat: int, seed: int) -> None:
        self.command("clear_board")
        self.command(f"set_random_seed {seed}")
        self.sent = 0

    def move(self, state: "pyspiel.State") -> int | None:
        history = state.history()
        for index in range(self.sent, len(history)):
            self.command(f"play {COLOURS[index % 2]} {vertex(history[index], self.size)}")
        reply = self.command(f"genmove {COLOURS[state.current_player()]}")
        self.sent = len(history) + 1  # genmove plays the move on GnuGo's board
        return None if reply.lower() == "resign" else action(reply, self.size)

    def command(self, line: str) -> str:
        """Send one GTP command; its answer, without the ``=``."""
        try:
            self.process.stdin.write(f"{line}\n".encode())
        except BrokenPipeError:
            raise self._exited(line) from None
        reply = self._answer(line)
        if not reply.startswith("="):
            raise EngineError(f"GnuGo refused {line!r}: {reply}")
        return reply[1:].strip()

    def _answer(self, line: str) -> str:
        """The next answer (up to GTP's blank line), or an EngineError after ``timeout`` seconds or at exit."""
        deadline = time.monotonic() + self.timeout
        out = self.process.stdout.fileno()
        while b"\n\n" not in self.buffer:
            if not select.select([out], [], [], max(0.0, deadline - time.monotonic()))[0]:
                self.process.kill()  # stuck: it would not read a quit either
                raise EngineError(f"GnuGo did not answer {line!r} within {self.timeout:g} s: raise GnuGo(timeout=...)")
            chunk = os.read(out, 4096)
            if not chunk:
                raise self._exited(line)
            self.buffer += chunk
        reply, _, self.buffer = self.buffer.partition(b"\n\n")
        return reply.decode().strip()

    def _exited(self, line: str) -> EngineError:
        code = self.process.wait()
        return EngineError(f"{self.binary} exited (code {code}) at {line!r}: try it by hand with --mode gtp")

    def close(self) -> None:
        """Ask GnuGo to quit; kill it if it has not within 5 s."""
        if self.process.poll() is None:
            try:
                self.process.stdin.write(b"quit\n")
                self.process.wait(timeout=5)
            except (BrokenPipeError, subprocess.TimeoutExpired):
                self.process.kill()
                self.process.wait()
        self.process.stdin.close()
        self.process.stdout.close()
