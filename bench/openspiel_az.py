"""OpenSpiel's own AlphaZero on a board game, 2 cores, M minutes; then a match against tinyverse's alphazero.py agent.

    python bench/openspiel_az.py --build                                   # bench/.venvs/openspiel_az only
    python bench/openspiel_az.py train --minutes 60 --out /tmp/os-az       # OpenSpiel's alpha_zero, 60 minutes
    python bench/games.py examples/alphazero.py --minutes 60 --keep /tmp/tv-az --match mcts:100=20   # tinyverse's
    python bench/openspiel_az.py match --tinyverse-db sqlite:////tmp/tv-az/run.db --checkpoint /tmp/os-az --games 100
    python bench/openspiel_az.py train --game go --minutes 60 --out /tmp/os-az-go   # Go 9x9 (--board-size 9)

``--game`` (connect_four by default) is loaded as alphazero.py loads it (``games.load``: Go 9x9, komi 7.5, its
move limit), so both agents play the same game; ``match`` refuses a run and a checkpoint of different games.

Issue 54: OpenSpiel's AlphaZero on the same game, cores and time; tinyverse's at least as strong head-to-head.
Any Python runs this script: it runs itself again in bench/.venvs/openspiel_az (built from
``bench/peers/openspiel_az.txt`` on first use, minutes): open-spiel 2.0.2 as tinyverse's games extra pins, the JAX
stack its ``alpha_zero`` imports (jax, flax, optax, orbax, chex: none is among open-spiel's requirements), torch
2.13.0 and tinyverse (``-e '.[examples,games]'``): the match loads both agents in one process.

``train``: ``alpha_zero.alpha_zero(Config(...))``, OpenSpiel's own trainer (one learner process, one process per
actor, a Python MCTS whose leaves a JAX net evaluates one at a time), in a session of its own, pinned to ``--cpus``
(0,1). After ``--minutes`` (counted from the spawn: imports and start-up count, as in ``bench/games.py``) it gets
SIGINT at a moment its learner waits for games, never while it saves (its log's last line is "Collecting
trajectories"): alpha_zero catches it, tells its actors to stop and joins them; SIGKILL to the session after 120 s.
Its learner saves a checkpoint after every step (``checkpoint--1``, or ``checkpoint-N`` every checkpoint_freq
steps); the last one its log says it saved is the agent M minutes left, written with the rates to
``OUT/latest.json``, which ``match --checkpoint OUT`` loads. ``--set NAME=VALUE`` changes a setting of the config.

The config: OpenSpiel's Connect Four command in its docs (docs/alpha_zero.md, "Usage: Python":
``alpha_zero.py --game connect_four --nn_model mlp --actors 10``), every other setting the default of that script's
flags (open_spiel/python/examples/alpha_zero.py, 2.0.2), scaled to 2 cores:

- game connect_four (``--game`` plays another with the same settings); nn_model mlp (the docs' command);
  nn_width 256, nn_depth 2; uct_c 1.41; max_simulations 40; train_batch_size 128; replay_buffer_size 2**13;
  replay_buffer_reuse 4 (a learner step every 2**13 / 4 = 2048 new positions); learning_rate 1e-3; weight_decay
  1e-4 (not decoupled); policy_epsilon 0.25, policy_alpha 1.0 (Dirichlet noise at the root of self-play);
  temperature 1, temperature_drop 2; checkpoint_freq 25; evaluation_window 50; eval_levels 7: all the script's
  defaults.
- nn_api_version nnx: Config's own default (the script's ``--nn_api`` says linen). Neither jits inference: each
  leaf is a few eager JAX calls, and nnx's cost a quarter of linen's CPU time a move (0.13 s against 0.55 s for 40
  simulations on the dev machine): the faster of OpenSpiel's two, so the more games in the same minutes.
- actors 2, not the docs' 10: a process each, one per core; more would only time-share the same 2 cores and
  train on staler nets (the docs' own warning: too many actors for the hardware, older data).
- evaluators 0, not 2: they play the latest checkpoint against MCTS to log progress and train nothing; on 2 cores
  they would take the actors' time. Strength is what ``match`` measures.
- max_steps 0 (until stopped), not the script's 26 (its tic-tac-toe run): the stop is the M minutes.
The script's defaults are marked there "TIC-TAC-TOE CONFIG"; its 2019 version's defaults were Connect Four's:
300 simulations, uct_c 2, a resnet 128 wide and 10 deep, batch 1024, buffer 2**16 reused 3 times, temperature_drop
10 (``--set max_simulations=300`` and so on tries them; on 2 cores they leave few games in an hour).

``match``: N games of the game (the tinyverse run's, which must be the checkpoint's), tinyverse's greedy agent
(the latest params of ``--tinyverse-db``, loaded as ``tinyverse eval`` loads them: ``load_experiment`` with
``tune=False``, ``sync_params``; ``--simulations`` for its search, default the run's) against OpenSpiel's trained
agent as its own evaluator processes play it: ``MCTSBot`` with PUCT, ``AlphaZeroEvaluator`` on the checkpoint's
model, no Dirichlet noise, the most visited move, no solver (``alpha_zero._init_bot(..., evaluation=True)``),
``--openspiel-simulations`` a move (default the config's max_simulations). Both agents are deterministic, so every
game of a colour would be the same: each pair of games opens with ``--opening-moves`` (2) uniformly random moves
(OpenSpiel's examples/mcts.py has ``--random_first`` for the same reason), seeded by ``--seed`` and the pair, and
is played twice, colours swapped. Prints each game and ``tinyverse against openspiel-az: W won, D drawn, L lost
of N: score S (95% interval a-b)`` (Wilson's, draws half: ``tinyverse.league.match_line``); appends a row of JSON
with the settings and the training's rates to ``--out``.
"""

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import time
from datetime import date
from pathlib import Path

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent
VENV = BENCH / ".venvs" / "openspiel_az"
STOP_GRACE_S = 120  # seconds alpha_zero gets to stop its actors after SIGINT (each ends the game it plays)
CONFIG = {  # the docstring says where each comes from
    "game": "connect_four",
    "nn_model": "mlp",
    "nn_width": 256,
    "nn_depth": 2,
    "nn_api_version": "nnx",
    "uct_c": 1.41,
    "max_simulations": 40,
    "train_batch_size": 128,
    "replay_buffer_size": 2**13,
    "replay_buffer_reuse": 4,
    "learning_rate": 1e-3,
    "weight_decay": 1e-4,
    "decouple_weight_decay": False,
    "policy_epsilon": 0.25,
    "policy_alpha": 1.0,
    "temperature": 1.0,
    "temperature_drop": 2,
    "checkpoint_freq": 25,
    "evaluation_window": 50,
    "eval_levels": 7,
    "actors": 2,
    "evaluators": 0,
    "max_steps": 0,
    "observation_shape": None,  # alpha_zero fills both in from the game
    "output_size": None,
    "quiet": True,
    "verbose": False,
}


