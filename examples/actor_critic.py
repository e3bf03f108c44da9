"""The on-policy learner that examples/atari.py and examples/recurrent.py share: V-trace and the loss.

Players record the log-probability of each action they took (``outputs.logp``);
the trainer computes its own, and weighs each tick by the ratio of the two. The
loss (``loss``) is PPO's clipped surrogate (Schulman et al. 2017,
https://arxiv.org/abs/1707.06347) on V-trace's advantages (Espeholt et al. 2018,
https://arxiv.org/abs/1802.01561), the ratio taken to the players' recorded
policy (RLlib calls this APPO); with ``clip`` 0, IMPALA's own policy gradient
(the clipped importance weight times the advantage); with ``vtrace`` off as
well, plain A2C: every tick taken as on-policy, nothing corrects for the lag.
"""

import numpy as np
import torch
from common import pick_device


@torch.no_grad()
def vtrace(
    behaviour_logp: torch.Tensor,
    target_logp: torch.Tensor,
    rewards: torch.Tensor,
    values: torch.Tensor,
    next_values: torch.Tensor,
    ended: torch.Tensor,
    gamma: float,
    rho_bar: float = 1.0,
    c_bar: float = 1.0,
    lam: float = 1.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """V-trace value targets ``vs`` and the Q estimates ``qs`` the policy gradient uses, for (B, T) sessions.

    ``values[:, t]`` is V(x_t); ``next_values[:, t]`` the value of what followed
    tick t: V(x_t+1), the episode's final observation's where it was truncated,
    0 where it terminated. ``ended`` cuts the recursion where an episode ended,
    so nothing flows across episodes; after the last tick the target is
    bootstrapped from ``next_values``. ``qs[:, t]`` = r_t + gamma v_t+1 (IMPALA's
    advantage is the clipped weight times ``qs - values``). With equal
    log-probabilities (no lag) ``vs`` are the n-step returns to the session's
    (or the episode's) end, or with ``lam`` < 1 the lambda-returns (GAE's targets).
    """
    ratios = (target_logp - behaviour_logp).exp()
    rho, c = ratios.clamp(max=rho_bar), lam * ratios.clamp(max=c_bar)
    deltas = rho * (rewards + gamma * next_values - values)
    carry = gamma * c * (~ended)  # how much of the next tick's correction flows back to this one
    corrections = torch.zeros_like(deltas)
    running = torch.zeros_like(deltas[:, 0])
    for t in reversed(range(deltas.shape[1])):  # T small steps over the whole batch at once
        running = deltas[:, t] + carry[:, t] * running
        corrections[:, t] = running
    vs = values + corrections
    # v_s+1 for the advantage: the next tick's target within an episode, what followed it at its end
    next_vs = torch.cat([torch.where(ended[:, :-1], next_values[:, :-1], vs[:, 1:]), next_values[:, -1:]], 1)
    return vs, rewards + gamma * next_vs


def loss(logp_all, logp, recorded, values, next_values, rewards, ended, a, skip: int = 0):
    """The loss of one update on (B, T) ticks, its metrics, and the ratios to the players' policy.

    ``logp_all`` (B, T, A) and ``logp`` (B, T): the trainer's log-probabilities
    of every action and of the taken one; ``recorded`` (B, T): the players';
    ``values`` (B, T+1) and ``next_values`` (B, T) as :func:`vtrace` takes them;
    ``a``: the options (gamma, lam, rho_bar, c_bar, clip, vtrace,
    normalize_advantages, vf_coef, ent_coef); ``skip``: leading ticks left out
    of the loss (a burn-in).
    """
    T = logp.shape[1]
    vs, advantages, ratios, metrics = targets(logp, recorded, values, next_values, rewards, ended, a)
    kept = (x[:, skip:] for x in (logp_all, logp, recorded, values[:, :T], vs, advantages))
    total, more = surrogate(*kept, a)
    return total, metrics | more, ratios


@torch.no_grad()
def targets(logp, recorded, values, next_values, rewards, ended, a):
    """V-trace's value targets ``vs`` and advantages for (B, T) ticks (as :func:`loss` takes them), the
    ratios of the trainer's policy to the players', and the ratios' metrics."""
    T = logp.shape[1]
    target = logp.detach()
    ratios = (target - recorded).exp()  # what V-trace weighs ticks by (measured when it is off too)
    behaviour = recorded if a.vtrace else target  # off: as if the data were on-policy (plain A2C)
    values = values[:, :T].detach()
    vs, qs = vtrace(behaviour, target, rewards, values, next_values, ended, a.gamma, a.rho_bar, a.c_bar, a.lam)
    metrics = {"rho_mean": ratios.mean().item(), "rho_clipped": (ratios > a.rho_bar).float().mean().item()}
    return vs, qs - values, ratios, metrics


def surrogate(logp_all, logp, recorded, values, vs, advantages, a):
    """The loss on ticks of any shape given their value targets and advantages (:func:`targets`), and its
    metrics: the policy's, the value's and the entropy's."""
    if a.normalize_advantages:  # over these ticks (PPO: over each minibatch)
        advantages = (advantages - advantages.mean()) / (advantages.std() + 1e-8)
    more = {}
    if a.clip:  # PPO's clipped surrogate on the ratio to the behaviour policy (APPO)
        ratio = (logp - recorded).exp()
        pg_loss = -torch.min(ratio * advantages, ratio.clamp(1 - a.clip, 1 + a.clip) * advantages).mean()
        more["clip_fraction"] = ((ratio - 1).abs() > a.clip).float().mean().item()  # as SB3 reports it
    else:  # IMPALA: the clipped importance weight times the advantage
        behaviour = recorded if a.vtrace else logp.detach()
        rho = (logp.detach() - behaviour).exp().clamp(max=a.rho_bar)
        pg_loss = -(logp * rho * advantages).mean()
    value_loss = 0.5 * ((vs - values) ** 2).mean()
    entropy = -(logp_all.exp() * logp_all).sum(-1).mean()
    total = pg_loss + a.vf_coef * value_loss - a.ent_coef * entropy
    metrics = {"loss": total.item(), "pg_loss": pg_loss.item(), "value_loss": value_loss.item()}
    return total, metrics | more | {"entropy": entropy.item(), "value": values.mean().item()}


def sample_recent(db, batch_size: int, recent: int) -> dict:
    """``batch_size`` sessions drawn among the newest ``recent`` (none: "not yet"), with each one's
    ``policy_lag``: how many params versions behind the stored ones the params that played it were."""
    lo, hi = db.session_range()
    lo = max(lo, hi - max(recent, batch_size) + 1)
    if hi - lo + 1 < batch_size:
        return {}
    ids = np.random.default_rng().choice(np.arange(lo, hi + 1), batch_size, replace=False)
    batch = db.get_batch(ids.tolist())
    if batch:
        batch["policy_lag"] = (db.params_version() or 0) - batch["version"]
    return batch


def declare_pace(exp, a) -> None:
    """Session length, batch and the pace from the options: each recorded tick is trained on ``max_reuse``
    times on average, and players never run further ahead than what is sampled."""
    exp.session_length = a.session_length
    exp.train_batch_size = max(1, round(a.batch_ticks / a.session_length))
    exp.updates_per_step = a.max_reuse / (exp.train_batch_size * exp.session_length)
    exp.pace_slack = a.recent_sessions * exp.session_length // 2


def prepare(exp, learning_rate: float) -> None:
    """The trainer's device (``$TINYVERSE_DEVICE``: auto = CUDA when there is one; per process, not an
    option) and its optimizer: Adam rather than A2C's RMSprop, whose averages start at 0 in PyTorch and make
    the first steps 10x too large; fused: one kernel for all params (Pong, one CPU thread: 0.5 ms a step, not 2.1)."""
    exp.device = pick_device()
    exp.net.to(exp.device)
    exp.optimizer = torch.optim.Adam(exp.net.parameters(), lr=learning_rate, eps=1e-5, fused=True)
