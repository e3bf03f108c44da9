"""Operating a fleet: run, remote stop, info, plot and TensorBoard files, through real processes."""

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from conftest import ROOT, Proc, cli_env, run_cli, sets, wait_for
from conftest import spawn as start

from tinyverse.database import connect
from tinyverse.ops.monitor import info_text

FAKE = ROOT / "tests" / "fake_experiment.py"


def test_run_stops_after_steps_publishes_and_evaluates(tmp_path):
    url = f"sqlite:///{tmp_path / 'fleet.db'}"
    # the pace ties the trainer to the players: reaching the steps takes updates, whichever side is faster
    progress = tmp_path / "progress"  # the trainer's count of its updates, written by every train_step
    pace = ["--set", "updates_per_step=0.25", "--set", "pace_slack=32", "--set", f"progress={progress}"]
    out = run_cli(FAKE, "run", "--players", "2", "-n", "1500", "--eval-episodes", "2", *pace, "--db", url, cwd=tmp_path)
    assert "run stopped: reached" in out.stdout
    db = connect(url, "fake_experiment")
    played = db.count_sessions()[1] * 8
    assert played >= 1500
    assert db.workers() == []  # every worker left cleanly
    version, params = db.load_params()
    updates = int(params["updates"][0])
    assert updates == int(progress.read_text()), "the trainer's warm stop publishes every update it made"
    assert db.counter("updates") == updates, "the pace counts exactly the updates made"
    # each of the 2 players may be one round (2 sessions of 8) past the slack
    assert updates >= 0.25 * (played - 32 - 2 * 2 * 8)
    # the final eval: 2 episodes, with the params the trainers published last
    assert re.findall(r"^episode (\d)/2: return", out.stdout, re.M) == ["1", "2"]
    assert re.search(rf"^mean return \S+ ± \S+ over 2 episodes \(params v{version}\)$", out.stdout, re.M), out.stdout
    # run again, adopting the stored options: it continues from what is stored
    again = run_cli(FAKE, "run", "-n", "200", "--eval-episodes", "0", "--db", url, cwd=tmp_path)
    assert "mean return" not in again.stdout, "--eval-episodes 0: no eval"
    assert db.params_version() > version
    resumed = int(db.load_params()[1]["updates"][0])
    assert resumed == int(progress.read_text()) > updates, "the second run resumed from the first run's params"
    assert np.array_equal(db.load_params()[1]["w"], params["w"])


def test_two_trainers_merge_their_updates_into_the_stored_params(tmp_path):
    url = f"sqlite:///{tmp_path / 'fleet.db'}"
    # 375 updates of 20 ms: the trainers run past their first report (every 2 s), whose push metrics are checked
    pace = ["--set", "updates_per_step=0.25", "--set", "pace_slack=32", "--set", "train_sleep=0.02"]
    run_cli(FAKE, "run", "--trainers", "2", "-n", "1500", "--eval-episodes", "0", *pace, "--db", url, cwd=tmp_path)
    db = connect(url, "fake_experiment")
    updates = int(db.load_params()[1]["updates"][0])
    # each update adds 1 to a counter in the params: both trainers' pushes landed, none overwrote the other's
    assert updates == db.counter("updates") > 300
    reports = db.metrics("train")
    assert reports, "the trainers reported no metrics"
    assert all(r["push_s"] >= 0 and r["push_conflicts"] >= 0 for r in reports)


