"""The estimator as training runs it: through ``objectives.training_loss`` (what ``TrainStep``
calls), not through the pure functions of ``estimator.py``.

1. Unbiasedness against exact enumeration. On a sequence of 6 bytes (4 decided positions, 16
   boundary patterns) the Monte-Carlo mean of the gradient that ``training_loss`` puts on the
   policy's parameters equals the exact gradient of the expected objective

       J(theta) = pg_weight * E_b[(1/T) sum_t CE_t(b)] + rate_weight * R(theta)

   (R: the rate penalty, deterministic for w = 1), computed by enumerating every pattern, within
   a tolerance from the sample variance (|z| < 5 per coordinate). Negative controls run the same
   comparison and must fail it: the exact target with its sign flipped, and gamma = 0.2 (a
   discounted return is a biased estimate of the undiscounted gradient).
2. The return the training path uses, read off the gradient it puts on log pi(b_t), equals a
   naive reference sum over k >= t of gamma^(k-t) A_k, where A is computed from the model's own
   per-position losses: the reward's sign, the baseline, the direction of discounting and the
   reward-to-go itself are all checked exactly.
3. The rate penalty's gradient, the log-probability of the action taken, and the early-exit
   head's loss, each exactly.
"""

import itertools
import math

import pytest
import torch

from rltok.methods import get_method
from rltok.boundaries.base import bernoulli_log_prob
from rltok.config import build_config
from rltok.data.loader import Batch
from rltok.objectives import per_position_ce, training_loss
from test_estimator import naive_rtg

S = 6  # positions: BOS + 5 bytes; 4 decided (first and last forced)


def _model(window=1, **over):
    cfg = build_config("rl", "smoke", overrides={
        "model.seq_len": S, "model.d_model": 8, "model.n_heads": 2, "model.window": 4,
        "boundary.window": window, "boundary.scale": 1.0, "boundary.softcap": 0.0,
        "boundary.gamma": 1.0, **over})
    torch.manual_seed(0)
    model = get_method("rl").build(cfg, None)
    with torch.no_grad():  # a policy far from p = r*, so the gradient is informative
        model.boundary.proj.weight.mul_(3.0)
    return model, cfg


def _sequence():
    g = torch.Generator().manual_seed(5)
    seq = torch.randint(97, 123, (1, S + 1), generator=g)
    return seq[:, :-1], seq[:, 1:]


def _batch(ids, targets, noise):
    n = noise.shape[0]
    return Batch(ids=ids.expand(n, -1).clone(), targets=targets.expand(n, -1).clone(), noise=noise,
                 index=torch.arange(n))


def _policy_params(model):
    return list(model.boundary.proj.parameters())


def _flat(grads):
    return torch.cat([g.flatten() for g in grads])


def _exact_gradient(model, cfg, ids, targets):
    """grad of pg_weight * E_b[mean_t CE_t] + rate_weight * R by enumerating the 2^(S-2)
    patterns, R = (pbar - r*)_sg * mean logit (forced positions count as probability 1)."""
    bc = cfg.boundary
    params = _policy_params(model)
    pats = torch.tensor([[1, *p, 1] for p in itertools.product([0, 1], repeat=S - 2)], dtype=torch.bool)
    P = len(pats)
    with torch.no_grad():
        out = model(ids.expand(P, -1), boundaries=pats)
        loss_p = per_position_ce(out.logits, targets.expand(P, -1)).mean(1)  # (1/T) sum_t CE_t
    h = model.encode(ids)
    valid = torch.ones(P, S, dtype=torch.bool)
    bo = model.boundary(h.expand(P, -1, -1), ids.expand(P, -1), valid=valid, fixed=pats)
    logp = bo.log_prob.sum(1)
    assert abs(logp.exp().sum().item() - 1.0) < 1e-5  # the patterns are all of them
    objective = bc.pg_weight * (logp.exp() * loss_p).sum()
    if bc.rate_weight and bc.window == 1:
        one = model.boundary(h, ids, valid=valid[:1], fixed=pats[:1])  # w = 1: logits do not depend on b
        d = one.decided.float()
        pbar = ((one.probs * d).sum() + (1 - d).sum()) / S
        objective = objective + bc.rate_weight * (pbar.detach() - bc.target_rate) * (one.logits * d).sum() / S
    return _flat(torch.autograd.grad(objective, params))


