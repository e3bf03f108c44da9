"""examples/mountaincar.py, the experiment docs/experiment.rst walks through, used as its reader would."""

import re

import numpy as np
from conftest import ROOT, optional, run_cli, sets

from tinyverse.database import connect

torch = optional("torch")

EXAMPLE = ROOT / "examples" / "mountaincar.py"


def test_the_example_fits_in_100_lines():
    lines = len(EXAMPLE.read_text().splitlines())
    assert lines <= 100, f"examples/mountaincar.py has {lines} lines"


def test_play_train_eval_as_a_user_types_them(tmp_path):
    url = f"sqlite:///{tmp_path / 'mcar.db'}"

    def tv(*args):
        return run_cli(EXAMPLE, *args, "--db", url, cwd=tmp_path, timeout=60)

    # one round of 64 environments: 64 sessions of 32 ticks, past the 2,000 env steps learning starts after
    tv("play", "-n", "1", "-b", "64", *sets(eps_updates=4))
    db = connect(url, "mountaincar")
    first = db.get_batch(list(range(db.session_range()[0], db.session_range()[1] + 1)))
    assert len(first["rewards"]) == 64 and first["rewards"].shape[1] == 32
    assert np.abs(first["observations"]).max() <= 1  # make_env scales them to [-1, 1]
    np.testing.assert_allclose(first["info.epsilon"], 1.0)  # no update yet: all exploration
    assert db.params_version() == 1  # the player seeded random-init params

    out = tv("train", "-n", "3").stderr
    assert "stopped after 3 updates here (3 in the run); params version 2 is stored" in out
    assert "sessions  64 stored" in (info := tv("info").stdout) and "params    version 2" in info
    assert "n_step=8 (int): n-step returns" in info  # the options, with their docstrings

    # the epsilon schedule follows the run's update count, which the core keeps: 3 of 4 updates done, so
    # three quarters of the way from 1 to eps_end (0.05)
    tv("play", "-n", "1", "-b", "2")
    oldest, newest = db.session_range()
    np.testing.assert_allclose(db.get_batch([newest - 1, newest])["info.epsilon"], 1 - 0.75 * 0.95)
    db.close()

    out = tv("eval", "-n", "1", "--no-record").stdout
    assert re.search(r"episode 1/1: return -?\d", out), out
    assert re.search(r"mean return -?[\d.]+ ± [\d.]+ over 1 episodes \(params v2\)", out), out