def fail(message: str):
    raise SystemExit(f"openspiel_az.py: error: {message}")


def venv() -> Path:
    """bench/.venvs/openspiel_az (peers.py's builder, from bench/peers/openspiel_az.txt, with tinyverse); its python."""
    sys.path.insert(0, str(BENCH))
    import peers

    return peers.venv("openspiel_az", tinyverse_extras="examples,games")


# -- train -------------------------------------------------------------------------------------------------------
def game_string(name: str, board_size: int) -> str:
    """The game as tinyverse's examples load it (games.load; ``board_size`` for games.SIZED), as the string
    ``pyspiel.load_game`` takes: Go is 9x9 with komi 7.5 and tinyverse's move limit on both sides."""
    sys.path.insert(0, str(ROOT / "examples"))
    import games

    try:
        return str(games.load(name, **games.sized(name, board_size)))
    except games.GameError as e:
        fail(f"--game {name}: {e}")


def config_of(sets: list[str], out: Path, game: str) -> dict:
    """CONFIG with ``--set NAME=VALUE``s, each as its default's type, the game and the checkpoints' folder."""
    config = dict(CONFIG, game=game)
    for text in sets:
        name, _, value = text.partition("=")
        settable = [k for k, v in CONFIG.items() if v is not None and k != "game"]
        if name not in settable:
            fail(f"--set {text}: choose one of {', '.join(settable)}")
        kind = type(CONFIG[name])
        try:
            config[name] = value.lower() in ("1", "true", "yes") if kind is bool else kind(value)
        except ValueError:
            fail(f"--set {text}: {name} is a {kind.__name__}")
    return config | {"path": str(out)}