def _mc_gradient(model, cfg, ids, targets, n_seq=8192, chunk=64, seed=7, params=None):
    """Mean and standard error of the gradient training_loss puts on the policy's parameters,
    over independent micro-batches of ``chunk`` sequences (whole baseline groups)."""
    params = _policy_params(model) if params is None else params
    torch.manual_seed(seed)
    noise = torch.rand(n_seq, S)
    grads = []
    for i in range(0, n_seq, chunk):
        sl = training_loss(model, _batch(ids, targets, noise[i:i + chunk]), cfg)
        grads.append(_flat(torch.autograd.grad(sl.loss, params)))
    grads = torch.stack(grads)
    return grads.mean(0), grads.std(0) / math.sqrt(len(grads))


def _z(mean, target, se):
    return ((mean - target).abs() / se.clamp(min=1e-9)).max().item()


CASES = [  # (window, reward, baseline, rate_weight, sequences)
    (1, "early_exit", "none", 0.01, 8192),
    (1, "early_exit", "leave_one_out", 0.01, 8192),
    (1, "early_exit", "batch_mean", 0.01, 8192),
    (1, "neg_ce", "none", 0.01, 65536),  # no baseline on -CE: high variance, more samples
    (1, "neg_ce", "leave_one_out", 0.0, 8192),
    (3, "early_exit", "leave_one_out", 0.0, 8192),
    (3, "neg_ce", "none", 0.0, 65536),
]


@pytest.mark.parametrize("window,reward,baseline,rate_weight,n_seq", CASES)
def test_training_path_gradient_is_unbiased(window, reward, baseline, rate_weight, n_seq):
    """gamma = 1: E[grad of training_loss on the policy] = grad J (exact), within 5 MC standard
    errors per coordinate; the plain batch mean scales the score-function part by (n-1)/n.
    Negative control: the same comparison against J with its score-function part's sign flipped
    must fail (|z| > 5), so the test can see a sign error."""
    model, cfg = _model(window, **{"boundary.reward": reward, "boundary.baseline": baseline,
                                   "boundary.rate_weight": rate_weight})
    ids, targets = _sequence()
    n = 64
    mean, se = _mc_gradient(model, cfg, ids, targets, n_seq=n_seq, chunk=n)
    pg = _exact_gradient(model, *_with(cfg, rate_weight=0.0), ids, targets)  # score-function part
    rate = _exact_gradient(model, cfg, ids, targets) - pg
    if baseline == "batch_mean":
        pg = pg * (n - 1) / n
    assert _z(mean, rate + pg, se) < 5.0, (mean, rate + pg, se)
    assert _z(mean, rate - pg, se) > 5.0


def _with(cfg, **boundary):
    import dataclasses

    return (dataclasses.replace(cfg, boundary=dataclasses.replace(cfg.boundary, **boundary)),)


def test_discounted_return_is_biased_and_the_comparison_sees_it():
    """Negative control: gamma = 0.2 in the training path is not an unbiased estimate of the
    undiscounted gradient, and the comparison above must fail on it."""
    model, cfg = _model(1, **{"boundary.gamma": 0.2, "boundary.baseline": "leave_one_out",
                              "boundary.rate_weight": 0.0})
    ids, targets = _sequence()
    mean, se = _mc_gradient(model, cfg, ids, targets)
    exact = _exact_gradient(model, cfg, ids, targets)
    assert _z(mean, exact, se) > 8.0


# -- two stages: both routers' gradients against exact enumeration ------------------------------

def _two_stage_model(**over):
    cfg = build_config("rl", "smoke", overrides={
        "model.stages": 2, "model.seq_len": S, "model.d_model": 8, "model.n_heads": 2, "model.window": 4,
        "model.chunk_pad_multiple": 1, "boundary.scale": 1.0, "boundary.softcap": 0.0,
        "boundary.gamma": 1.0, "boundary.rate_weight": 0.0, **over})
    torch.manual_seed(0)
    model = get_method("rl").build(cfg, None)
    with torch.no_grad():  # routers far from p = r*, so that both gradients are informative
        model.boundary.proj.weight.mul_(3.0)
        model.routers[1].proj.weight.mul_(3.0)
    return model, cfg


