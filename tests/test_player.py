"""The play loop, in-process with the fake experiment on every backend: what a player records, how it follows params."""

import re

import numpy as np
import pytest
from conftest import in_thread, joined, wait_for
from fake_experiment import FakeExperiment

from tinyverse import readable
from tinyverse.errors import TinyverseError
from tinyverse.evaluation import evaluate
from tinyverse.player import play
from tinyverse.trainer import train

LAYOUT = {
    "observations": np.float32,
    "final_observations": np.float32,
    "actions": np.int64,
    "rewards": np.float32,
    "terminated": np.bool_,
    "truncated": np.bool_,
    "memory.steps": np.int64,
    "version": np.int64,
    "worker": np.int64,
}


class Spy:
    """The real database, with every batch of sessions a player adds kept in order, and its reads of the updates
    counter counted: each look of the pace reads it once."""

    def __init__(self, db):
        self.db, self.batches, self.looks = db, [], 0

    def __getattr__(self, name):
        return getattr(self.db, name)

    def counter(self, name):
        self.looks += name == "updates"
        return self.db.counter(name)

    def add_sessions(self, sessions, capacity=100_000):
        self.batches.append([{k: v.copy() for k, v in s.items()} for s in sessions])
        self.db.add_sessions(sessions, capacity=capacity)


