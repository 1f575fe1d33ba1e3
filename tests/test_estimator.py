"""The estimator's pieces against naive references, and unbiasedness against exact enumeration."""

import itertools
import math

import pytest
import torch

from rltok import estimator as est
from rltok.methods import get_method
from rltok.config import build_config
from rltok.objectives import per_position_ce


def naive_rtg(r, gamma):
    G = torch.zeros_like(r, dtype=torch.float64)
    acc = torch.zeros(r.shape[0], dtype=torch.float64)
    for t in range(r.shape[1] - 1, -1, -1):
        acc = r[:, t].double() + gamma * acc
        G[:, t] = acc
    return G


@pytest.mark.parametrize("gamma", [0.9, 0.99, 1.0])
@pytest.mark.parametrize("autocast", [False, True])
def test_reward_to_go_matches_loop_at_4096(gamma, autocast):
    torch.manual_seed(0)
    r = torch.randn(3, 4096)
    ref = naive_rtg(r, gamma)
    if autocast:
        with torch.autocast("cpu", dtype=torch.bfloat16):
            G = est.discounted_reward_to_go(r, gamma)
    else:
        G = est.discounted_reward_to_go(r, gamma)
    assert G.dtype == torch.float32 and G.shape == r.shape
    assert torch.isfinite(G).all()
    scale = ref.abs().max().item()
    assert (G.double() - ref).abs().max().item() <= 1e-5 * max(1.0, scale)


@pytest.mark.parametrize("S,block", [(1, 64), (7, 3), (130, 64), (64, 64)])
def test_reward_to_go_odd_lengths(S, block):
    r = torch.randn(2, S)
    torch.testing.assert_close(est.discounted_reward_to_go(r, 0.97, block).double(), naive_rtg(r, 0.97),
                               atol=1e-5, rtol=1e-5)


def test_batch_relative_variants():
    r = torch.tensor([[1.0, 2.0], [3.0, 6.0], [5.0, 10.0]])
    m = torch.ones_like(r, dtype=torch.bool)
    A = est.batch_relative(r, m, "batch_mean")
    torch.testing.assert_close(A, r - r.mean(0, keepdim=True))
    L = est.batch_relative(r, m, "leave_one_out")
    torch.testing.assert_close(L[0], r[0] - (r[1] + r[2]) / 2)
    assert torch.equal(est.batch_relative(r, m, "none"), r)
    # groups of 1 sequence: batch_mean leaves nothing
    r4 = torch.randn(4, 3)
    G2 = est.batch_relative(r4, torch.ones_like(r4, dtype=torch.bool), "batch_mean", group=2)
    torch.testing.assert_close(G2[:2], r4[:2] - r4[:2].mean(0, keepdim=True))
    # masked positions get no advantage and do not enter the mean
    m2 = torch.tensor([[True, True], [True, False], [True, True]])
    A2 = est.batch_relative(r, m2, "batch_mean")
    assert A2[1, 1] == 0
    assert A2[0, 1].item() == pytest.approx(2.0 - (2.0 + 10.0) / 2)


def test_rate_penalty_gradient_is_proportional_controller():
    logits = torch.zeros(2, 6, requires_grad=True)
    probs = torch.sigmoid(logits)
    decided = torch.ones(2, 6, dtype=torch.bool)
    decided[:, 0] = decided[:, -1] = False
    valid = torch.ones(2, 6, dtype=torch.bool)
    loss, pbar = est.rate_penalty(probs, logits, decided, valid, target=0.2)
    loss.backward()
    # pbar = (8 * 0.5 + 4 * 1) / 12
    assert pbar.item() == pytest.approx(8 / 12)
    g = logits.grad
    assert torch.allclose(g[decided], torch.full_like(g[decided], (8 / 12 - 0.2) / 12))
    assert torch.all(g[~decided] == 0)


# -- unbiasedness against exact enumeration ------------------------------------------------------

S_ENUM = 6
MULT = 3.0  # sharpen the random policy so the gradient is informative but not heavy-tailed


def _tiny_rl(window):
    cfg = build_config("rl", "smoke", overrides={
        "model.seq_len": S_ENUM, "model.d_model": 8, "model.n_heads": 2, "model.window": 4,
        "boundary.window": window, "boundary.scale": 1.0, "boundary.softcap": 0.0,
        "boundary.gamma": 1.0, "boundary.reward": "neg_ce"})
    torch.manual_seed(0)
    model = get_method("rl").build(cfg, None)
    with torch.no_grad():  # a policy far from uniform so the gradient is informative
        model.boundary.proj.weight.mul_(MULT)
    return model


