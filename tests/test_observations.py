"""Observations of nested Dict and Tuple spaces, on every backend: recorded as flat named arrays, handed to act and
train_step nested as the space, sampled back exactly, through the CLI too; n-step transitions of such batches."""

import numpy as np
import pytest
from conftest import ROOT, run_cli
from nested_experiment import NestedExperiment, mask_of

from tinyverse import nstep_transitions
from tinyverse.database import connect
from tinyverse.errors import ExperimentError, TinyverseError
from tinyverse.evaluation import evaluate
from tinyverse.player import play
from tinyverse.trainer import train

NESTED = ROOT / "tests" / "nested_experiment.py"
LAYOUTS = {  # the arrays a session of each space stores, as (T+1, ...) for T = 5
    "dict": {
        "observations.pos": ("float32", (6, 2)),
        "observations.mask": ("int8", (6, 3)),
        "observations.inner.frame": ("uint8", (6, 3, 4)),
        "observations.inner.count": ("int64", (6,)),
        "observations.seat": ("int64", (6,)),
    },
    "tuple": {
        "observations.0": ("float32", (6, 2)),
        "observations.1.mask": ("int8", (6, 3)),
        "observations.1.frame": ("uint8", (6, 3, 4)),
        "observations.2.0": ("int64", (6,)),
    },
}


def flat(obs, name="observations") -> dict:
    """An observation (or a batch of them) as the named arrays a session stores."""
    if isinstance(obs, dict | tuple):
        items = obs.items() if isinstance(obs, dict) else enumerate(obs)
        return {n: v for k, o in items for n, v in flat(o, f"{name}.{k}").items()}
    return {name: np.asarray(obs)}


def expected_sessions(env, rounds: int, T: int) -> list[dict]:
    """What a player must store for ``env`` from its log: the observations, final observations and rewards."""
    events = iter(env.events)
    current = flat(next(events)[1])
    sessions = []
    for _ in range(rounds):
        s = {k: [v] for k, v in current.items()}
        s |= {f"final_{k}": np.zeros((T, *v.shape), v.dtype) for k, v in current.items()}
        s |= {"actions": [], "rewards": [], "terminated": [], "truncated": []}
        for t in range(T):
            kind, obs, *acted = next(events)
            assert kind == "step"
            for key, value in zip(("actions", "rewards", "terminated", "truncated"), acted, strict=True):
                s[key].append(value)
            current = flat(obs)
            if s["terminated"][-1] or s["truncated"][-1]:
                for k, v in current.items():
                    s[f"final_{k}"][t] = v
                kind, obs = next(events)
                assert kind == "reset", "an environment whose episode ended must be reset at once"
                current = flat(obs)
            for k, v in current.items():
                s[k].append(v)
        sessions.append({k: np.asarray(v) for k, v in s.items()})
    return sessions


def leaf(nested, name: str):
    """The array of ``nested`` (a batch's observations) that a session stores as ``name``."""
    for key in name.split(".")[1:]:
        nested = nested[int(key)] if isinstance(nested, tuple) else nested[key]
    return nested


@pytest.mark.parametrize("space", ["dict", "tuple"])
def test_nested_observations_are_recorded_and_sampled_back_exactly(db, space):
    B, T, rounds = 2, 5, 3
    exp = NestedExperiment(db, space, T)
    assert play(exp, db, batch_size=B, rounds=rounds, seed=3) == B * rounds
    layout = {name: (np.dtype(dtype).name, tuple(shape)) for name, dtype, shape in db.setting("layout")}
    stored = {k: v for k, v in layout.items() if k.startswith("observations")}
    assert stored == LAYOUTS[space]
    finals = {k: v for k, v in layout.items() if k.startswith("final_")}
    assert finals == {f"final_{k}": (dtype, (T, *shape[1:])) for k, (dtype, shape) in LAYOUTS[space].items()}
    lo, hi = db.session_range()
    batch = db.get_batch(list(range(lo, hi + 1)))  # the storage form: flat names, the round's sessions in order
    assert {k for k in batch if "observations" in k} == {*LAYOUTS[space], *finals}
    ended = 0
    for i, env in enumerate(exp.envs):
        for r, want in enumerate(expected_sessions(env, rounds, T)):
            for key, value in want.items():
                got = batch[key][r * B + i]
                assert got.dtype == value.dtype or key in ("actions", "rewards"), key
                np.testing.assert_array_equal(got, value, err_msg=f"env {i} round {r}: {key}")
            ended += int(np.sum(want["terminated"] | want["truncated"]))
    assert ended >= 4 and batch["terminated"].any() and batch["truncated"].any()
    # act got each tick's observations nested as the space: the arrays the sessions recorded
    for t, seen in enumerate(exp.seen):
        r, tick = divmod(t, T)
        for name in LAYOUTS[space]:
            np.testing.assert_array_equal(leaf(seen, name), batch[name][r * B : r * B + B, tick])
    # sampled for a trainer: nested as the space, the same arrays
    train(exp, db, batch_size=4, updates=2)
    assert len(exp.batches) == 2
    for got in exp.batches:
        assert not [k for k in got if k.startswith(("observations.", "final_observations."))]
        stored = db.get_batch(got["id"].tolist())
        for name in LAYOUTS[space]:
            np.testing.assert_array_equal(leaf(got["observations"], name), stored[name])
            np.testing.assert_array_equal(leaf(got["final_observations"], name), stored[f"final_{name}"])
    sampled = db.sample_batch(3)
    assert sampled["observations.1.frame" if space == "tuple" else "observations.inner.frame"].shape == (3, T + 1, 3, 4)