def learn(args) -> None:
    """What train spawns: OpenSpiel's alpha_zero with the config of ``--config``, until stopped."""
    if args.cpus:
        os.sched_setaffinity(0, [int(c) for c in args.cpus.split(",")])  # its actors inherit it
    from open_spiel.python.algorithms.alpha_zero import alpha_zero

    alpha_zero.alpha_zero(alpha_zero.Config(**json.loads(args.config)))


def learner_lines(out: Path) -> list[str]:
    """The messages of the learner's log, its time stamps left out."""
    log = out / "log-learner.txt"
    lines = log.read_text(errors="replace").splitlines() if log.exists() else []
    return [line.partition("] ")[2].strip() for line in lines]


def waits_for_games(out: Path) -> bool:
    """Whether the learner is collecting games (not learning or saving): its last message says so."""
    said = [line for line in learner_lines(out) if line]
    return bool(said) and said[-1] == "Collecting trajectories"


def stop(proc: subprocess.Popen, out: Path) -> None:
    """SIGINT to alpha_zero once its learner waits for games (60 s at most), then SIGKILL to what is left."""
    if proc.poll() is None:
        waited = time.monotonic()
        while not waits_for_games(out) and time.monotonic() - waited < 60 and proc.poll() is None:
            time.sleep(0.1)
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(STOP_GRACE_S)
        except subprocess.TimeoutExpired:
            print(f"alpha_zero still running {STOP_GRACE_S} s after SIGINT: killed", flush=True)
    try:
        os.killpg(proc.pid, signal.SIGKILL)  # its actors and multiprocessing's helpers, if any are left
    except ProcessLookupError:
        pass
    proc.wait()


def last_checkpoint(out: Path) -> tuple[str, int]:
    """The last checkpoint the learner's log says it saved, and the learner step it was saved at."""
    name = None
    step = 0
    saved_at = 0
    for line in learner_lines(out):
        if found := re.fullmatch(r"Step: (\d+)", line):
            step = int(found[1])
        if found := re.fullmatch(r"(?:Initial checkpoint|Checkpoint saved): (-?\d+)", line):
            name = f"checkpoint-{found[1]}"
            saved_at = step
    if name is None:
        fail(f"no checkpoint saved in {out}: see its log-learner.txt and stdout.txt")
    if not (out / name).is_dir():  # stopped while writing it: the newest numbered one
        numbered = [int(p.name[11:]) for p in out.glob("checkpoint-*") if p.name[11:].isdigit()]
        if not numbered:
            fail(f"{out / name} is missing and no numbered checkpoint is left")
        print(f"{name} is missing (stopped while saving it?): checkpoint-{max(numbered)} instead", flush=True)
        return f"checkpoint-{max(numbered)}", max(numbered)
    return name, saved_at


def learner_rows(out: Path) -> list[dict]:
    path = out / "learner.jsonl"
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()] if path.exists() else []