def _loss_per_position(model, ids, targets, b):
    out = model(ids, boundaries=b)
    return per_position_ce(out.logits, targets)  # (N, S)


def _mc_vs_exact(window, baseline, gamma, N=4096, n=8):
    """(Monte-Carlo mean gradient, exact gradient of the expected loss, MC standard error)."""
    model = _tiny_rl(window)
    params = list(model.boundary.proj.parameters())
    g = torch.Generator().manual_seed(5)
    seq = torch.randint(97, 123, (1, S_ENUM + 1), generator=g)
    ids, targets = seq[:, :-1], seq[:, 1:]
    h = model.encode(ids).detach()
    valid = torch.ones(1, S_ENUM, dtype=torch.bool)

    # exact: enumerate every pattern of the S-2 free positions
    free = list(itertools.product([0, 1], repeat=S_ENUM - 2))
    pats = torch.tensor([[1, *p, 1] for p in free], dtype=torch.bool)
    P = len(pats)
    with torch.no_grad():
        loss_p = _loss_per_position(model, ids.expand(P, -1), targets.expand(P, -1), pats).sum(1)
    out = model.boundary(h.expand(P, -1, -1), ids.expand(P, -1), valid=valid.expand(P, -1), fixed=pats)
    logp = out.log_prob.sum(1)  # log P(pattern) under the (autoregressive for w > 1) policy
    assert abs(logp.exp().sum().item() - 1.0) < 1e-5
    exact = torch.autograd.grad((logp.exp() * loss_p).sum(), params)
    exact = torch.cat([e.flatten() for e in exact])

    # Monte-Carlo: N sampled patterns, baselines over groups of n sequences
    torch.manual_seed(7)
    noise = torch.rand(N, S_ENUM)
    out = model.boundary(h.expand(N, -1, -1), ids.expand(N, -1), valid=valid.expand(N, -1), noise=noise)
    with torch.no_grad():
        ce = _loss_per_position(model, ids.expand(N, -1), targets.expand(N, -1), out.b)
    r = est.rewards(ce, torch.zeros_like(ce), "neg_ce")
    A = est.batch_relative(r, torch.ones_like(r, dtype=torch.bool), baseline, group=n)
    G = est.discounted_reward_to_go(A, gamma)
    per = -(G.detach() * out.log_prob).sum(1)  # gradient of the surrogate, per sequence (times S)
    chunk = 64  # whole baseline groups, so chunks are independent
    sums = []
    for i in range(0, N, chunk):
        gi = torch.autograd.grad(per[i:i + chunk].sum(), params, retain_graph=True)
        sums.append(torch.cat([x.flatten() for x in gi]))
    sums = torch.stack(sums)
    mean = sums.sum(0) / N
    se = sums.std(0) / math.sqrt(len(sums)) / chunk
    return mean, exact, se


@pytest.mark.parametrize("window", [1, 3])
@pytest.mark.parametrize("baseline", ["none", "leave_one_out", "batch_mean"])
def test_score_function_gradient_is_unbiased(window, baseline):
    """With gamma = 1, E[grad of the surrogate] equals grad E[sum_t CE_t] w.r.t. the policy
    parameters, within 5 Monte-Carlo standard errors per coordinate. With the plain batch mean
    the expectation is the exact gradient times (n-1)/n (documented in estimator.batch_relative)."""
    n = 8
    mean, exact, se = _mc_vs_exact(window, baseline, 1.0, N=8192, n=n)
    target = exact * ((n - 1) / n if baseline == "batch_mean" else 1.0)
    z = (mean - target).abs() / se.clamp(min=1e-8)
    assert z.max().item() < 5.0, (mean, target, se)


def test_enumeration_check_detects_a_biased_estimator():
    """Negative control: strong discounting (gamma = 0.2) biases the estimate, and the same
    comparison must see it, so the test above has power."""
    mean, exact, se = _mc_vs_exact(1, "leave_one_out", 0.2, N=8192)
    z = (mean - exact).abs() / se.clamp(min=1e-8)
    assert z.max().item() > 20.0
