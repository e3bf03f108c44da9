"""Sample Factory 2.1.1 (APPO) on Pong or CartPole, started by ``bench/peers.py`` in Sample Factory's own venv.

    python bench/peers/sample_factory_run.py pong --config tuned --dir RUN --seed 0
    python bench/peers/sample_factory_run.py cartpole --config defaults --dir RUN --seed 0
    python bench/peers/sample_factory_run.py evaluate --dir RUN      # greedy CartPole evals on request (stdin)

Every setting beside the defaults, with its source (the Sample Factory repository at 2.1.1: its docs
``02-configuration/configuration.md``, ``07-advanced-topics/*.md``, ``09-environment-integrations/atari.md``,
and ``sf_examples/``), is in CONFIGS; docs/benchmarks.rst ("Peers: settings and why") says why.
"""

import argparse
import json
import sys
import time
from pathlib import Path

import gymnasium as gym
from judge import EpisodeLog, evaluate

# Every config: the device (no GPU here: Sample Factory's default "gpu" fails), a seed, and where it writes.
CONFIGS = {
    "pong": {
        # sf_examples.atari's defaults (atari_params.py: CleanRL's / SB3's PPO hyperparameters, 8 workers of 1
        # env, synchronous) as they come: the documented defaults.
        "defaults": [],
        "tuned": [
            "--num_workers=2",  # configuration.md: "the number of logical cores ... the best throughput"
            "--num_envs_per_worker=4",  # configuration.md: "4 or 8 for common envs", even for double buffering
            "--worker_num_splits=2",  # double-buffered.md: step one half of a worker's envs while the other waits
            "--async_rl=True",  # atari.md's "better parameters" and sync-async.md: sample while the learner trains
            # kept from atari_params.py: rollout 128 x 8 envs = 1,024 samples, 4 minibatches of 256, 4 epochs,
            # lr 2.5e-4 decaying linearly, clip 0.1, entropy 0.01: the same data per update as SB3's RL-Zoo PPO
        ],
    },
    "cartpole": {
        "defaults": ["--save_every_sec=3"],  # the defaults; checkpoints every 3 s for the greedy eval to load
        "tuned": [  # sf_examples/train_gym_env.py's documented CartPole-v1 command line, on 2 cores
            "--use_rnn=False",
            "--recurrence=1",
            "--with_vtrace=False",
            "--batch_size=512",
            "--reward_scale=0.1",
            "--num_envs_per_worker=20",
            "--num_workers=2",  # configuration.md: one worker a logical core
            "--policy_workers_per_policy=1",  # the example's 2 inference processes are one more than a core spares
            "--save_every_sec=3",
        ],
    },
}
# ablations of tuned: which of what Sample Factory adds to PPO's settings buys its agent steps (issue 55, item 4)
CONFIGS["pong"]["tuned-no-input-norm"] = [*CONFIGS["pong"]["tuned"], "--normalize_input=False"]
CONFIGS["pong"]["tuned-no-return-norm"] = [*CONFIGS["pong"]["tuned"], "--normalize_returns=False"]


def make_pong(full_env_name, cfg, env_config=None, render_mode=None):
    """sf_examples.atari's Pong (PongNoFrameskip-v4 and the wrappers it chose to match SB3), recorded."""
    import ale_py  # noqa: F401  (registers the ALE games with Gymnasium in this process: workers are spawned)
    from sf_examples.atari.atari_utils import make_atari_env

    return EpisodeLog(make_atari_env(full_env_name, cfg, env_config, render_mode=render_mode))


def make_cartpole(full_env_name, cfg=None, env_config=None, render_mode=None):
    return EpisodeLog(gym.wrappers.RecordEpisodeStatistics(gym.make("CartPole-v1", render_mode=render_mode)))


def register() -> None:
    from sample_factory.envs.env_utils import register_env

    register_env("atari_pong", make_pong)
    register_env("CartPole-v1", make_cartpole)


