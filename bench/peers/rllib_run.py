"""RLlib 2.60 (APPO and PPO, the new API stack) on Pong or CartPole, started by ``bench/peers.py`` in its venv.

    python bench/peers/rllib_run.py pong --config tuned --dir RUN --seed 0 --minutes 45
    python bench/peers/rllib_run.py cartpole --config defaults --dir RUN --seed 0 --budget-s 300 --eval-every-s 3
    python bench/peers/rllib_run.py pong --config ppo-tuned --dir RUN --seed 0 --minutes 45    # PPO: ppo-*

Every setting beside ``APPOConfig()``'s (``PPOConfig()``'s) defaults, with its source (the Ray repository at
2.60: ``rllib/tuned_examples/appo/pong_appo.py``, ``rllib/tuned_examples/appo/cartpole_appo.py``; for PPO
``rllib/tuned_examples/ppo/pong_ppo.py`` and ``cartpole_ppo.py``, read at the repository's commits 2fad65e and
06ec0d1, their settings spelled in 2.60's names; RLlib's docs on scaling: env runners, learners, aggregator
actors), is in ``configure``; docs/benchmarks.rst ("Peers: settings and why") says why. CartPole: after each
training iteration whose end passes the next eval time, the learner's params play the greedy eval in this
process, off the clock (the iteration has returned, so nothing trains meanwhile), and a JSON line ``{"t",
"paused", "eval", "steps"}`` is printed.
"""

import argparse
import json
import signal
import sys
import time

import gymnasium as gym
from judge import SOLVED, EpisodeLog, evaluate

START = time.time()  # the clock's start: this process's, as near bench/peers.py's spawn as it can see
CPUS = 2  # this machine's cores; Ray is told so, except for the defaults (see configure)


def make_pong(cfg: dict):
    """PongNoFrameskip-v4 as SB3 plays it: RLlib's own Atari wrappers (frame skip 4 with max, 30 NOOPs, episodic
    life, FIRE at reset, 84x84 grey, and the 4-frame stack where the config says), recorded."""
    import ale_py
    from ray.rllib.env.wrappers.atari_wrappers import wrap_atari_for_new_api_stack

    gym.register_envs(ale_py)
    env = gym.wrappers.RecordEpisodeStatistics(gym.make("PongNoFrameskip-v4"))
    return EpisodeLog(wrap_atari_for_new_api_stack(env, dim=84, framestack=cfg.get("framestack")))


def make_cartpole(cfg: dict):
    return EpisodeLog(gym.wrappers.RecordEpisodeStatistics(gym.make("CartPole-v1")))


def configure(game: str, config: str, seed: int):
    """The APPO (``ppo-*``: PPO) config of a game and config name, and how many CPUs Ray is told this machine has."""
    from ray.rllib.algorithms.appo import APPOConfig
    from ray.rllib.algorithms.ppo import PPOConfig
    from ray.rllib.core.rl_module.default_model_config import DefaultModelConfig

    ppo = config.startswith("ppo-")
    config = config.removeprefix("ppo-")
    c = (PPOConfig() if ppo else APPOConfig()).debugging(seed=seed).reporting(min_time_s_per_iteration=1)
    if config == "defaults":
        # APPOConfig()'s defaults ask for 2 env runners and a learner actor of a CPU each and a CPU for this
        # process: Ray is told 4 CPUs, or it waits for ever for the ones it lacks (oversubscribed, as asked)
        env_config = {"framestack": 4}  # the 4-frame stack in the env (RLlib's default way; SB3's setting)
        return c.environment(game, env_config=env_config if game == "pong" else {}), 4
    if game == "cartpole" and ppo:  # tuned_examples/ppo/cartpole_ppo.py
        c = c.environment("cartpole").training(lr=0.0003, num_epochs=6, vf_loss_coeff=0.01, use_kl_loss=True)
        model = DefaultModelConfig(fcnet_hiddens=[32], fcnet_activation="linear", vf_share_layers=True)
        return scale_down(c.rl_module(model_config=model)), CPUS
    if game == "cartpole":
        c = c.environment("cartpole").training(  # tuned_examples/appo/cartpole_appo.py
            train_batch_size_per_learner=1000, vf_loss_coeff=0.05, entropy_coeff=0.01, num_epochs=2, lr=0.00075,
            minibatch_size=250,
        ).rl_module(model_config=DefaultModelConfig(fcnet_hiddens=[32]))  # fmt: skip
        return scale_down(c), CPUS
    from ray.rllib.connectors.env_to_module.frame_stacking import FrameStackingEnvToModule
    from ray.rllib.connectors.learner.frame_stacking import FrameStackingLearner

    # tuned_examples/appo/pong_appo.py (and ppo/pong_ppo.py) from here on; frames stacked where they are used
    c = c.environment("pong", clip_rewards=True)
    c = c.env_runners(env_to_module_connector=lambda env, *_: FrameStackingEnvToModule(num_frames=4))
    c = c.training(learner_connector=lambda *_: FrameStackingLearner(num_frames=4))
    if ppo:  # tuned_examples/ppo/pong_ppo.py: its lr is 0.00015 a GPU; the learner here is one, on a CPU
        c = c.training(
            lambda_=0.95, kl_coeff=0.5, clip_param=0.1, vf_clip_param=10.0, entropy_coeff=0.01, num_epochs=10,
            lr=0.00015, grad_clip=100.0, grad_clip_by="global_norm",
        )  # fmt: skip
    else:
        c = c.training(
            train_batch_size_per_learner=500, target_network_update_freq=2, lr=0.0005, vf_loss_coeff=1.0,
            entropy_coeff=[[0, 0.01], [3000000, 0.0]], broadcast_interval=5, circular_buffer_num_batches=4,
            circular_buffer_iterations_per_batch=2,
        )  # fmt: skip
    return scale_down(c.rl_module(model_config=DefaultModelConfig(  # the same network in both tuned examples
        vf_share_layers=True, conv_filters=[(16, 4, 2), (32, 4, 2), (64, 4, 2), (128, 4, 2)],
        conv_activation="relu", head_fcnet_hiddens=[256],
    ))), CPUS  # fmt: skip