@pytest.mark.parametrize("target, reached", [(5.0, True), (5.5, False)])
def test_run_stops_at_target_return(tmp_path, target, reached):
    # episodes are truncated after 5 steps (CartPole cannot fall that fast): every return is 5
    url = f"sqlite:///{tmp_path / 'fleet.db'}"
    args = ["--target-return", target, "-n", "3000", "--eval-episodes", "0", "--set", "max_steps=5"]
    out = run_cli(FAKE, "run", *args, "--db", url, cwd=tmp_path, check=False)
    returns = [m["return"] for m in connect(url, "fake_experiment").metrics("episodes")]
    assert len(returns) >= 20 and set(returns) == {5.0}
    if reached:
        assert out.returncode == 0, out.stderr
        assert f"run stopped: recent mean return 5.00 ± 0 over 20 episodes reached the target {target:g}" in out.stdout
    else:  # stopped by -n: a run with a target that it missed exits 1, saying why
        assert "run stopped: reached" in out.stdout and "target" not in out.stdout
        assert out.returncode == 1
        last = out.stderr.strip().splitlines()[-1]
        assert re.fullmatch(
            r"tinyverse: error: run stopped \(reached [\d,]+ env steps\) short of --target-return 5.5: .+", last
        )


def test_run_whose_workers_all_exit_before_its_target_exits_1(tmp_path):
    url = f"sqlite:///{tmp_path / 'fleet.db'}"
    args = ["--target-return", "1000", "--eval-episodes", "0", "--set", "max_steps=5", "--db", url]
    run = Proc([FAKE, "run", *args], tmp_path, name="run")
    try:
        db = connect(url, "fake_experiment", retry_for=30)
        wait_for(lambda: run.running() and len(db.workers()) == 2, 60, "a player and a trainer")
        run_cli(FAKE, "clear", "--kill-players", "--kill-trainers", "--db", url, cwd=tmp_path)
        code = run.p.wait(timeout=60)
    finally:
        run.kill()
    assert "run stopped: every worker exited by itself" in run.stdout()
    assert code == 1, run.stderr()
    last = run.stderr().strip().splitlines()[-1]
    assert last.startswith("tinyverse: error: run stopped (every worker exited by itself) short of --target-return")


def test_run_restarts_a_crashing_worker_then_gives_up(tmp_path):
    url = f"sqlite:///{tmp_path / 'fleet.db'}"
    args = ["--max-crashes", "2", "--set", "fail_at=1", "--db", url]
    env = {"TMPDIR": tmp_path}  # run keeps the workers' logs of a crash in a temp folder: this test's, not /tmp
    out = run_cli(FAKE, "run", *args, cwd=tmp_path, env=env, check=False)
    assert out.returncode == 1
    assert "trainer-0 exited with code 1; restarting in 1s" in out.stderr
    assert "restarting trainer-0" in out.stderr
    assert "tinyverse: error: trainer-0 crashed 2 times" in out.stderr
    assert "RuntimeError: train_step failed at update 1" in out.stderr  # its output is shown
    assert [p.name for p in tmp_path.glob("tinyverse-fake_experiment-*/trainer-0.log")] == ["trainer-0.log"]
    db = connect(url, "fake_experiment")
    assert wait_for(lambda: db.workers() == [], 15, "the player to leave")
    assert not np.isnan(db.load_params()[1]["w"]).any()  # the failed trainer published nothing


