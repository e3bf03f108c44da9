"""Sample Factory and RLlib judged as tinyverse and SB3 are: Pong to -15, -5 and 0; CartPole to a greedy 475.

    python bench/peers.py --build                                  # the peers' venvs only (bench/.venvs/)
    python bench/peers.py --game pong --minutes 60                 # both peers, tuned then defaults, one at a time
    python bench/peers.py --game pong --systems rllib --configs tuned --minutes 3 --out smoke.jsonl
    python bench/peers.py --game cartpole --seeds 0,1,2 --budget-s 300
    python bench/peers.py --report bench/results/FILE.jsonl --plot pong.png   # Pong: with atari_learn's rows too

Why a script of its own rather than ``--systems`` in ``bench/atari_learn.py`` and ``bench/cartpole.py``:
each peer runs in a venv of its own (Sample Factory 2.1.1 wants Gymnasium 0.29 and NumPy < 2, tinyverse
Gymnasium >= 1.0; RLlib pulls Ray), built here from ``bench/peers/*.txt``, and that machinery (venvs,
process trees to pause and stop, per-environment episode files) would double those scripts. The judge is
theirs, imported, not copied: Pong's rows are ``bench/atari_learn.py``'s (``summary``, ``reached``,
``report``, ``plot``: the mean of the last 50 training games, minutes from this script's spawn of the
peer's process, agent steps), so ``bench/atari_learn.py --report FILE`` shows the peers beside tinyverse
and SB3; CartPole's greedy eval is ``bench/peers/judge.py``'s ``evaluate``, which ``bench/cartpole.py``
runs for SB3 and tinyverse too (``--eval-episodes 10`` there for the same bar as here).

- Pong: the peer's training environments are PongNoFrameskip-v4 with SB3's wrappers (each peer's own
  copies of them: Sample Factory's ``sf_examples.atari``, RLlib's ``wrap_atari_for_new_api_stack``), each
  wrapped in ``judge.EpisodeLog``, which appends every game's raw score and the environment's agent
  steps to a file; this script reads it every 10 s and stops the run (SIGINT to its process group, then
  SIGKILL) at a last-50 mean of 0 or after ``--minutes``. Agent steps at a game's end are the sum over
  environments of each one's count (exact at its own lines, every 250 of its steps, linear between).
- CartPole: every ``--eval-every-s`` seconds of training clock, 10 greedy episodes (``--eval-episodes``)
  on the episode seeds ``bench/cartpole.py`` uses; solved at a mean of 475. Evaluation is off the clock:
  RLlib evaluates in its driver between training iterations (nothing trains then, as SB3 in its
  callback); Sample Factory's process tree is paused (SIGSTOP) while an evaluator in its venv plays its
  newest checkpoint (saved every 3 s), and the solve time is the training clock when that checkpoint
  was saved.
- Configs: ``tuned`` (each peer's recommended settings for Atari or CartPole, scaled to 2 cores as its
  docs say) and ``defaults`` (its documented defaults); each setting and its source are in
  ``bench/peers/sample_factory_run.py`` and ``bench/peers/rllib_run.py``, and in docs/benchmarks.rst.
  Runs are sequential; a peer that fails is recorded with the error it printed.
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

import numpy as np

BENCH = Path(__file__).resolve().parent
sys.path[:0] = [str(BENCH), str(BENCH / "peers")]
import atari_learn  # noqa: E402  (the judge's code: rows, thresholds, report, plot)
from judge import SOLVED  # noqa: E402

VENVS = BENCH / ".venvs"
LAUNCHERS = {"sample-factory": "sample_factory_run.py", "rllib": "rllib_run.py"}
TORCH = "torch==2.13.0"  # installed first, alone: the CPU wheel lies on disk; any other pulls a multi-GB CUDA build


def venv(peer: str, tinyverse_extras: str | None = None) -> Path:
    """The peer's venv under bench/.venvs/, built (or rebuilt) from bench/peers/PEER.txt (and this checkout's
    tinyverse with ``tinyverse_extras``, editable, where given); its python."""
    requirements = BENCH / "peers" / f"{peer}.txt"
    home, stamp = VENVS / peer, VENVS / peer / "requirements.txt"
    python = home / "bin" / "python"
    if stamp.exists() and stamp.read_text() == requirements.read_text():
        return python
    print(f"building {home} from {requirements.relative_to(BENCH.parent)} (minutes)", flush=True)
    subprocess.run([sys.executable, "-m", "venv", "--clear", str(home)], check=True)
    pip = [str(python), "-m", "pip", "install", "-q"]
    subprocess.run([*pip, TORCH], check=True)
    subprocess.run([*pip, "-r", str(requirements)], check=True)
    if tinyverse_extras is not None:
        subprocess.run([*pip, "-e", f"{BENCH.parent}[{tinyverse_extras}]"], check=True)
    stamp.write_text(requirements.read_text())
    return python


def spawn(peer: str, argv: list[str], workdir: Path, **pipes) -> subprocess.Popen:
    """The peer's launcher in its venv, in a process group of its own (to pause and stop all of it)."""
    env = os.environ | {
        "PYTHONPATH": str(BENCH / "peers"),  # judge.py, and the launcher as a module in spawned workers
        "PEERS_EPISODES": str(workdir / "episodes.jsonl"),
        "RAY_AUTH_MODE": "disabled",  # a local Ray needs no token file under ~/.ray
    }
    argv = [str(venv(peer)), str(BENCH / "peers" / LAUNCHERS[peer]), *argv, "--dir", str(workdir)]
    return subprocess.Popen(argv, cwd=workdir, env=env, start_new_session=True, **pipes)