def _two_stage_params(model):
    return [*model.boundary.proj.parameters(), *model.routers[1].proj.parameters()]


def _exact_two_stage_gradient(model, cfg, ids, targets):
    """grad of pg_weight * E[(1/T) sum_t CE_t] over the outer router's 2^4 patterns and, for each,
    the inner router's 2^(M-2) patterns over its M outer chunks (81 joint patterns in all)."""
    from rltok.model.chunking import chunk_indices

    params = _two_stage_params(model)
    h = model.encode(ids)
    objective, total = 0.0, 0.0
    for p in itertools.product([0, 1], repeat=S - 2):
        pat = torch.tensor([[1, *p, 1]], dtype=torch.bool)
        M = int(pat.sum())
        qs = torch.tensor([[1, *q, 1] for q in itertools.product([0, 1], repeat=M - 2)], dtype=torch.bool)
        n = len(qs)
        with torch.no_grad():
            out = model(ids.expand(n, -1), boundaries=pat.expand(n, -1), inner_boundaries=qs)
            loss = per_position_ce(out.logits, targets.expand(n, -1)).mean(1)
        bo = model.boundary(h, ids, valid=torch.ones(1, S, dtype=torch.bool), fixed=pat)
        ch = chunk_indices(pat)
        z = model.boundary.adjust_chunks(model.stage.chunker(h, bo, ch))
        y = model.stage.inner(z, ch.positions, ch.valid, fixed=[qs[:1]]).h  # level 1's encoder output
        bo2 = model.routers[1](y.expand(n, -1, -1), torch.zeros(n, M, dtype=torch.long),
                                   valid=torch.ones(n, M, dtype=torch.bool), fixed=qs)
        prob = (bo.log_prob.sum() + bo2.log_prob.sum(1)).exp()
        objective = objective + (prob * loss).sum()
        total = total + prob.sum()
    assert abs(float(total.detach()) - 1.0) < 1e-5  # every joint pattern once
    return _flat(torch.autograd.grad(cfg.boundary.pg_weight * objective, params))


TWO_STAGE_CASES = [  # (router window, reward, baseline, inner baseline, sequences)
    (1, "early_exit", "leave_one_out", "skip", 8192),
    (1, "early_exit", "none", "skip", 8192),
    (2, "early_exit", "leave_one_out", "skip", 8192),
    (1, "early_exit", "leave_one_out", "early", 8192),
]


@pytest.mark.parametrize("window,reward,baseline,inner_baseline,n_seq", TWO_STAGE_CASES)
def test_two_stage_gradients_are_unbiased_at_both_levels(window, reward, baseline, inner_baseline, n_seq):
    """gamma = 1, two stages: the Monte-Carlo mean of the gradient training_loss puts on the
    outer and the inner router equals the exact gradient of the expected per-byte loss, within
    5 standard errors per coordinate; the inner router's rewards are the skip exit's losses minus
    the final ones, summed over the bytes each outer chunk reaches, and its uniforms are the outer
    router's rescaled (model/stage.py). Negative controls: the sign of either router's part
    flipped must fail the comparison."""
    model, cfg = _two_stage_model(**{"boundary.window": window, "boundary.reward": reward,
                                     "boundary.baseline": baseline, "boundary.inner_baseline": inner_baseline})
    model.train()
    ids, targets = _sequence()
    exact = _exact_two_stage_gradient(model, cfg, ids, targets)
    mean, se = _mc_gradient(model, cfg, ids, targets, n_seq=n_seq, params=_two_stage_params(model))
    n_outer = sum(p.numel() for p in model.boundary.proj.parameters())
    assert exact[:n_outer].abs().max() > 0 and exact[n_outer:].abs().max() > 0
    assert _z(mean, exact, se) < 5.0, (mean, exact, se)
    for part in (slice(0, n_outer), slice(n_outer, None)):
        flipped = exact.clone()
        flipped[part] = -flipped[part]
        assert _z(mean, flipped, se) > 5.0


