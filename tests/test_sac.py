"""examples/sac.py: presets, the soft target by hand, the squashed Gaussian's log-probability, no noise option."""

import math

import numpy as np
import pytest
from conftest import optional

import tinyverse
from tinyverse.loader import load_experiment

torch = optional("torch")  # the example imports it too
from continuous_examples import FILES, MODULES, critic_coef, linears, make, set_affine, td3_and_sac_batch  # noqa: E402

sac = MODULES["sac"]


def test_presets_fill_what_is_unset():
    pendulum = sac.Args()  # RL-Zoo's sac.yml on Pendulum-v1: its learning rate, SB3's defaults for the rest
    assert (pendulum.learning_rate, pendulum.gamma, pendulum.net_arch, pendulum.learning_starts) == (
        1e-3,
        0.99,
        "256,256",
        100,
    )
    walker = sac.Args(env_id="BipedalWalker-v3")
    assert (walker.learning_rate, walker.gamma, walker.tau, walker.buffer_transitions) == (7.3e-4, 0.98, 0.02, 300_000)
    assert sac.Args(env_id="MountainCarContinuous-v0").learning_rate == 3e-4  # no preset: SB3's SAC default
    # SAC explores by sampling its own policy: there is no noise to choose, and asking for one is one line
    with pytest.raises(tinyverse.TinyverseError, match="noise") as e:
        load_experiment(str(FILES["sac"]), None, {"noise": "gaussian"})
    assert len(str(e.value).splitlines()) == 1
    assert make("sac").session_info() == {"alpha": pytest.approx(1.0)}


def test_sac_target_is_the_soft_value_with_the_entropy_bonus():
    exp = make("sac", gamma=0.9, alpha=0.5)
    set_affine(linears(exp.target_q1), critic_coef(1.0, 2.0), 0.0)
    set_affine(linears(exp.target_q2), critic_coef(1.0, 0.0), 0.6)
    with torch.no_grad():  # pi(.|s): tanh of N(0.2, 0.5^2) whatever s
        for head, value in ((exp.actor.mean, 0.2), (exp.actor.log_std, math.log(0.5))):
            head.weight.zero_()
            head.bias.fill_(value)
    batch, boot_s0, discount = td3_and_sac_batch()
    torch.manual_seed(3)
    _, _, target = exp.critic_targets(batch)
    torch.manual_seed(3)
    eps = torch.randn(100, 1).numpy()[:, 0].astype(np.float64)  # the one draw of a' ~ pi(.|s')
    u = 0.2 + 0.5 * eps
    a = np.tanh(u)
    logp = -0.5 * eps**2 - math.log(0.5) - 0.5 * math.log(2 * math.pi) - np.log(1 - a**2)
    soft = np.minimum(boot_s0 + 2 * a, boot_s0 + 0.6) - 0.5 * logp
    np.testing.assert_allclose(target.numpy(), batch["rewards"].ravel() + discount * soft, rtol=1e-4, atol=1e-4)
    assert (a < 0.3).any() and (a > 0.3).any()


def test_squashed_log_prob_matches_torch_distributions():
    mean, log_std = torch.tensor([[0.3, -1.0], [2.0, 0.0]]), torch.tensor([[-1.0, 0.5], [0.2, -3.0]])
    u = mean + log_std.exp() * torch.tensor([[0.5, -1.2], [1.5, 0.1]])
    dist = torch.distributions.TransformedDistribution(
        torch.distributions.Normal(mean, log_std.exp()), torch.distributions.transforms.TanhTransform()
    )
    np.testing.assert_allclose(sac.squashed_log_prob(u, mean, log_std), dist.log_prob(torch.tanh(u)).sum(-1), rtol=1e-5)
    # far in the tail tanh(u) rounds to 1: the log-probability stays finite
    assert torch.isfinite(sac.squashed_log_prob(torch.tensor([[30.0]]), torch.tensor([[30.0]]), torch.zeros(1, 1)))