def tree(proc: subprocess.Popen) -> list:
    import psutil

    try:
        root = psutil.Process(proc.pid)
        return [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return []


def signal_tree(procs: list, sig: int) -> None:
    import psutil

    for p in procs:
        try:
            p.send_signal(sig)
        except psutil.NoSuchProcess:
            pass


def stop(proc: subprocess.Popen, grace: float = 60) -> None:
    """SIGINT to the launcher (it shuts its workers down), then SIGKILL to whatever of its tree is left."""
    procs = tree(proc)
    if proc.poll() is None:
        signal_tree(procs[:1], signal.SIGCONT)
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(grace)
        except subprocess.TimeoutExpired:
            pass
    signal_tree([p for p in procs if p.is_running()], signal.SIGKILL)
    proc.wait()


def episodes_of(path: Path, start: float) -> tuple[list[tuple], float | None]:
    """The games in a judge.EpisodeLog file as (minutes, return, agent steps of all envs), and agent steps/s
    after the first minute (start-up left out)."""
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.exists() else []
    streams: dict[str, list] = {}
    for r in rows:
        streams.setdefault(r["env"], []).append((r["t"], r["n"]))

    def steps(t: float) -> int:
        return int(sum(np.interp(t, [start] + [x for x, _ in s], [0] + [n for _, n in s]) for s in streams.values()))

    games = sorted(((r["t"] - start) / 60, r["r"], steps(r["t"])) for r in rows if "r" in r)
    last = max((r["t"] for r in rows), default=start)
    rate = (steps(last) - steps(start + 60)) / (last - start - 60) if last > start + 120 else None
    return games, rate


def run_pong(peer: str, config: str, minutes: float, seed: int, workdir: Path) -> tuple[list, dict]:
    argv = ["pong", "--config", config, "--seed", str(seed)] + (["--minutes", str(minutes + 1)] * (peer == "rllib"))
    log = workdir / "log.txt"
    start, shown, episodes = time.time(), 0.0, []
    with open(log, "w") as out:
        proc = spawn(peer, argv, workdir, stdout=out, stderr=subprocess.STDOUT)
    try:
        while proc.poll() is None and time.time() - start < minutes * 60:
            time.sleep(10)
            episodes, _ = episodes_of(workdir / "episodes.jsonl", start)
            shown = atari_learn.progress(f"{peer} {config}", start, episodes, shown)
            if (atari_learn.last_mean(episodes) or -99) >= atari_learn.THRESHOLDS[-1] and len(episodes) >= 50:
                break
    except KeyboardInterrupt:
        print("interrupted: stopping the run; its games so far are recorded", flush=True)
    finally:
        failed = proc.poll()
        stop(proc)
    episodes, rate = episodes_of(workdir / "episodes.jsonl", start)
    extra = {"label": config, "seed": seed, "steps_per_s": rate and round(rate)}
    if failed:  # it ended by itself before its time: the error it printed
        extra["error"] = f"exit {failed}: " + " | ".join(error_lines(log))
    return episodes, extra


def error_lines(log: Path, n: int = 3) -> list[str]:
    """The last lines of a log that name an error (else its last lines): what a failed peer said."""
    lines = [x.strip() for x in log.read_text(errors="replace").splitlines() if x.strip()]
    named = [x for x in lines if re.search(r"\w(Error|Exception)\b", x) or x.startswith("error")]
    return (named or lines)[-n:]


class Paused:
    """Sample Factory's clock: its process tree stopped while its checkpoint plays the greedy eval."""

    def __init__(self, proc: subprocess.Popen, start: float):
        self.proc, self.start, self.spans = proc, start, []  # spans: (stopped at, resumed at)

    def clock(self, t: float) -> float:
        """Seconds of training by time ``t``: since the spawn, less the pauses that ended before it."""
        return t - self.start - sum(b - a for a, b in self.spans if b <= t)

    def __enter__(self):
        self.procs, self.at = tree(self.proc), time.time()
        signal_tree(self.procs, signal.SIGSTOP)
        return self

    def __exit__(self, *_):
        signal_tree(self.procs, signal.SIGCONT)
        self.spans.append((self.at, time.time()))


def cartpole_sample_factory(config: str, seed: int, budget_s: float, every: float, n: int, workdir: Path) -> dict:
    with open(workdir / "log.txt", "w") as out:
        proc = spawn("sample-factory", ["cartpole", "--config", config, "--seed", str(seed)], workdir, stdout=out,
                     stderr=subprocess.STDOUT)  # fmt: skip
    clock, judge, evals, failed = Paused(proc, time.time()), None, [], None
    try:
        while proc.poll() is None and clock.clock(time.time()) < budget_s:
            time.sleep(max(0.0, every - clock.clock(time.time()) % every))
            if not (workdir / "run" / "config.json").exists():
                continue
            with clock:
                if judge is None:  # an evaluator in Sample Factory's venv, started once, off the clock
                    judge = spawn("sample-factory", ["evaluate"], workdir, stdin=subprocess.PIPE,
                                  stdout=subprocess.PIPE, text=True)  # fmt: skip
                answer = ask(judge, f"{seed} {n}")
            if answer is None:
                failed = "the evaluator exited (its traceback is above)"
                break
            if answer["mean"] is None:
                continue
            evals.append((round(clock.clock(answer["saved"]), 2), answer["steps"], answer["mean"]))
            print(f"  sample-factory {config} seed {seed}: {evals[-1][0]:6.1f}s {answer['steps']:7d} steps  "
                  f"eval {answer['mean']:5.1f}", flush=True)  # fmt: skip
            if answer["mean"] >= SOLVED:
                break
    finally:
        failed = failed or proc.poll()
        stop(proc)
        if judge is not None:
            if judge.poll() is None:
                judge.stdin.close()  # its loop over stdin ends: it exits by itself
            stop(judge, grace=10)
    return outcome(evals, failed, workdir / "log.txt")


def ask(judge: subprocess.Popen, request: str) -> dict | None:
    """The evaluator's answer to one request, None if it has exited."""
    try:
        judge.stdin.write(request + "\n")
        judge.stdin.flush()
        return json.loads(judge.stdout.readline())
    except (BrokenPipeError, json.JSONDecodeError):
        return None


def cartpole_rllib(config: str, seed: int, budget_s: float, every: float, n: int, workdir: Path) -> dict:
    argv = ["cartpole", "--config", config, "--seed", str(seed), "--budget-s", str(budget_s)]
    argv += ["--eval-every-s", str(every), "--eval-episodes", str(n)]
    start, evals = time.time(), []
    with open(workdir / "log.txt", "w") as log:
        proc = spawn("rllib", argv, workdir, stdout=subprocess.PIPE, stderr=log, text=True)
    try:
        for line in proc.stdout:
            if not line.startswith("{"):
                continue
            row = json.loads(line)  # the driver's clock: from this spawn, less its own evals before this one
            evals.append((round(row["t"] - start - row["paused"], 2), row["steps"], row["eval"]))
            print(f"  rllib {config} seed {seed}: {evals[-1][0]:6.1f}s {row['steps']:7d} steps  "
                  f"eval {row['eval']:5.1f}", flush=True)  # fmt: skip
        proc.wait(120)  # its output ended: it solved, ran out of budget or failed
    except subprocess.TimeoutExpired:
        pass
    finally:
        failed = proc.poll()
        stop(proc)
    return outcome(evals, failed, workdir / "log.txt")


def outcome(evals: list[tuple], failed: int | None, log: Path) -> dict:
    """A CartPole run's row: its first eval at SOLVED (seconds, steps), every eval, and an error if it failed."""
    solved = next(((s, n) for s, n, mean in evals if mean >= SOLVED), None)
    row = {"seconds": solved[0], "steps": solved[1]} if solved else {"seconds": None, "steps": None}
    row["evals"] = evals
    if failed and not solved:
        row["error"] = failed if isinstance(failed, str) else f"exit {failed}: " + " | ".join(error_lines(log))
    return row


def report(rows: list[dict]) -> None:
    """Pong's tables are atari_learn's (any of its rows too); CartPole's: seconds and agent steps to solve."""
    if any(r.get("kind") == "summary" for r in rows):
        atari_learn.report(rows)  # its lines name steps_per_s: agent steps a second after the first minute
        for r in rows:  # a run without games has no such line
            if r.get("kind") == "summary" and not r.get("steps") and r.get("steps_per_s"):
                print(f"{r['system']} {r.get('label', '')}: no game finished; steps_per_s {r['steps_per_s']}")
    runs = [r for r in rows if r.get("kind") == "cartpole"]
    if runs:
        print(f"\nCartPole-v1, first greedy eval >= {SOLVED:g} (off the clock)")
        print(f"{'system':<28}{'seed':>5}{'seconds':>9}{'steps':>9}{'evals':>7}")
        for r in runs:
            seconds = "-" if r["seconds"] is None else f"{r['seconds']:.1f}"
            name = f"{r['system']} {r['label']}"
            print(f"{name:<28}{r['seed']:>5}{seconds:>9}{r['steps'] or '-':>9}{len(r['evals']):>7}")
    for r in rows:
        if r.get("error"):
            print(f"{r['system']} {r.get('label', '')} failed: {r['error']}")


def main() -> None:
    signal.signal(signal.SIGINT, signal.default_int_handler)  # a background job starts with SIGINT ignored
    signal.signal(signal.SIGTERM, atari_learn.interrupt)
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--game", choices=["pong", "cartpole"], default="pong")
    parser.add_argument("--systems", default="sample-factory,rllib", help="comma-separated: sample-factory, rllib")
    configs = (
        "comma-separated: tuned, defaults (RLlib's APPO; its PPO: ppo-tuned, ppo-defaults; Sample Factory, Pong: also"
        " tuned-no-input-norm, tuned-no-return-norm)"
    )
    parser.add_argument("--configs", default="tuned,defaults", help=configs)
    parser.add_argument("--minutes", type=float, default=60.0, help="pong: wall-time budget of each run")
    parser.add_argument("--seeds", default="0", help="comma-separated seeds (each peer's own seed)")
    parser.add_argument("--budget-s", type=float, default=300.0, help="cartpole: training seconds a run")
    parser.add_argument("--eval-every-s", type=float, default=3.0, help="cartpole: training seconds between evals")
    parser.add_argument("--eval-episodes", type=int, default=10, help="cartpole: greedy episodes an eval")
    parser.add_argument("--out", default=f"peers-{date.today().isoformat()}.jsonl", help="rows (JSON lines)")
    parser.add_argument("--report", help="print the tables of a rows file instead of running")
    parser.add_argument("--plot", help="pong: draw the curves of --report's file (or of this run) into a PNG")
    parser.add_argument("--by-steps", action="store_true", help="plot against agent steps, not wall time")
    parser.add_argument("--build", action="store_true", help="build the peers' venvs and stop")
    args = parser.parse_args()
    if args.report:
        rows = [json.loads(x) for x in Path(args.report).read_text().splitlines() if x.strip()]
        report(rows)
        if args.plot:
            atari_learn.plot(rows, args.plot, args.by_steps)
        return
    systems = args.systems.split(",")
    for peer in systems:
        if peer not in LAUNCHERS:
            parser.error(f"unknown system {peer!r}: {', '.join(LAUNCHERS)}")
        venv(peer)
    if args.build:
        return
    at = atari_learn.commit()
    for seed in (int(s) for s in args.seeds.split(",")):
        for peer in systems:
            for config in args.configs.split(","):
                rows = run(peer, config, seed, args, at)
                with open(args.out, "a") as f:
                    f.writelines(json.dumps(r) + "\n" for r in rows)
                report(rows[-1:])
    rows = [json.loads(x) for x in Path(args.out).read_text().splitlines() if x.strip()]
    report(rows)
    if args.plot and args.game == "pong":
        atari_learn.plot(rows, args.plot, args.by_steps)


def run(peer: str, config: str, seed: int, args, at: str) -> list[dict]:
    """One run in a fresh folder under /tmp (removed after), one after the other: its rows."""
    import tempfile

    print(f"{peer} {config} seed {seed}: {args.game}", flush=True)
    with tempfile.TemporaryDirectory(prefix=f"peers-{peer}-") as tmp:
        if args.game == "pong":
            episodes, extra = run_pong(peer, config, args.minutes, seed, Path(tmp))
            rows = [{"kind": "episode", "system": peer, "label": config, "minutes": round(m, 3), "return": r,
                     "steps": n} for m, r, n in episodes]  # fmt: skip
            return [*rows, atari_learn.summary(peer, episodes, args.minutes, extra | {"commit": at})]
        how = (config, seed, args.budget_s, args.eval_every_s, args.eval_episodes, Path(tmp))
        row = (cartpole_sample_factory if peer == "sample-factory" else cartpole_rllib)(*how)
    return [{"kind": "cartpole", "system": peer, "label": config, "seed": seed, "date": date.today().isoformat(),
             "commit": at, "budget_s": args.budget_s, "eval_episodes": args.eval_episodes, **row}]  # fmt: skip


if __name__ == "__main__":
    main()