def same_session(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(a[k].dtype == b[k].dtype and np.array_equal(a[k], b[k]) for k in a)


def expected_sessions(env, rounds: int, T: int) -> tuple[list[dict], list[tuple[float, int]]]:
    """Rebuild what a player must store for one environment from its log of resets and steps."""
    events = iter(env.events)
    kind, current = next(events)
    assert kind == "reset"
    sessions, episodes, length, ret = [], [], 0, 0.0
    for _ in range(rounds):
        s = {
            "observations": [current],
            "final_observations": np.zeros((T, *current.shape), current.dtype),
            "actions": [],
            "rewards": [],
            "terminated": [],
            "truncated": [],
            "memory.steps": length,
        }
        for t in range(T):
            kind, obs, action, reward, terminated, truncated = next(events)
            assert kind == "step"
            length, ret = length + 1, ret + reward
            for key, value in (("actions", action), ("rewards", reward)):
                s[key].append(value)
            s["terminated"].append(terminated)
            s["truncated"].append(truncated)
            if terminated or truncated:
                s["final_observations"][t] = obs
                episodes.append((ret, length))
                kind, current = next(events)
                assert kind == "reset", "an environment whose episode ended must be reset at once"
                length, ret = 0, 0.0
            else:
                current = obs
            s["observations"].append(current)
        sessions.append({k: np.array(v) for k, v in s.items()})
    return sessions, episodes


def player_waiting(db) -> dict | None:
    return next((w for w in db.workers() if w["role"] == "player" and w.get("waiting")), None)


@pytest.mark.parametrize("max_steps", [None, 5], ids=["terminated", "truncated"])
def test_player_records_sessions_across_episode_boundaries(db, max_steps):
    # w = 0 with no exploration always pushes left: CartPole terminates after 8-11 steps; a limit of 5 truncates
    B, T, rounds = 2, 8, 6
    exp = FakeExperiment(db, session_length=T, max_steps=max_steps, w_scale=0.0, epsilon=0.0)
    spy = Spy(db)
    assert play(exp, spy, batch_size=B, rounds=rounds, seed=1) == B * rounds
    assert [len(b) for b in spy.batches] == [B] * rounds

    version = db.params_version()
    tags = {int(s["worker"]) for batch in spy.batches for s in batch}
    assert len(tags) == 1, "one player tags all its sessions with one worker id"
    all_episodes = []
    for i, env in enumerate(exp.envs):
        expected, episodes = expected_sessions(env, rounds, T)
        all_episodes += episodes
        for r, want in enumerate(expected):
            got = spy.batches[r][i]
            assert got.keys() == LAYOUT.keys()
            for key, dtype in LAYOUT.items():
                assert got[key].dtype == dtype, f"{key} is {got[key].dtype}, not {np.dtype(dtype)}"
            assert got["observations"].shape == (T + 1, 4)
            assert got["final_observations"].shape == (T, 4)
            for key in ("actions", "rewards", "terminated", "truncated"):
                assert got[key].shape == (T,), key
            assert got["version"] == version
            for key, value in want.items():
                np.testing.assert_array_equal(got[key], value, err_msg=f"env {i} round {r}: {key}")
            # after a done tick: fresh reset observation next, the episode's last one kept aside
            done = got["terminated"] | got["truncated"]
            assert not np.any(got["final_observations"][~done])

    flags = np.array([[s["terminated"], s["truncated"]] for batch in spy.batches for s in batch])
    terminated, truncated = flags[:, 0], flags[:, 1]
    if max_steps is None:
        assert terminated.any() and not truncated.any()
    else:
        assert truncated.any() and not terminated.any()
        assert all(length == max_steps for _, length in all_episodes)

    # episode returns are reported as metrics, with who played them and which params
    metrics = db.metrics("episodes")
    assert sorted((m["return"], m["length"]) for m in metrics) == sorted(all_episodes)
    assert {m["version"] for m in metrics} == {version}
    assert len({m["worker"] for m in metrics}) == 1

    # what is stored is exactly what was recorded
    stored, added = db.count_sessions()
    assert stored == added == B * rounds
    flat = [s for batch in spy.batches for s in batch]
    batch = db.get_batch(list(range(1, stored + 1)))  # sessions are numbered 1, 2, ... in the order added
    assert batch["id"].tolist() == list(range(1, stored + 1))
    for j, sid in enumerate(batch["id"].tolist()):
        got = {k: np.asarray(v[j]) for k, v in batch.items() if k != "id"}
        want = {k: np.asarray(v) for k, v in flat[sid - 1].items()}
        assert same_session(got, want), f"session {sid} is not the one added as number {sid}"
    sampled = db.sample_batch(10)
    assert len(sampled["id"]) == 10 and sampled.keys() == batch.keys()
    for j, sid in enumerate(sampled["id"].tolist()):
        assert same_session(
            {k: np.asarray(v[j]) for k, v in sampled.items() if k != "id"},
            {k: np.asarray(v) for k, v in flat[sid - 1].items()},
        )


def test_player_resets_memory_when_an_episode_ends(db):
    exp = FakeExperiment(db, session_length=8, max_steps=5)  # an episode ends within every session
    spy = Spy(db)
    play(exp, spy, batch_size=3, rounds=4)
    for i, env in enumerate(exp.envs):
        expected, _ = expected_sessions(env, 4, 8)
        steps = [int(batch[i]["memory.steps"]) for batch in spy.batches]
        assert steps == [int(s["memory.steps"]) for s in expected]
        assert max(steps) < 5, "memory kept counting across episodes"


def test_player_seeds_random_params_only_when_none_exist(db):
    first = FakeExperiment(db)
    play(first, db, rounds=1)
    version, params = db.load_params()
    np.testing.assert_array_equal(params["w"], first.w)
    assert params["updates"][0] == 0

    second = FakeExperiment(db)  # another random init: must load the stored one, not replace it
    assert not np.array_equal(second.w, first.w)
    play(second, db, rounds=1)
    assert db.params_version() == version
    np.testing.assert_array_equal(db.load_params()[1]["w"], first.w)
    np.testing.assert_array_equal(second.w, first.w)

    trained = {"w": np.full((4, 2), 0.5, np.float32), "updates": np.array([7])}
    trained_version = db.save_params(trained, min_version=10)
    assert trained_version == 10
    third = FakeExperiment(db)
    spy = Spy(db)
    play(third, spy, rounds=2)
    assert db.params_version() == trained_version
    for key, value in db.load_params()[1].items():
        np.testing.assert_array_equal(value, trained[key])
    np.testing.assert_array_equal(third.w, trained["w"])
    assert [int(b[0]["version"]) for b in spy.batches] == [trained_version] * 2


@pytest.mark.parametrize("sync_every", [1, 3])
def test_player_loads_new_params_only_when_the_version_changes(db, sync_every):
    published = {}

    def publish_after_first_round(rnd):
        if rnd == 1:
            new = {"w": np.zeros((4, 2), np.float32), "updates": np.array([42])}
            published["version"] = db.save_params(new)

    db.save_params(FakeExperiment().get_params())  # another player's init, loaded at start
    exp = FakeExperiment(db, on_round=publish_after_first_round)
    spy = Spy(db)
    play(exp, spy, rounds=6, sync_every=sync_every)
    first = int(spy.batches[0][0]["version"])
    new = published["version"]
    assert new > first
    versions = [int(b[0]["version"]) for b in spy.batches]
    # version checks happen before rounds sync_every, 2*sync_every, ...: the first after the publish picks it up
    assert versions == [first] * sync_every + [new] * (6 - sync_every)
    assert exp.updates[0] == 42
    assert exp.loads == 2, "params must be loaded once at start and once when the version changed, never more"


def test_a_waiting_player_follows_new_params_and_says_so(db):
    exp = FakeExperiment(db, updates_per_step=1, learning_starts=0, pace_slack=8)
    thread, outcome = in_thread(lambda: play(exp, db, batch_size=2))
    try:
        first = wait_for(lambda: player_waiting(db), 30, "the player to wait for the trainers")
        trained = {"w": np.full((4, 2), 2.0, np.float32), "updates": np.array([1])}
        version = db.save_params(trained)
        wait_for(lambda: exp.loads == 1, 30, "the waiting player to load the new params")
        np.testing.assert_array_equal(exp.w, trained["w"])
        # its heartbeat says which params it acts with: info's lag is computed from it
        wait_for(lambda: (player_waiting(db) or {}).get("time", 0) > first["time"], 30, "a later heartbeat")
        assert player_waiting(db)["version"] == version
    finally:
        for w in db.workers():
            db.request_stop(w["id"])
        joined(thread, outcome)


def test_a_waiting_player_told_to_sync_every_few_rounds_keeps_its_params(db):
    # --sync-every S > 1 means what it says even while the player waits: its lag may grow (the lag benchmark)
    exp = FakeExperiment(db, updates_per_step=1, learning_starts=0, pace_slack=8)
    spy = Spy(db)
    thread, outcome = in_thread(lambda: play(exp, spy, batch_size=2, sync_every=50))
    try:
        wait_for(lambda: player_waiting(db), 30, "the player to wait for the trainers")
        db.save_params({"w": np.full((4, 2), 2.0, np.float32), "updates": np.array([1])})
        looked = spy.looks
        wait_for(lambda: spy.looks >= looked + 25, 30, "25 looks of the waiting loop at the pace since the params")
        assert exp.loads == 0 and not np.array_equal(exp.w, np.full((4, 2), 2.0))
    finally:
        for w in db.workers():
            db.request_stop(w["id"])
        joined(thread, outcome)


def test_per_tick_outputs_of_act_are_stored_with_the_sessions(db):
    # act may return (actions, memory, outputs): each output is recorded per tick, beside the actions
    B, T = 3, 8
    exp = FakeExperiment(db, session_length=T, max_steps=5, outputs=True)  # episodes end inside sessions
    assert play(exp, db, batch_size=B, rounds=2) == 2 * B
    batch = db.get_batch([1, 2, 3, 4, 5, 6])
    assert batch["outputs.obs_sum"].shape == (6, T) and batch["outputs.obs_sum"].dtype == np.float32
    assert batch["outputs.twice"].shape == (6, T, 2) and batch["outputs.twice"].dtype == np.int64
    # each tick's output belongs to that tick's observation and action, across episode ends
    np.testing.assert_allclose(batch["outputs.obs_sum"], batch["observations"][:, :T].sum(-1), rtol=1e-6)
    np.testing.assert_array_equal(batch["outputs.twice"][..., 0], batch["actions"])
    np.testing.assert_array_equal(batch["outputs.twice"][..., 1], batch["actions"])
    assert ["outputs.obs_sum", "<f4", [T]] in db.setting("layout")
    # the trainer gets them in its batches; eval ignores them
    trainer, seen = FakeExperiment(db, session_length=T, outputs=True), []
    step = trainer.train_step
    trainer.train_step = lambda batch: (seen.append(batch), step(batch))[1]
    train(trainer, db, batch_size=2, updates=1)
    assert seen[0]["outputs.obs_sum"].shape == (2, T)
    assert len(evaluate(FakeExperiment(db, max_steps=5, outputs=True), db, episodes=2)) == 2


@pytest.mark.parametrize(
    "extra, problem",
    [
        (lambda a: ({"logp": np.zeros(len(a) + 1)},), "outputs.logp of shape (3,): outputs are batched, (2, ...)"),
        (lambda a: ([a],), "act returned outputs of type list: outputs are a dict of arrays"),
        (lambda a: ({}, {}), "act returned 4 items: return (actions, memory[, outputs])"),
    ],
)
def test_outputs_of_the_wrong_kind_are_one_clear_error(db, extra, problem):
    exp = FakeExperiment(db)
    act = exp.act
    exp.act = lambda o, m, greedy=False: (*act(o, m, greedy), *extra(o))
    with pytest.raises(TinyverseError, match=re.escape(problem)):
        play(exp, db, batch_size=2, rounds=1)
    assert db.count_sessions() == (0, 0), "nothing was stored"


def test_evaluate_plays_full_greedy_episodes_with_the_latest_params(db, capsys):
    trained = {"w": np.zeros((4, 2), np.float32), "updates": np.array([3])}
    version = db.save_params(trained)
    exp = FakeExperiment(db, max_steps=20)
    returns = evaluate(exp, db, episodes=3, record=None, seed=0)
    np.testing.assert_array_equal(exp.w, trained["w"])
    (env,) = exp.envs
    lengths, n = [], 0
    for event in env.events[1:]:
        n += event[0] == "step"
        if event[0] == "reset" or event is env.events[-1]:
            lengths.append(n)
            n = 0
    assert returns == [float(x) for x in lengths], "a return is the sum of an episode's rewards"
    assert exp.greedy_calls == sum(lengths), "eval must ask for the greedy policy"
    out = capsys.readouterr().out
    for i, r in enumerate(returns):
        assert f"episode {i + 1}/3: return {readable.number(r)}, length {lengths[i]}" in out
    assert f"mean return {readable.mean(returns)} (params v{version})" in out
    assert evaluate(FakeExperiment(db, max_steps=20), db, episodes=3, seed=0) == returns, "seeded eval repeats"