def scale_down(c):
    """Two cores: one env runner process with 8 environments (SB3's 8; stepped as one vector env) on one core,
    the learner in this process (num_learners=0: no learner actor to feed across processes) on the other,
    no aggregator actors (each would want a CPU of its own)."""
    c = c.env_runners(num_env_runners=1, num_envs_per_env_runner=8, num_cpus_per_env_runner=1)
    return c.learners(num_learners=0, num_aggregator_actors_per_learner=0)


def greedy_eval(algo, seed: int, episodes: int) -> float:
    """The judge's greedy eval with the learner's newest params (its module's logits, argmax), played where
    the learner lives: in this process (tuned), or in its actor (the defaults' remote learner)."""

    def play(learner) -> float:
        import torch

        module = learner.module["default_policy"]

        @torch.no_grad()
        def act(obs):
            out = module.forward_inference({"obs": torch.as_tensor(obs[None], dtype=torch.float32)})
            return int(out["action_dist_inputs"].argmax())

        return evaluate(act, seed, episodes)

    results = algo.learner_group.foreach_learner(play)  # a list (local), or RemoteCallResults of CallResults
    return results[0] if isinstance(results, list) else next(iter(results)).get()


def train(game: str, config: str, seed: int, minutes: float, budget_s: float, eval_every_s: float, episodes: int):
    import ray
    from ray.tune.registry import register_env

    register_env("pong", make_pong)
    register_env("cartpole", make_cartpole)
    c, cpus = configure(game, config, seed)
    ray.init(num_cpus=cpus, include_dashboard=False, object_store_memory=10**9, log_to_driver=False)
    algo = c.build_algo()
    start, paused, next_eval, shown = START, 0.0, eval_every_s, time.time()  # Ray's start-up counts
    try:
        while time.time() - start - paused < (budget_s if game == "cartpole" else minutes * 60):
            result = algo.train()
            if time.time() - shown >= 60:  # its own count in the log, beside the judge's (EpisodeLog)
                steps = int(result.get("env_runners", {}).get("num_env_steps_sampled_lifetime", 0))
                print(f"{time.time() - start:.0f} s: {steps} agent steps sampled", file=sys.stderr, flush=True)
                shown = time.time()
            if game == "cartpole" and time.time() - start - paused >= next_eval:
                stop = time.time()
                mean = greedy_eval(algo, seed, episodes)
                steps = int(result.get("env_runners", {}).get("num_env_steps_sampled_lifetime", 0))
                print(json.dumps({"t": stop, "paused": paused, "eval": mean, "steps": steps}), flush=True)
                paused += time.time() - stop
                next_eval = time.time() - start - paused + eval_every_s
                if mean >= SOLVED:
                    break
    except KeyboardInterrupt:  # bench/peers.py's stop (SIGINT, SIGTERM): shut Ray's processes down
        pass
    finally:
        algo.stop()
        ray.shutdown()


def interrupt(*_) -> None:
    raise KeyboardInterrupt


if __name__ == "__main__":
    signal.signal(signal.SIGINT, signal.default_int_handler)  # a job started in the background ignores SIGINT
    signal.signal(signal.SIGTERM, interrupt)
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("mode", choices=["pong", "cartpole"])
    parser.add_argument("--config", choices=["tuned", "defaults", "ppo-tuned", "ppo-defaults"], default="tuned")
    parser.add_argument("--dir", required=True, help="this run's folder (Ray's temp files)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--minutes", type=float, default=45.0, help="pong: the budget")
    parser.add_argument("--budget-s", type=float, default=300.0, help="cartpole: the training clock's budget")
    parser.add_argument("--eval-every-s", type=float, default=3.0)
    parser.add_argument("--eval-episodes", type=int, default=10)
    args = parser.parse_args()
    print(f"rllib {args.mode} {args.config}: {time.ctime()}", flush=True)
    run = (args.minutes, args.budget_s, args.eval_every_s, args.eval_episodes)
    sys.exit(train(args.mode, args.config, args.seed, *run))