def train(args) -> None:
    out = Path(args.out).resolve()
    if (out / "config.json").exists():
        fail(f"{out} holds a run already: give train a new folder")
    out.mkdir(parents=True, exist_ok=True)
    config = config_of(args.set, out, game_string(args.game, args.board_size))
    command = [sys.executable, __file__, "learn", "--config", json.dumps(config), "--cpus", args.cpus]
    print(f"OpenSpiel's alpha_zero on {config['game']} for {args.minutes:g} minutes on cpus {args.cpus}: {out}")
    start = time.monotonic()
    with open(out / "stdout.txt", "w") as log:
        proc = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        shown = start
        while proc.poll() is None and time.monotonic() - start < args.minutes * 60:
            time.sleep(1)
            if time.monotonic() - shown >= 60 and (rows := learner_rows(out)):
                shown = time.monotonic()
                minutes = (shown - start) / 60
                done = f"step {rows[-1]['step']}, {rows[-1]['total_states']} positions"
                print(f"  {minutes:5.1f} min: {done}", flush=True)
    except KeyboardInterrupt:
        print("interrupted: stopping alpha_zero; its last checkpoint is kept", flush=True)
    finally:
        failed = proc.poll()
        stop(proc, out)
    seconds = time.monotonic() - start
    if failed:  # 0: it reached a max_steps of --set
        said = [x for x in (out / "stdout.txt").read_text(errors="replace").splitlines() if "Error" in x or "Exc" in x]
        fail(f"alpha_zero exited ({failed}) before its time: {' | '.join(said[-3:]) or 'see ' + str(out)}")
    name, step = last_checkpoint(out)
    rows = learner_rows(out)
    positions = rows[-1]["total_states"] if rows else 0
    games = rows[-1]["total_trajectories"] if rows else 0
    latest = {"checkpoint": name, "step": step, "seconds": round(seconds, 1), "cpus": args.cpus}
    latest |= {"positions": positions, "games": games, "positions_per_s": round(positions / seconds, 2)}
    latest |= {"games_per_s": round(games / seconds, 4), "config": config}
    (out / "latest.json").write_text(json.dumps(latest, indent=2) + "\n")
    print(f"trained {seconds / 60:.1f} min: {step} learner steps, {games} games, {positions} positions "
          f"({positions / seconds:.1f} positions/s, {games / seconds * 60:.1f} games/min): {out / name}")  # fmt: skip


# -- match -------------------------------------------------------------------------------------------------------
def checkpoint_of(path: str) -> tuple[Path, str, dict]:
    """The run's folder, the checkpoint's name and latest.json (or {}) of ``--checkpoint``: a folder train wrote
    (its latest.json; else the last checkpoint its log names) or a checkpoint-N folder in one."""
    given = Path(path).resolve()
    if given.name.startswith("checkpoint-"):
        folder = given.parent
        name = given.name
    else:
        folder = given
        name = None
    if not (folder / "config.json").exists():
        fail(f"--checkpoint {path}: no config.json in {folder}: pass the folder train wrote or a checkpoint in it")
    latest_file = folder / "latest.json"
    latest = json.loads(latest_file.read_text()) if latest_file.exists() else {}
    name = name or latest.get("checkpoint") or last_checkpoint(folder)[0]
    if not (folder / name).is_dir():
        fail(f"--checkpoint {path}: {folder / name} is missing")
    return folder, name, latest


def openspiel_bot(folder: Path, name: str, simulations: int | None):
    """OpenSpiel's agent as its evaluators play it: the checkpoint's model in MCTS, no noise; its config."""
    import pyspiel
    from open_spiel.python.algorithms.alpha_zero import alpha_zero
    from open_spiel.python.algorithms.alpha_zero.evaluator import AlphaZeroEvaluator

    config = alpha_zero.Config(**json.loads((folder / "config.json").read_text()))
    config = config.replace(path=str(folder), max_simulations=simulations or config.max_simulations)
    model = alpha_zero._init_model_from_config(config)
    model.load_checkpoint(name.removeprefix("checkpoint-"))
    game = pyspiel.load_game(config.game)
    return alpha_zero._init_bot(config, game, AlphaZeroEvaluator(game, model), evaluation=True), config