# -- the return, exactly ---------------------------------------------------------------------------

def _capture(model):
    """Run training_loss while keeping the policy's output (log_prob with its gradient) and the
    model's output (for the reference rewards)."""
    store = {}
    boundary_forward = model.boundary.forward

    def spy(*a, **k):
        out = boundary_forward(*a, **k)
        out.log_prob.retain_grad()
        store["bo"] = out
        return out

    model.boundary.forward = spy
    handle = model.register_forward_hook(lambda m, i, o: store.__setitem__("out", o))
    return store, lambda: (setattr(model.boundary, "forward", boundary_forward), handle.remove())


@pytest.mark.parametrize("reward", ["early_exit", "neg_ce"])
@pytest.mark.parametrize("baseline", ["batch_mean", "leave_one_out", "none"])
@pytest.mark.parametrize("gamma", [0.5, 1.0])
def test_training_path_return_sums_later_rewards(reward, baseline, gamma):
    """d loss / d log pi(b_t) = -pg_weight * G_t / N with G_t = sum_{k >= t} gamma^(k-t) A_k,
    A = r - baseline, r = CE_early - CE (or -CE): the return at t uses the rewards at k >= t and
    never those before t."""
    L = 24
    cfg = build_config("rl", "smoke", overrides={
        "model.seq_len": L, "model.d_model": 16, "model.n_heads": 2, "model.window": 4,
        "boundary.gamma": gamma, "boundary.reward": reward, "boundary.baseline": baseline})
    torch.manual_seed(0)
    model = get_method("rl").build(cfg, None)
    g = torch.Generator().manual_seed(1)
    seq = torch.randint(0, 256, (4, L + 1), generator=g)
    batch = Batch(ids=seq[:, :-1], targets=seq[:, 1:], noise=torch.rand(4, L, generator=g),
                  index=torch.arange(4))
    store, restore = _capture(model)
    try:
        sl = training_loss(model, batch, cfg)
        sl.loss.backward()
    finally:
        restore()
    out, bo = store["out"], store["bo"]
    with torch.no_grad():
        ce = per_position_ce(out.logits.float(), batch.targets)
        ce_e = per_position_ce(out.early_logits.float(), batch.targets)
    r = (ce_e - ce) if reward == "early_exit" else -ce
    B = r.shape[0]
    if baseline == "batch_mean":
        A = r - r.mean(0, keepdim=True)
    elif baseline == "leave_one_out":
        A = r - (r.sum(0, keepdim=True) - r) / (B - 1)
    else:
        A = r
    G = naive_rtg(A, gamma)
    N = batch.targets.numel()
    want = -cfg.boundary.pg_weight * G / N
    got = bo.log_prob.grad.double()
    dec = bo.decided
    assert dec.sum() > 0
    torch.testing.assert_close(got[dec], want[dec], atol=1e-9, rtol=1e-4)
    # a return that summed earlier rewards would differ: the check can tell the two apart
    wrong = -cfg.boundary.pg_weight * naive_rtg(A.flip(1), gamma).flip(1) / N
    assert not torch.allclose(got[dec], wrong[dec], atol=1e-9, rtol=1e-2)


# -- the other pieces the policy's loss is made of, exactly -----------------------------------------

def test_log_prob_is_of_the_action_taken():
    model, cfg = _model(1)
    ids, targets = _sequence()
    noise = torch.rand(16, S, generator=torch.Generator().manual_seed(2))
    store, restore = _capture(model)
    try:
        training_loss(model, _batch(ids, targets, noise), cfg)
    finally:
        restore()
    bo = store["bo"]
    want = bernoulli_log_prob(bo.b, bo.logits) * bo.decided
    torch.testing.assert_close(bo.log_prob, want)
    p = torch.sigmoid(bo.logits)
    manual = torch.where(bo.b, p.log(), (1 - p).log()) * bo.decided
    torch.testing.assert_close(bo.log_prob, manual, atol=1e-5, rtol=1e-5)
    # the decisions themselves follow the noise: b_t = 1 iff u_t < pi_t (decided positions)
    assert torch.equal(bo.b[bo.decided], (noise < p)[bo.decided])