def parse(game: str, argv: list[str], evaluation: bool = False):
    from sample_factory.cfg.arguments import parse_full_cfg, parse_sf_args

    parser, partial = parse_sf_args(argv=argv, evaluation=evaluation)
    if game == "pong":
        from sf_examples.atari.atari_params import atari_override_defaults

        atari_override_defaults(partial.env, parser)
    return parse_full_cfg(parser, argv)


def argv_of(game: str, config: str, workdir: str, seed: int) -> list[str]:
    env = "atari_pong" if game == "pong" else "CartPole-v1"
    where = [f"--train_dir={workdir}", "--experiment=run", f"--seed={seed}", "--device=cpu"]
    return [f"--env={env}", *where, *CONFIGS[game][config]]


def train(game: str, config: str, workdir: str, seed: int) -> int:
    from sample_factory.train import run_rl

    register()
    return run_rl(parse(game, argv_of(game, config, workdir, seed)))


def serve_evals(workdir: str) -> None:
    """Answers each stdin line ``SEED EPISODES`` with the greedy eval of the newest checkpoint, as JSON."""
    import torch
    from sample_factory.algo.learning.learner import Learner
    from sample_factory.algo.utils.action_distributions import argmax_actions
    from sample_factory.algo.utils.rl_utils import prepare_and_normalize_obs
    from sample_factory.cfg.arguments import load_from_checkpoint
    from sample_factory.model.actor_critic import create_actor_critic
    from sample_factory.model.model_utils import get_rnn_size

    torch.set_num_threads(1)
    where = ["--env=CartPole-v1", f"--train_dir={workdir}", "--experiment=run", "--device=cpu"]
    cfg = load_from_checkpoint(parse("cartpole", where, evaluation=True))  # the run's config.json, as enjoy does
    env = make_cartpole("CartPole-v1")
    model = create_actor_critic(cfg, gym.spaces.Dict({"obs": env.observation_space}), env.action_space)
    model.eval()
    state = {"rnn": None}

    def reset():  # a recurrent policy (the defaults' GRU) starts each episode from zeros
        state["rnn"] = torch.zeros([1, get_rnn_size(cfg)])

    @torch.no_grad()
    def act(obs):
        out = model(prepare_and_normalize_obs(model, {"obs": torch.as_tensor(obs[None])}), state["rnn"])
        state["rnn"] = out["new_rnn_states"]
        return int(argmax_actions(model.action_distribution()).reshape(-1)[0])

    for line in sys.stdin:
        seed, episodes = map(int, line.split())
        # *.pth: not the checkpoint_temp a save writes before its rename (the pause may catch one half written)
        found = Learner.get_checkpoints(Learner.checkpoint_dir(cfg, 0), "checkpoint_*.pth")
        if not found:
            print(json.dumps({"mean": None}), flush=True)
            continue
        # not Learner.load_checkpoint: torch >= 2.6 loads weights only by default, and Sample Factory 2.1.1's
        # checkpoints hold more (it failed on some of them here); these files are the run's own
        checkpoint = torch.load(found[-1], map_location="cpu", weights_only=False)
        model.load_state_dict(checkpoint["model"])
        mean = evaluate(act, seed, episodes, reset=reset)
        answer = {"mean": mean, "steps": int(checkpoint["env_steps"]), "saved": Path(found[-1]).stat().st_mtime}
        print(json.dumps(answer), flush=True)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("mode", choices=["pong", "cartpole", "evaluate"])
    parser.add_argument("--config", choices=sorted({c for g in CONFIGS.values() for c in g}), default="tuned")
    parser.add_argument("--dir", required=True, help="Sample Factory's train_dir for this run")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    if args.mode == "evaluate":
        serve_evals(args.dir)
    else:
        print(f"sample-factory {args.mode} {args.config}: {time.ctime()}", flush=True)
        sys.exit(train(args.mode, args.config, args.dir, args.seed))
else:
    register()  # a spawned worker imports this file as a module: its environments must be registered there too