def test_run_ctrl_c_stops_every_worker(tmp_path):
    url = f"sqlite:///{tmp_path / 'fleet.db'}"
    env = cli_env()
    progress = tmp_path / "progress"
    cmd = [sys.executable, "-m", "tinyverse", str(FAKE), "run", "--players", "2", "--set", f"progress={progress}"]
    cmd += ["--db", url]
    proc = subprocess.Popen(cmd, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        db = connect(url, "fake_experiment")
        workers = wait_for(lambda: len(db.workers()) == 3 and db.workers(), 60, "three workers")
        wait_for(lambda: (db.metrics("train", 1) or [{}])[-1].get("updates", 0) > 0 or db.params_version() > 1, 60)
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 0, err
    assert "run stopped: interrupted" in out
    for w in workers:  # every child exited
        assert not Path(f"/proc/{w['pid']}").exists() or "Z" in Path(f"/proc/{w['pid']}/stat").read_text().split()[2]
    assert db.workers() == []
    updates = int(db.load_params()[1]["updates"][0])
    assert updates > 0
    # Ctrl-C's warm stop publishes every update made, not just those of the last periodic save
    assert updates == int(progress.read_text())
    assert db.counter("updates") == updates, "the pace counts exactly the updates made"
    # the final eval runs after an interrupt too, with the params published on the way out
    assert re.search(rf"^mean return .* over 10 episodes \(params v{db.params_version()}\)$", out, re.M), out


def test_a_worker_asked_to_stop_through_the_database_stops(tmp_path, db_url, prefix):
    """What clear does for workers on other machines: they stop within a heartbeat period."""
    env = cli_env()
    cmd = [sys.executable, "-m", "tinyverse", str(FAKE), "play", "--db", db_url, "--prefix", prefix]
    proc = subprocess.Popen(cmd, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    db = connect(db_url, prefix, retry_for=5)
    try:
        (worker,) = wait_for(db.workers, 60, "the player's heartbeat")
        db.request_stop(worker["id"])
        proc.wait(timeout=15)
        assert proc.returncode == 0
        assert "asked to stop through the database" in proc.stderr.read()
        assert db.workers() == []
    finally:
        proc.kill()
        db.clear(sessions=True, params=True, workers=True, metrics=True)


def test_info_shows_the_fleet(tmp_path):
    url = f"sqlite:///{tmp_path / 'info.db'}"
    connect(url, "fake_experiment")  # a database with no data yet
    empty = run_cli("info", "--db", url, cwd=tmp_path)
    assert "no experiments" in empty.stdout
    run_cli(FAKE, "play", "-n", "20", "--set", "max_steps=20", "--db", url, cwd=tmp_path)  # episodes end
    db = connect(url, "fake_experiment")
    db.heartbeat(
        "trainer-x",
        {"role": "trainer", "host": "gpu-box", "pid": 42, "started": time.time() - 300, "updates_per_s": 12.5},
    )
    trainer = {"role": "trainer", "host": "cloud", "pid": 9, "started": time.time() - 60, "updates_per_s": 40}
    db.heartbeat("trainer-z", {**trainer, "version": 1, "pushes": 1200, "conflicts": 7})
    db.heartbeat(
        "player-y",
        {"role": "player", "host": "laptop", "pid": 7, "started": time.time() - 90, "steps_per_s": 1234, "version": 0},
    )
    db.save_params(db.load_params()[1])  # version 2: the player above acts with params 2 versions old
    out = run_cli(FAKE, "info", "--db", url, cwd=tmp_path).stdout
    assert "[fake_experiment]" in out
    assert "sessions  40 stored" in out  # 20 rounds of the fake's 2 environments
    assert "params    version 2, saved" in out
    assert "trainer   gpu-box pid 42  up 5m  12.5 updates/s\n" in out
    assert "trainer   cloud pid 9  up 60s  40.0 updates/s  params v1, lag 1  1,200 pushes, 7 races lost" in out
    assert "player    laptop pid 7  up 90s  1,234 steps/s  params v0, lag 2" in out
    assert "returns   last" in out
    assert run_cli("info", "--db", url, cwd=tmp_path).stdout.startswith("[fake_experiment]")


def test_info_says_when_redis_is_unreachable(tmp_path, closed_port):
    t0 = time.monotonic()
    out = run_cli("info", "--db", f"redis://127.0.0.1:{closed_port}/0", cwd=tmp_path, check=False)
    assert out.returncode == 1 and time.monotonic() - t0 < 60
    last = out.stderr.strip().splitlines()[-1]
    assert last.startswith("tinyverse: error: cannot reach database redis://127.0.0.1") and "--db" in last
    assert "Traceback" not in out.stderr


def test_plot_writes_a_png(tmp_path):
    url = f"sqlite:///{tmp_path / 'plot.db'}"
    connect(url, "fake_experiment")
    missing = run_cli(FAKE, "plot", "--db", url, cwd=tmp_path, check=False)
    assert missing.returncode == 1 and "no episode returns stored" in missing.stderr
    run_cli(FAKE, "play", "-n", "30", "--set", "max_steps=20", "--db", url, cwd=tmp_path)
    run_cli(FAKE, "train", "-n", "20", "--db", url, cwd=tmp_path)
    out = run_cli(FAKE, "plot", "-o", "curve.png", "--db", url, cwd=tmp_path)
    png = (tmp_path / "curve.png").read_bytes()
    assert "wrote curve.png" in out.stdout
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 10_000


def test_info_text_of_an_empty_namespace(db):
    head, *rest = info_text(db).splitlines()
    assert head == f"[{db.prefix}] {db.url}"
    assert rest == [f"  empty: start a player with python -m tinyverse EXPERIMENT.py play --prefix {db.prefix}"]
    db.add_metrics("train", [{"time": time.time(), "updates": 1}])  # metrics alone: still nothing to show
    assert info_text(db).splitlines()[1:] == rest
    db.add_sessions([{"x": np.zeros(2)}], capacity=10)
    assert "empty" not in info_text(db).replace(db.url, "")


def test_deleting_data_under_live_workers_never_resets_params(tmp_path):
    """clear --del-*: players and trainers carry on; deleted params come back trained, not random."""
    url = f"sqlite:///{tmp_path / 'live.db'}"
    env = cli_env()
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "tinyverse", str(FAKE), mode, *extra, "--set", "train_sleep=0.005", "--db", url],
            cwd=tmp_path,
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        for mode, extra in (("play", []), ("train", ["-s", "5"]))
    ]
    db = connect(url, "fake_experiment")
    try:
        wait_for(lambda: (p := db.load_params()) and p[1]["updates"][0] >= 20, 60, "trained params")
        trained_w = db.load_params()[1]["w"]
        run_cli(FAKE, "clear", "--del-weights", "--db", url, cwd=tmp_path)
        back = wait_for(db.load_params, 30, "params to come back")
        assert back[1]["updates"][0] > 0, "params came back as a random init"
        np.testing.assert_array_equal(back[1]["w"], trained_w)

        run_cli(FAKE, "clear", "--del-sessions", "--del-metrics", "--db", url, cwd=tmp_path)
        added = db.count_sessions()[1]
        wait_for(lambda: db.count_sessions()[1] > added + 10 and db.metrics("episodes"), 30, "new sessions")
        assert all(p.poll() is None for p in procs), "a worker died"
        assert db.load_params()[1]["updates"][0] >= back[1]["updates"][0]
    finally:
        for p in procs:
            p.send_signal(signal.SIGTERM)
        for p in procs:
            assert p.wait(timeout=30) == 0, p.stderr.read()


