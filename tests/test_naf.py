"""examples/naf.py: NAF's Q by hand, its greedy action, and the presets."""

import numpy as np
from conftest import optional

optional("torch")  # the example imports it too
import torch  # noqa: E402
from continuous_examples import MODULES, make  # noqa: E402

naf = MODULES["naf"]


def test_presets_fill_what_is_unset():
    assert naf.Args(env_id="LunarLanderContinuous-v3").learning_starts == 10_000  # the zoo's on Box2D
    assert naf.Args().learning_starts == 100  # SB3's TD3 default elsewhere
    assert naf.Args(env_id="BipedalWalker-v3", learning_starts=5).learning_starts == 5  # given: kept


def test_naf_q_is_v_at_mu_and_lower_elsewhere():
    exp = make("naf", env_id="LunarLanderContinuous-v3")  # two actions: L has an entry below the diagonal
    rng = np.random.default_rng(1)
    obs = torch.as_tensor(rng.standard_normal((64, 8)), dtype=torch.float32)
    with torch.no_grad():
        v, mu, L = exp.net(obs)
        assert torch.equal(L, L.tril()) and (L.diagonal(dim1=1, dim2=2) > 0).all()
        assert (L[:, 1, 0] != 0).all()
        torch.testing.assert_close(exp.net.q(obs, mu), v)  # Q(s, mu(s)) = V(s)
        act = torch.as_tensor(rng.uniform(-1, 1, (64, 2)), dtype=torch.float32)
        q = exp.net.q(obs, act)
    d = (act - mu).numpy().astype(np.float64)
    P = np.einsum("nij,nkj->nik", L.numpy(), L.numpy())  # L L^T
    np.testing.assert_allclose(q, v.numpy() - 0.5 * np.einsum("ni,nij,nj->n", d, P, d), rtol=1e-4, atol=1e-5)
    assert (q < v).all()  # every sampled action is worse than mu
    exp.updates = 1
    greedy, _ = exp.act(obs.numpy(), {}, greedy=True)
    np.testing.assert_allclose(greedy, exp.box.to_env(mu.numpy()), rtol=1e-6)