def tinyverse_agent(url: str, prefix: str, experiment: str, simulations: int | None):
    """The experiment with the latest params of ``url``, loaded as ``tinyverse eval`` loads it; their version."""
    from tinyverse.database import TOOL_WAIT, connect
    from tinyverse.loader import load_experiment
    from tinyverse.params import sync_params

    db = connect(url, prefix, TOOL_WAIT, create=False)
    options = {} if simulations is None else {"simulations": str(simulations)}
    exp = load_experiment(experiment, db, options, tune=False)
    version = sync_params(exp, db, None)
    if version is None:
        fail(f"no params in prefix {prefix} of {url}: train first, or check --prefix")
    return exp, version


def opening(game, moves: int, rng) -> list[int]:
    """``moves`` uniformly random legal moves from the start (fewer if the game ends)."""
    state = game.new_initial_state()
    actions = []
    while len(actions) < moves and not state.is_terminal():
        legal = state.legal_actions()
        actions.append(int(legal[rng.integers(len(legal))]))
        state.apply_action(actions[-1])
    return actions


def play(game, tinyverse_move, bot, seat: int, actions: list[int]) -> tuple[float, int]:
    """A game from the opening ``actions``, tinyverse on ``seat``: its score (1, 0.5, 0) and length in moves."""
    state = game.new_initial_state()
    for action in actions:
        state.apply_action(action)
    while not state.is_terminal():
        action = tinyverse_move(state) if state.current_player() == seat else bot.step(state)
        state.apply_action(int(action))
    return (state.returns()[seat] + 1) / 2, len(state.history())