def test_clear_asks_workers_on_other_machines_to_stop(tmp_path):
    url = f"sqlite:///{tmp_path / 'remote.db'}"
    db = connect(url, "fake_experiment")
    remote = {"id": "player-far-1", "role": "player", "host": "far-away-box", "pid": os.getpid(), "started": 0}
    db.heartbeat(remote["id"], remote, ttl=60)
    out = run_cli(FAKE, "clear", "--kill-players", "--db", url, cwd=tmp_path)
    assert f"asked player pid {os.getpid()} on far-away-box to stop" in out.stdout
    assert db.stop_requested(remote["id"])  # its next heartbeat sees this and it stops
    assert not db.stop_requested("player-near-2")


def test_clear_all_keeps_the_stop_requests_of_workers_on_other_machines(tmp_path, db_url, prefix):
    db = connect(db_url, prefix, retry_for=5)
    try:
        db.add_sessions([{"x": np.zeros(3)}] * 4, capacity=10)
        db.save_params({"w": np.ones(2)})
        db.add_metrics("episodes", [{"return": 1.0}])
        db.add_to_counter("updates", 5)
        db.claim("options", {"epsilon": 0.5})
        remote = {"id": "player-far-2", "role": "player", "host": "far-away-box", "pid": 99, "started": 0}
        db.heartbeat(remote["id"], remote, ttl=60)  # it never leaves: clear waits a while, then deletes anyway
        out = run_cli(FAKE, "clear", "--all", "--db", db_url, "--prefix", prefix, cwd=tmp_path)
        assert "asked player pid 99 on far-away-box to stop" in out.stdout
        assert f"{prefix}: cleared sessions, params, metrics" in out.stdout
        assert db.stop_requested(remote["id"]), "the stop request went with the data: the remote player plays on"
        assert db.count_sessions()[0] == 0 and db.params_version() is None and db.metrics("episodes") == []
        assert db.workers() == [] and db.counter("updates") == 0 and db.setting("options") is None
    finally:
        db.remove_worker("player-far-2")
        db.clear(sessions=True, params=True, workers=True, metrics=True)


