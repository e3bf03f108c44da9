"""``run``: players and trainers as ``python -m tinyverse`` children, supervised, then stopped
warmly."""

import functools
import logging
import os
import shutil
import tempfile
import time
from pathlib import Path

from ..database import connect
from ..database.snapshots import VERDICT
from ..errors import TinyverseError
from ..evaluation import chosen, evaluate, put
from ..loader import load_experiment
from ..options import store
from ..workers import PARENT, StopFlag, spawn
from . import ray
from .watch import Watch, compared, progress  # noqa: F401  (progress: the tests')

log = logging.getLogger(__name__)
CRASH_WINDOW = 120.0  # crashes older than this are forgiven
STOP_TIMEOUT = 30.0  # seconds a worker has to stop warmly before it is killed


def mode_run(args):
    """Start players and trainers on this machine (or a Ray cluster), supervise them, stop them,
    then eval."""
    if args.target_passes and not (args.target_eval and args.target_return is not None):
        wants = "add --target-eval N and --target-return X"
        raise TinyverseError(f"--target-passes counts greedy evals: {wants}")
    passes = args.target_passes or (2 if args.target_eval else 1)  # one look at training returns
    db = connect(args.url, args.prefix, capacity=args.buffer_size)
    exp = load_experiment(args.experiment, db, args.options)
    store(exp.run, db)  # the children adopt the run's options
    settings = exp.run.settings
    # the URL goes to the children in their environment: a password stays out of ps; a SQLite
    # path absolute, for Ray
    url = f"sqlite:///{Path(db.path).resolve()}" if args.url.startswith("sqlite:") else args.url
    env = {**os.environ, "TINYVERSE_DB": url, PARENT: str(os.getpid())}
    experiment = args.experiment
    start = spawn
    if args.ray:  # the workers run in the experiment's folder as Ray ships it
        start = ray.join(args.ray, experiment, url, args.players + args.trainers)
        experiment = Path(experiment).name
    sync = [] if args.sync is None else ["--sync" if args.sync else "--no-sync"]
    train = [experiment, "train", "-b", str(args.train_batch or settings.train_batch_size), *sync]
    play = [experiment, "play", "-b", str(args.batch_size or settings.play_batch_size)]
    workers = []
    for role, argv, n in (("trainer", train, args.trainers), ("player", play, args.players)):
        for i in range(n):  # e.g. Ape-X: player i of n explores with an epsilon of its own
            index = {"TINYVERSE_WORKER_INDEX": str(i), "TINYVERSE_WORKER_COUNT": str(n)}
            workers.append((f"{role}-{i}", [*argv, "--prefix", args.prefix, "-q"], env | index))
    judge = args.target_eval and functools.partial(judged, exp, db, args.target_eval)
    T = settings.session_length
    watch = Watch(db, T, args.steps, args.target_return, judge, passes)
    reason = supervise(workers, start, watch, args.max_crashes)
    print(f"run stopped: {reason}")
    if args.eval_episodes:
        final_eval(exp, db, args.eval_episodes, watch.verdict)
    if args.target_return is not None and not watch.reached:  # exit 1: CI sees it did not learn
        target = f"--target-return {args.target_return:g}"
        raise TinyverseError(f"run stopped ({reason}) short of {target}: info shows how far it got")


def judged(exp, db, episodes: int) -> tuple | None:
    """(version, params, returns) of ``episodes`` greedy episodes of the latest params; None while
    none are stored."""
    if (found := db.load_params()) is None:
        return None
    version = put(exp, db, found)
    return version, found[1], evaluate(exp, None, episodes, quiet=True, version=version)


def final_eval(exp, db, episodes: int, verdict) -> None:
    """The final eval: of the snapshot the verdict kept (the agent run leaves, and export takes),
    beside the returns it passed on; else (no target reached) of the latest params."""
    if verdict is None:
        evaluate(exp, db, episodes, None)
        return
    version = put(exp, db, chosen(db, VERDICT))
    print(compared(verdict, evaluate(exp, None, episodes, None, version=version)))


def supervise(workers: list[tuple], spawn, watch: "Watch", max_crashes: int) -> str:
    """Run each (name, argv, env) of ``workers`` until ``watch`` or Ctrl-C says stop, then stop
    them; say why. ``spawn(argv, env, logfile)`` starts one: a local process, or a Ray task with
    Popen's poll, terminate, kill."""
    logdir = Path(tempfile.mkdtemp(prefix=f"tinyverse-{watch.db.prefix}-"))
    reason = None  # why the fleet stops
    children = [Child(*worker, spawn, logdir / f"{worker[0]}.log") for worker in workers]
    log.info("starting %d workers; their logs go to %s until they stop", len(children), logdir)
    with StopFlag() as flag:
        try:
            while not flag.stop and reason is None:
                for child in children:
                    child.check(max_crashes)
                done = all(c.finished for c in children)
                reason = "every worker exited by itself" if done else watch.check()
                time.sleep(0.5)
        finally:
            watch.close()
            crashed = any(len(c.crashes) >= max_crashes for c in children)
            reason = reason or ("a worker kept crashing" if crashed else "interrupted")
            log.info("stopping the fleet (%s)", reason)
            running = [c for c in children if c.proc is not None]
            for child in running:
                child.proc.terminate()  # SIGTERM: finish the step, publish (trainers), exit
            deadline = time.monotonic() + STOP_TIMEOUT
            while any(c.proc.poll() is None for c in running) and time.monotonic() < deadline:
                time.sleep(0.2)
            for child in [c for c in running if c.proc.poll() is None]:
                log.warning("%s did not stop in %.0fs: killing it", child.name, STOP_TIMEOUT)
                child.proc.kill()
            if not crashed:  # a crash's output was shown; keep the logs only then
                shutil.rmtree(logdir, ignore_errors=True)
    return reason


class Child:
    """One supervised worker: restarted with backoff when it crashes, left stopped once it exits
    with code 0."""

    def __init__(self, name: str, argv: list[str], env: dict[str, str], spawn, logfile: Path):
        self.name = name
        self.argv = argv
        self.env = env
        self.spawn = spawn
        self.logfile = logfile
        self.proc = None  # while it runs
        self.finished = False  # exited with code 0: not restarted
        self.crashes = []  # when it crashed, within CRASH_WINDOW
        self.restart_at = 0.0  # monotonic

    def check(self, max_crashes: int) -> None:
        """Start the process when due; see whether it exited; raise once it keeps crashing."""
        now = time.monotonic()
        if self.proc is None and not self.finished and now >= self.restart_at:
            if self.crashes:
                log.warning("restarting %s (crash %d)", self.name, len(self.crashes))
            self.proc = self.spawn(self.argv, self.env, self.logfile)
        if self.proc is None or (code := self.proc.poll()) is None:
            return
        self.proc = None
        if code == 0:
            log.warning("%s exited by itself (code 0): not restarted", self.name)
            self.finished = True
            return
        self.crashes = [t for t in self.crashes if now - t <= CRASH_WINDOW] + [now]
        if len(self.crashes) >= max_crashes:
            crashed = f"{self.name} crashed {len(self.crashes)} times"
            raise TinyverseError(f"{crashed}; its last output:\n{self.tail(8)}")
        delay = min(2 ** (len(self.crashes) - 1), 30)
        said = "%s exited with code %s; restarting in %ds. Last output:\n%s"
        log.warning(said, self.name, code, delay, self.tail(4))
        self.restart_at = now + delay

    def tail(self, n: int) -> str:
        lines = self.logfile.read_text(errors="replace").splitlines()[-n:]
        return "\n".join("    " + line for line in lines)