def test_rate_penalty_gradient_through_the_training_path():
    """With pg_weight = 0 the policy's bias gets only the rate penalty's gradient:
    rate_weight * (pbar - r*) * s * (decided / valid), positive (lower the logits) when the rate
    is above target, negative below."""
    for target, sign in ((0.05, 1.0), (0.95, -1.0)):
        model, cfg = _model(1, **{"boundary.pg_weight": 0.0, "boundary.rate_weight": 0.5,
                                  "boundary.target_rate": 0.2})
        cfg.boundary.target_rate = target  # the penalty's target; the policy's prior stays at 0.2
        ids, targets = _sequence()
        noise = torch.rand(8, S, generator=torch.Generator().manual_seed(3))
        sl = training_loss(model, _batch(ids, targets, noise), cfg)
        gb = torch.autograd.grad(sl.loss, [model.boundary.proj.bias])[0]
        pbar = sl.stats["policy_rate"].item()
        want = 0.5 * (pbar - target) * cfg.boundary.scale * (S - 2) / S
        assert gb.item() == pytest.approx(want, rel=1e-4)
        assert math.copysign(1.0, gb.item()) == sign


def test_early_exit_head_is_trained_by_its_own_loss():
    """The early-exit head's gradient is early_weight * grad of the mean early-exit CE, exactly
    (it is the reward's baseline: a detached head would never learn one)."""
    model, cfg = _model(1)
    ids, targets = _sequence()
    noise = torch.rand(8, S, generator=torch.Generator().manual_seed(4))
    batch = _batch(ids, targets, noise)
    head = list(model.early_head.parameters())
    sl = training_loss(model, batch, cfg)
    got = _flat(torch.autograd.grad(sl.loss, head))
    h = model.encode(batch.ids)
    ce_e = per_position_ce(model.early_head(model.early_norm(h)), batch.targets)
    want = _flat(torch.autograd.grad(cfg.boundary.early_weight * ce_e.mean(), head))
    assert got.abs().max() > 0
    torch.testing.assert_close(got, want, atol=1e-7, rtol=1e-4)


def test_compute_price_in_the_reward_is_unbiased():
    """boundary.flop_price_in=reward: every decided boundary costs price = flop_price x its marginal
    relative FLOPs in its REINFORCE return. E[grad of training_loss on the policy] must be the
    exact grad of pg_weight * E_b[mean_t CE_t + price * (decided boundaries) / T] (w = 1, gamma = 1,
    leave-one-out); the same J without the price must be rejected (the price is seen)."""
    over = {"boundary.reward": "early_exit", "boundary.baseline": "leave_one_out", "boundary.rate_weight": 0.0,
            "boundary.flop_price": 0.5, "boundary.flop_price_in": "reward"}
    model, cfg = _model(1, **over)
    ids, targets = _sequence()
    mean, se = _mc_gradient(model, cfg, ids, targets, n_seq=8192, chunk=64)
    bc, params = cfg.boundary, _policy_params(model)
    pats = torch.tensor([[1, *p, 1] for p in itertools.product([0, 1], repeat=S - 2)], dtype=torch.bool)
    P = len(pats)
    with torch.no_grad():
        loss_p = per_position_ce(model(ids.expand(P, -1), boundaries=pats).logits, targets.expand(P, -1)).mean(1)
    h = model.encode(ids)
    bo = model.boundary(h.expand(P, -1, -1), ids.expand(P, -1), valid=torch.ones(P, S, dtype=torch.bool), fixed=pats)
    price = bc.flop_price * model.boundary.marginal_relative_flops(bo.probs.detach()[0].mean())
    assert 0 < price < 10
    n_decided = (pats & bo.decided).sum(1).float()
    p = bo.log_prob.sum(1).exp()
    with_price = _flat(torch.autograd.grad(bc.pg_weight * (p * (loss_p + price * n_decided / S)).sum(), params,
                                           retain_graph=True))
    without = _flat(torch.autograd.grad(bc.pg_weight * (p * loss_p).sum(), params))
    assert _z(mean, with_price, se) < 5.0, (mean, with_price, se)
    assert _z(mean, without, se) > 5.0