def test_eval_plays_nested_observations(db):
    exp = NestedExperiment(db, "tuple")
    assert evaluate(exp, None, episodes=2, quiet=True) == [10.0, 6.0]  # 1+2+3+4 truncated, then 1+2+3 terminated
    assert len(exp.seen) == 7 and all(len(mask_of(s)) == 1 for s in exp.seen)  # batches of one


def test_nstep_transitions_of_a_dict_batch_are_those_of_each_array():
    rng = np.random.default_rng(0)
    B, T = 3, 7
    rest = {"rewards": rng.normal(size=(B, T)).astype(np.float32), "actions": rng.integers(0, 3, (B, T))}
    rest |= {"terminated": rng.random((B, T)) < 0.2, "truncated": rng.random((B, T)) < 0.2}
    arrays = {  # name: (observations, final observations)
        "observations.pos": (
            rng.normal(size=(B, T + 1, 2)).astype(np.float32),
            rng.normal(size=(B, T, 2)).astype(np.float32),
        ),
        "observations.inner.0": (
            rng.integers(0, 255, (B, T + 1, 3, 4), np.uint8),
            rng.integers(0, 255, (B, T, 3, 4), np.uint8),
        ),
    }
    pos, frame = arrays["observations.pos"], arrays["observations.inner.0"]
    nested = rest | {
        "observations": {"pos": pos[0], "inner": (frame[0],)},
        "final_observations": {"pos": pos[1], "inner": (frame[1],)},
    }
    got = nstep_transitions(nested, n=3, gamma=0.9)
    assert type(got.next_observations["inner"]) is tuple and got.next_observations["inner"][0].dtype == np.uint8
    for name, (obs, final) in arrays.items():
        want = nstep_transitions(rest | {"observations": obs, "final_observations": final}, n=3, gamma=0.9)
        np.testing.assert_array_equal(leaf(got.observations, name), want.observations)
        np.testing.assert_array_equal(leaf(got.next_observations, name), want.next_observations)
        np.testing.assert_array_equal(got.returns, want.returns)
        np.testing.assert_array_equal(got.discounts, want.discounts)
    # the storage form, as db.sample_batch returns it, gives the same transitions
    stored = rest | {k: v[0] for k, v in arrays.items()} | {f"final_{k}": v[1] for k, v in arrays.items()}
    again = nstep_transitions(stored, n=3, gamma=0.9)
    for name in arrays:
        np.testing.assert_array_equal(leaf(again.next_observations, name), leaf(got.next_observations, name))
        np.testing.assert_array_equal(leaf(again.observations, name), leaf(got.observations, name))


def test_a_nested_experiment_plays_trains_and_evaluates_from_the_command_line(tmp_path):
    url = f"sqlite:///{tmp_path / 'run.db'}"
    run_cli(NESTED, "play", "-b", "2", "-n", "2", "-q", "--db", url, cwd=tmp_path)
    run_cli(NESTED, "train", "-b", "2", "-n", "2", "-q", "--db", url, cwd=tmp_path)
    out = run_cli(NESTED, "eval", "-n", "1", "--db", url, cwd=tmp_path)
    assert "episode 1/1: return 10" in out.stdout
    db = connect(url, "nested_experiment")
    assert db.count_sessions().stored == 4 and db.params_version() == 2
    batch = db.sample_batch(4)
    assert (
        batch["observations.inner.frame"].shape == (4, 6, 3, 4) and batch["observations.inner.frame"].dtype == np.uint8
    )
    db.close()
    refused = run_cli(
        NESTED, "play", "-n", "1", "--set", "space=text", "--db", f"sqlite:///{tmp_path / 'text.db'}", check=False
    )
    assert refused.returncode == 1 and refused.stderr.count("\n") == 1, refused.stderr
    assert "make_env's env observes a Text space" in refused.stderr and "FlattenObservation" in refused.stderr


def test_a_player_of_another_nesting_is_refused_by_the_stored_layout(db):
    play(NestedExperiment(db, "dict"), db, batch_size=2, rounds=1)
    with pytest.raises(TinyverseError) as e:
        play(NestedExperiment(db, "tuple"), db, batch_size=2, rounds=1)
    line = str(e.value)
    assert "\n" not in line and "another layout" in line and "missing observations.0" in line, line
    assert "unexpected observations.inner.frame" in line and db.count_sessions().stored == 2


def test_an_observation_that_does_not_fit_its_space_is_one_line(db):
    exp = NestedExperiment(db, "dict")
    make = exp.make_env

    def missing_pos():
        env = make()
        env.observation_space.sample = lambda: {"mask": np.ones(3, np.int8)}  # without pos, inner, seat
        return env

    exp.make_env = lambda render_mode=None: missing_pos()
    with pytest.raises(ExperimentError) as e:
        play(exp, db, batch_size=1, rounds=1)
    assert str(e.value).startswith("the env observed observations without 'pos': return observations of its")
    assert "\n" not in str(e.value) and db.count_sessions().stored == 0