# -- the pace, with real processes -------------------------------------------------------------------------------------
@pytest.fixture
def spawn(tmp_path):
    """``python -m tinyverse FAKE MODE ...``: conftest's process helper, killed when the test ends."""
    return lambda *args: start(FAKE, *args, cwd=tmp_path)


def waiting(db, role: str, why: str) -> dict | None:
    """The heartbeat of a ``role`` whose ``waiting`` says ``why``."""
    return next((w for w in db.workers() if w["role"] == role and why in (w.get("waiting") or "")), None)


def heartbeats_while_waiting(db, role: str, why: str, procs) -> dict:
    """Wait until a worker waits for ``why``, then for a later heartbeat that still says so."""

    def alive() -> bool:  # a worker that died fails the wait at once, with its stderr, not after its timeout
        return all(p.running() for p in procs)

    first = wait_for(lambda: alive() and waiting(db, role, why), 60, f"a {role} waiting {why}")
    later = wait_for(
        lambda: alive() and (w := waiting(db, role, why)) and w["time"] > first["time"] and w, 30, "a later heartbeat"
    )
    assert alive()
    return later


B, T = 2, 8  # players' environments, the fake's session length

PACES = {
    # 1 update per 25 env steps is far below what the fake trainer can do: it waits for the players
    "trainer waits": (dict(updates_per_step=0.04, pace_slack=48, train_sleep=0), "trainer", "for players: "),
    # 4 updates of 2 ms per env step is far below what a player can do: the players wait for the trainer
    "players wait": (dict(updates_per_step=4, pace_slack=48, train_sleep=0.002), "player", "for the trainers: "),
}


@pytest.mark.parametrize("case", PACES)
def test_play_and_train_keep_the_declared_pace(tmp_path, db_url, prefix, spawn, case):
    options, role, why = PACES[case]
    ratio, slack = options["updates_per_step"], options["pace_slack"]
    where = ["--db", db_url, "--prefix", prefix]
    db = connect(db_url, prefix, retry_for=5)
    try:
        player = spawn("play", "-b", B, *sets(**options), *where)
        wait_for(lambda: db.setting("options"), 60, "the player to store the options")
        trainer = spawn("train", "-b", 4, *where)  # adopts the stored options, pace included
        checks, updates = 0, 0
        deadline = time.monotonic() + 90
        while updates < 200 or checks < 50:  # the counters sampled while both run
            assert player.alive() and trainer.alive(), player.stderr() + trainer.stderr()
            assert time.monotonic() < deadline, f"{updates} updates after 90 s\n{player.stderr()}{trainer.stderr()}"
            before = db.count_sessions()[1] * T
            updates = db.counter("updates")
            after = db.count_sessions()[1] * T
            # players wait while ahead by more than the slack, and a round adds B sessions at most
            assert before - updates / ratio <= slack + B * T, (before, updates)
            # trainers wait while behind by more than the slack
            assert updates <= ratio * (after + slack) + 1e-9, (after, updates)
            checks += 1
            time.sleep(0.02)
        assert why in waiting_log(player if role == "player" else trainer), "the faster side never waited"
        assert player.stop(10) == 0 and trainer.stop(10) == 0
        assert db.workers() == []
    finally:
        db.clear(sessions=True, params=True, workers=True, metrics=True)


def waiting_log(proc: Proc) -> str:
    """The lines where ``proc`` said it waits."""
    return "\n".join(line for line in proc.stderr().splitlines() if " waiting " in line)