def match(args) -> None:
    import numpy as np
    import pyspiel

    sys.path.insert(0, str(BENCH))
    import atari_learn  # noqa: E402  (the commit a row keeps)

    from tinyverse.errors import TinyverseError
    from tinyverse.league import interval, match_line

    if args.games < 2 or args.games % 2:
        fail(f"--games {args.games}: each opening is played twice, colours swapped: give an even number")
    folder, name, latest = checkpoint_of(args.checkpoint)
    try:
        exp, version = tinyverse_agent(args.tinyverse_db, args.prefix, args.experiment, args.simulations)
    except TinyverseError as e:
        fail(str(e))
    bot, config = openspiel_bot(folder, name, args.openspiel_simulations)
    if str(exp.game) != str(pyspiel.load_game(config.game)):
        fail(f"the tinyverse run plays {exp.game}, the checkpoint {config.game}: match runs of one game")
    game = exp.game
    observe = exp.search.observe  # games.Observer: the observation GameEnv gives the agent

    def tinyverse_move(state) -> int:
        seen = observe(state, state.current_player())
        return int(exp.act({k: np.asarray(v)[None] for k, v in seen.items()}, {}, greedy=True)[0][0])

    theirs = f"openspiel-az {folder / name} (step {latest.get('step', '?')}, {config.max_simulations} simulations)"
    print(f"tinyverse v{version} ({exp.args.simulations} simulations) against {theirs}: {args.games} games", flush=True)
    scores = []
    for i in range(args.games):
        seat = i % 2  # tinyverse moves first in the even games
        actions = opening(game, args.opening_moves, np.random.default_rng([args.seed, i // 2]))
        score, moves = play(game, tinyverse_move, bot, seat, actions)
        scores.append(score)
        said = {1.0: "won", 0.5: "drew", 0.0: "lost"}[score]
        print(f"game {i + 1}/{args.games}: tinyverse {'first' if seat == 0 else 'second'}, opening {actions}: "
              f"{said} in {moves} moves", flush=True)  # fmt: skip
    print("tinyverse " + match_line("openspiel-az", scores))
    mean = sum(scores) / len(scores)
    low, high = interval(mean, len(scores))
    row = {"kind": "openspiel-az-match", "date": date.today().isoformat(), "commit": atari_learn.commit()}
    row |= {"game": config.game, "games": len(scores), "won": scores.count(1.0), "drawn": scores.count(0.5)}
    row |= {"lost": scores.count(0.0), "score": round(mean, 4), "low": round(low, 4), "high": round(high, 4)}
    row |= {"opening_moves": args.opening_moves, "seed": args.seed, "scores": scores}
    row["tinyverse"] = {"db": args.tinyverse_db, "prefix": args.prefix, "version": version,
                        "simulations": exp.args.simulations, "options": dict(exp.run.options)}  # fmt: skip
    row["openspiel"] = {"checkpoint": str(folder / name), "simulations": config.max_simulations,
                        "training": {k: v for k, v in latest.items() if k != "config"},
                        "config": {k: v for k, v in config.__dict__.items() if k in CONFIG}}  # fmt: skip
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    with open(args.out, "a") as f:
        f.write(json.dumps(row) + "\n")
    print(f"row appended to {args.out}")


def main() -> None:
    signal.signal(signal.SIGINT, signal.default_int_handler)  # a background job starts with SIGINT ignored
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--build", action="store_true", help="build bench/.venvs/openspiel_az and stop")
    sub = parser.add_subparsers(dest="mode", metavar="MODE")
    p = sub.add_parser("train", help="OpenSpiel's alpha_zero for --minutes, checkpoints in --out")
    p.add_argument("--minutes", type=float, default=60.0, help="wall time from the spawn (default 60)")
    p.add_argument("--out", required=True, help="a new folder for its checkpoints and logs")
    p.add_argument("--cpus", default="0,1", help="the cores it runs on (default 0,1; '' for all)")
    p.add_argument("--set", action="append", default=[], metavar="NAME=VALUE", help="a setting of the config")
    p.add_argument("--game", default="connect_four", help="the game, as alphazero.py's game (default connect_four)")
    p.add_argument("--board-size", type=int, default=9, help="Go's and Hex's side, as alphazero.py's (default 9)")
    p = sub.add_parser("match", help="tinyverse's agent against OpenSpiel's trained one")
    p.add_argument("--tinyverse-db", required=True, help="the tinyverse run's database, sqlite:///FOLDER/run.db")
    p.add_argument("--prefix", default="alphazero", help="its prefix (default alphazero)")
    p.add_argument("--experiment", default=str(ROOT / "examples" / "alphazero.py"), help="its experiment file")
    p.add_argument("--checkpoint", required=True, help="the folder train wrote, or a checkpoint-N in it")
    p.add_argument("--games", type=int, default=100, help="games, colours alternated (default 100)")
    p.add_argument("--simulations", type=int, help="tinyverse's simulations a move (default: the run's)")
    p.add_argument("--openspiel-simulations", type=int, help="OpenSpiel's (default: its config's max_simulations)")
    p.add_argument("--opening-moves", type=int, default=2, help="random moves each pair of games opens with")
    p.add_argument("--seed", type=int, default=0, help="seeds the openings")
    p.add_argument("--out", default=str(BENCH / "results" / "openspiel-az-2cores.jsonl"), help="rows (JSON lines)")
    p = sub.add_parser("learn", help="what train spawns (OpenSpiel's alpha_zero until stopped)")
    p.add_argument("--config", required=True, help="the Config's fields as JSON")
    p.add_argument("--cpus", default="", help="the cores it runs on")
    args = parser.parse_args()
    if args.build:
        venv()
        return
    if args.mode is None:
        parser.error("choose train or match (or --build)")
    if Path(sys.prefix).resolve() != VENV.resolve():  # this script again, in the venv that holds both agents
        python = str(venv())
        os.execv(python, [python, __file__, *sys.argv[1:]])
    {"train": train, "match": match, "learn": learn}[args.mode](args)


if __name__ == "__main__":
    main()
