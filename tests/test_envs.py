"""Every example's environment passes Gymnasium's own checker, built as the example builds it (its make_env)."""

import warnings

import pytest
from conftest import ROOT, optional

from tinyverse.loader import load_experiment

optional("torch")  # the examples import it
from gymnasium.utils.env_checker import check_env  # noqa: E402

EXAMPLES = ROOT / "examples"
CASES = [  # example, options, the optional package it needs (None: the examples extra alone)
    ("cartpole_dqn.py", {}, None),
    ("cartpole_numpy.py", {}, None),
    ("dqn.py", {}, None),
    ("dqn.py", {"env_id": "LunarLander-v3"}, "Box2D"),
    ("recurrent.py", {}, None),  # masked CartPole: ObservationSubset
    ("recurrent.py", {"flicker": "0.5"}, None),
    ("ddpg_td3.py", {}, None),  # Pendulum
    ("sac.py", {"env_id": "LunarLanderContinuous-v3"}, "Box2D"),
    ("naf.py", {"env_id": "BipedalWalker-v3"}, "Box2D"),
    ("atari.py", {}, "ale_py"),  # Pong: NoopReset, ActionSubset, Preprocess (ALE skips frames)
    ("atari.py", {"env_id": "CarRacing-v3"}, "Box2D"),  # racing.py's FastCarRacing
    ("recurrent.py", {"env_id": "VizdoomHealthGathering-v1"}, "vizdoom"),  # DoomScreen
]


@pytest.mark.parametrize("example, options, needs", CASES, ids=[f"{c[0]}-{'-'.join(c[1].values())}" for c in CASES])
def test_the_environment_passes_gymnasiums_checker(example, options, needs, monkeypatch, tmp_path):
    if needs:
        optional(needs)
    monkeypatch.chdir(tmp_path)  # ViZDoom writes _vizdoom.ini and _vizdoom/ into the working directory
    exp = load_experiment(str(EXAMPLES / example), None, options)
    env = exp.make_env()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # the checker's advice (e.g. unbounded boxes); its errors still raise
            check_env(env, skip_render_check=True)
    finally:
        env.close()