def test_a_player_waiting_for_the_trainers_heartbeats_and_stops(tmp_path, db_url, prefix, spawn):
    where = ["--db", db_url, "--prefix", prefix]
    options = sets(updates_per_step=1, learning_starts=16, pace_slack=16)  # no trainer: waits after 48 steps
    db = connect(db_url, prefix, retry_for=5)
    try:
        player = spawn("play", "-b", B, *options, *where)
        w = heartbeats_while_waiting(db, "player", "for the trainers: 0 updates", [player])
        played = db.count_sessions()[1] * T
        assert 16 + 16 < played <= 16 + 16 + B * T, "it played up to the slack, then waited"
        assert w["pid"] == player.p.pid
        assert w["pace"] == {"updates_per_step": 1, "learning_starts": 16, "pace_slack": 16, "session_length": T}
        info = run_cli(FAKE, "info", *where, cwd=tmp_path).stdout
        (line,) = [x for x in info.splitlines() if x.strip().startswith("player")]
        assert f"pid {player.p.pid}" in line and "waiting for the trainers" in line
        assert player.stop(5) == 0, player.stderr()
        assert db.workers() == [] and db.count_sessions()[1] * T == played, "it played no more"
        assert waiting_log(player).count("waiting for the trainers") == 1, "the reason is logged once"

        again = spawn("play", "-b", B, *where)  # adopts the pace; stopped by clear this time
        heartbeats_while_waiting(db, "player", "for the trainers", [again])
        out = run_cli(FAKE, "clear", "--kill-players", *where, cwd=tmp_path).stdout
        assert f"stopped player pid {again.p.pid}" in out
        assert again.p.wait(timeout=5) == 0
        assert db.workers() == [] and db.count_sessions()[1] * T == played
    finally:
        db.clear(sessions=True, params=True, workers=True, metrics=True)


def test_a_trainer_waiting_for_players_heartbeats_and_stops(tmp_path, db_url, prefix, spawn):
    where = ["--db", db_url, "--prefix", prefix]
    db = connect(db_url, prefix, retry_for=5)
    try:
        # a batch is stored, but fewer env steps than learning_starts
        run_cli(FAKE, "play", "-b", 2, "-n", 2, *sets(updates_per_step=1, learning_starts=1000), *where, cwd=tmp_path)
        trainer = spawn("train", "-b", 4, *where)
        w = heartbeats_while_waiting(db, "trainer", "for players: 32 of 1,000 env steps", [trainer])
        assert w["pid"] == trainer.p.pid
        info = run_cli(FAKE, "info", *where, cwd=tmp_path).stdout
        assert f"pid {trainer.p.pid}" in info and "waiting for players" in info
        assert trainer.stop(5) == 0, trainer.stderr()
        assert db.workers() == [] and db.counter("updates") == 0
        assert db.load_params()[1]["updates"][0] == 0, "no update before learning starts"
    finally:
        db.clear(sessions=True, params=True, workers=True, metrics=True)


def test_info_shows_the_lag_of_a_real_player(tmp_path, spawn):
    url = f"sqlite:///{tmp_path / 'lag.db'}"
    db = connect(url, "fake_experiment")
    player = spawn("play", "-b", 1, "-s", 100000, "--db", url)  # checks for new params once in 100000 rounds
    wait_for(lambda: player.alive() and any(w.get("version") == 1 for w in db.workers()), 60, "the player's beat")
    params = db.load_params()[1]
    db.save_params(params)
    db.save_params(params)  # version 3: the player still acts with version 1
    wait_for(
        lambda: "sessions" in (w := db.workers()[0]) and w["time"] > db.params_saved().time,
        30,
        "a later beat",
    )
    out = run_cli(FAKE, "info", "--db", url, cwd=tmp_path).stdout
    assert f"localhost pid {player.p.pid}" in out.replace(os.uname().nodename, "localhost")
    assert "params v1, lag 2" in out
    assert player.stop(10) == 0
