"""The authors' policy options and the learned-rate objectives, each by hand on a tiny case:
prescribed boundaries, the off-policy warm start's importance ratios, the one-sided rate loss,
the compute-priced objective and the rate curriculum."""

import math

import pytest
import torch

from rltok import estimator as est
from rltok.config import build_config
from rltok.rates import off_policy, parse_schedule
from rltok.run import build_model


def _model(**over):
    torch.manual_seed(0)
    return build_model(build_config("rl", "smoke", overrides={f"boundary.{k}": v for k, v in over.items()}))


@pytest.mark.parametrize("window", [1, 3])
def test_prescribed_boundaries_are_given_and_not_decided(window):
    m = _model(prescribed="newline", window=window).train()
    text = b"ab\ncd ef\ngh ij kl\nmn"
    ids = torch.tensor([[256] + list(text)])  # BOS + bytes
    noise = torch.full(ids.shape, 0.999)  # the policy itself would put almost no boundary
    out = m(ids, noise=noise).boundary
    nl = ids[0] == 10
    assert out.b[0][nl].all() and not out.decided[0][nl].any()
    assert (out.log_prob[0][nl] == 0).all()
    # the estimator sees only decided positions: no policy gradient reaches a prescribed logit
    logits = out.logits.detach().requires_grad_()
    lp = torch.nn.functional.logsigmoid(torch.where(out.b.bool(), logits, -logits)) * out.decided
    est.policy_gradient_surrogate(torch.ones_like(lp), lp, torch.ones_like(nl)[None]).backward()
    assert (logits.grad[0][nl] == 0).all() and (logits.grad[0][~nl & out.decided[0]] != 0).all()
    # byte-by-byte decoding gives the same prescribed boundaries
    h = m.encode(ids)
    state = None
    for t in range(ids.shape[1] - 1):
        st = m.boundary.step(h[:, t], ids[:, t], state, pos=torch.tensor([t]), noise=noise[:, t])
        state = st.state
        assert bool(st.b[0]) == bool(out.b[0, t]), t
        if nl[t]:
            assert st.log_prob[0] == 0


def test_importance_ratio_by_hand():
    # pi(b) = 0.5 at every position; the behaviour policy is Bernoulli(0.2)
    lp = torch.full((1, 4), math.log(0.5))
    b = torch.tensor([[True, False, True, False]])
    decided = torch.tensor([[True, True, True, False]])
    rho = est.importance_ratio(lp, b, 0.2, decided, clip=5.0)
    torch.testing.assert_close(rho, torch.tensor([[2.5, 0.625, 2.5, 1.0]]))
    rho = est.importance_ratio(lp, b, 0.2, decided, clip=2.0)  # truncated at the clip
    torch.testing.assert_close(rho, torch.tensor([[2.0, 0.625, 2.0, 1.0]]))


def test_importance_weighting_is_unbiased_on_a_single_decision():
    """E_off[rho * G(b) * grad log pi(b)] = E_on[G(b) * grad log pi(b)] = d/dl E_on[G], on one
    Bernoulli decision, exactly (sums over b in {0, 1})."""
    l = torch.tensor(0.7, requires_grad=True)
    G = {True: 1.3, False: -0.4}
    p_on = torch.sigmoid(l)
    exact = torch.autograd.grad(p_on * G[True] + (1 - p_on) * G[False], l)[0]
    r = 0.2
    total = 0.0
    for bv, p_off in ((True, r), (False, 1 - r)):
        lp = torch.nn.functional.logsigmoid(l if bv else -l)
        rho = est.importance_ratio(lp[None, None], torch.tensor([[bv]]), r, torch.tensor([[True]]), clip=1e9)
        g = torch.autograd.grad(lp, l)[0]
        total += p_off * float(rho) * G[bv] * float(g)
    assert total == pytest.approx(float(exact), rel=1e-5)


def test_warm_start_draws_from_the_behaviour_policy_then_hands_over():
    m = _model(warm_start_bytes=1000).train()
    ids = torch.randint(0, 256, (4, 64))
    noise = torch.rand(4, 64)
    with off_policy(m, 999):
        assert m.boundary.behaviour
        b = m(ids, noise=noise).boundary.b.bool()
    want = noise < 0.2
    inner = slice(1, 63)  # first and last positions are forced ends
    assert torch.equal(b[:, inner], want[:, inner])
    with off_policy(m, 1000):
        assert not m.boundary.behaviour
    assert not m.boundary.behaviour


def test_one_sided_rate_loss_only_acts_above_the_ceiling():
    logits = torch.zeros(1, 10, requires_grad=True)
    valid = torch.ones(1, 10, dtype=torch.bool)
    for target, sign in ((0.3, 1.0), (0.7, 0.0)):  # pbar = 0.5: above the ceiling 0.3, below 0.7
        logits.grad = None
        loss, pbar = est.rate_penalty(torch.sigmoid(logits), logits, valid, valid, target, one_sided=True)
        loss.backward()
        assert float(pbar.detach()) == pytest.approx(0.5)
        assert torch.allclose(logits.grad, torch.full_like(logits, sign * (0.5 - target) / 10))
    logits.grad = None
    two, _ = est.rate_penalty(torch.sigmoid(logits), logits, valid, valid, 0.7)
    two.backward()
    assert (logits.grad < 0).all()  # the two-sided controller raises the rate toward 0.7


def test_flop_price_uses_the_models_flop_curve():
    from rltok.flops import unet_flops

    cfg = build_config("rl", "smoke", overrides={"boundary.flop_price": 0.1})
    m = build_model(cfg)
    pol = m.boundary
    for r in (0.05, 0.2, 0.37, 0.9):
        want = unet_flops(m, cfg, r).per_byte / unet_flops(m, cfg, 0.2).per_byte
        assert float(pol.relative_flops(torch.tensor(r, dtype=torch.float64))) == pytest.approx(want, rel=1e-9)
    rate = torch.tensor(0.25, requires_grad=True)
    pol.relative_flops(rate).backward()
    assert rate.grad > 0  # more chunks cost more: the price pushes the rate down
    # and it reaches the training loss
    from rltok.data.loader import Batch
    from rltok.objectives import training_loss

    ids = torch.randint(0, 256, (2, 64))
    batch = Batch(ids=ids, targets=torch.roll(ids, -1, 1), noise=torch.rand(2, 64), index=torch.arange(2))
    sl = training_loss(m, batch, cfg)
    assert "relative_flops" in sl.stats and sl.stats["relative_flops"] > 0


def test_rate_curriculum_by_hand():
    s = parse_schedule("linear:0.3", 0.2)
    assert not s.conditioned and s.varies
    assert s.at(0, 0, 1, total_bytes=1000) == pytest.approx(0.3)
    assert s.at(5, 500, 1, total_bytes=1000) == pytest.approx(0.25)
    assert s.at(9, 1000, 1, total_bytes=1000) == pytest.approx(0.2)
    s = parse_schedule("linear:0.1@400", 0.2)  # over the first 400 bytes, then the target
    assert s.at(0, 200, 1, total_bytes=1000) == pytest.approx(0.15)
    assert s.at(0, 800, 1, total_bytes=1000) == pytest.approx(0.2)


def test_bad_option_values_are_one_line():
    from rltok.errors import RltokError

    for key, value, msg in (("prescribed", "tabs", "newline or whitespace"), ("is_clip", 0.5, ">= 1"),
                            ("warm_start_bytes", -1, ">= 0"), ("flop_price", -1.0, ">= 0"),
                            ("rate_loss", "ceiling", "logit_shift, hinge or hnet")):
        with pytest.raises(RltokError, match=msg):
            build_config("rl", "smoke", overrides={f"boundary.{key}": value})


def test_warm_start_surrogate_is_importance_weighted():
    """Under the warm start the policy-gradient surrogate weights each return by its clipped
    importance ratio (what the hand-worked ratio above feeds into)."""
    from rltok.boundaries.base import LossContext
    from rltok.objectives import per_position_ce

    m = _model(warm_start_bytes=10**6, is_clip=3.0).train()
    ids = torch.randint(0, 256, (4, 64))
    tgt = torch.roll(ids, -1, 1)
    with off_policy(m, 0):
        out = m(ids, noise=torch.rand(4, 64))
        ce, ce_e = per_position_ce(out.logits, tgt), per_position_ce(out.early_logits, tgt)
        mask = torch.ones_like(ids, dtype=torch.bool)
        ctx = LossContext(out=out.boundary, ce=ce, ce_early=ce_e, target_mask=mask, valid=mask,
                          reduce_mean=lambda x: x, all_reduce_sum=None)
        _, stats = m.boundary.aux_loss(ctx)
    bc, bo = m.boundary.cfg, out.boundary
    adv = est.batch_relative(est.rewards(ce, ce_e, bc.reward), mask, bc.baseline, bc.baseline_group, None)
    G = est.discounted_reward_to_go(adv, bc.gamma, bc.return_block)
    rho = est.importance_ratio(bo.log_prob, bo.hard.bool(), 0.2, bo.decided, 3.0)
    assert (rho[bo.decided] != 1).all() and rho.max() <= 3.0
    want = est.policy_gradient_surrogate(G * rho, bo.log_prob, mask)
    assert float(stats["pg_loss"]) == pytest.approx(float(want.detach()), rel=1e-5)
    assert float(stats["pg_loss"]) != pytest.approx(float(est.policy_gradient_surrogate(G, bo.log_prob, mask).detach()), rel=1e-3)


def test_deviation_upsampler_hands_back_only_the_main_networks_change():
    """upsample=deviation adds zhat - z to the bytes: with an identity main network (no layers)
    the chunks add nothing, so the prediction cannot depend on the boundaries; with add it does."""
    ids = torch.randint(0, 256, (2, 40))
    b1 = torch.rand(2, 40) < 0.2
    b2 = torch.rand(2, 40) < 0.5
    for up, same in (("deviation", True), ("add", False)):
        torch.manual_seed(0)
        cfg = build_config("rl", "smoke", overrides={"dechunker.upsample": up, "model.main_layers": 0})
        m = build_model(cfg).eval()
        with torch.no_grad():
            a, b = m(ids, boundaries=b1).logits, m(ids, boundaries=b2).logits
        assert torch.allclose(a, b) == same, up


def test_shared_head_is_one_head_applied_twice():
    from rltok.flops import unet_flops

    shared = build_model(build_config("rl", "smoke", overrides={"model.shared_head": True}))
    own = build_model(build_config("rl", "smoke"))
    assert not any(k.startswith("early_head") for k in shared.state_dict())
    assert shared.exit_head is shared.head and own.exit_head is own.early_head
    ids = torch.randint(0, 256, (2, 30))
    with torch.no_grad():
        out = shared(ids)
        torch.testing.assert_close(out.early_logits, shared.head(shared.early_norm(out.hidden)))
    # the same FLOPs per byte: the head still runs twice per byte; one head's parameters fewer
    cfg = build_config("rl", "smoke")
    assert unet_flops(shared, cfg, 0.2).per_byte == unet_flops(own, cfg, 0.2).per_byte
    n_head = sum(p.numel() for p in own.early_head.parameters())
    assert sum(p.numel() for p in own.parameters()) - sum(p.numel() for p in shared.parameters()) == n_head


def test_mean_pooling_under_rl(tmp_path):
    from rltok.generate import generate
    from rltok.model.chunking import chunk_indices, mean_pool

    torch.manual_seed(0)
    m = build_model(build_config("rl", "smoke", overrides={"chunker.pool": "mean"})).eval()
    ids = torch.randint(0, 256, (2, 30))
    b = torch.rand(2, 30) < 0.3
    b[:, 0] = True
    b[:, -1] = True
    h = m.encode(ids)
    out = m.boundary(h, ids, valid=torch.ones_like(b), fixed=b)
    ch = chunk_indices(out.b, m.cfg.chunk_pad_multiple)
    torch.testing.assert_close(m.boundary.adjust_chunks(m.stage.chunker(h, out, ch)), mean_pool(h, ch))
    # the MeanPool chunker keeps the open chunk's sum, so mean pooling decodes from caches too
    # (parity: test_generate's DECODABLE), and gives what recomputing the full model gives
    assert m.boundary.decodable()
    a = generate(m, ["The"], 12, seed=1)[0]
    b2 = generate(m, ["The"], 12, seed=1, cache=False)[0]
    assert a.sampled == b2.sampled and a.boundaries.tolist() == b2.boundaries.tolist()


def test_bad_part_options_are_one_line():
    from rltok.errors import RltokError

    with pytest.raises(RltokError, match="dechunker.upsample='ema' must be add or deviation"):
        build_config("uniform", "smoke", overrides={"dechunker.upsample": "ema"})
    with pytest.raises(RltokError, match="chunker.pool='max' must be last or mean"):
        build_config("rl", "smoke", overrides={"chunker.pool": "max"})
    with pytest.raises(RltokError, match="dechunker.scan_block=0 must be >= 1"):
        build_config("hnet", "smoke", overrides={"dechunker.scan_block": 0})
    # the part options are no longer the router's
    with pytest.raises(RltokError, match="unknown config key 'boundary.pool'"):
        build_config("rl", "smoke", overrides={"boundary.pool": "mean"})
    # a pool the method's router does not combine with, named at build
    cfg = build_config("nawrot", "smoke", overrides={"chunker.pool": "last"})
    with pytest.raises(RltokError, match="chunker.pool='last': method 'nawrot' pools by mean"):
        build_model(cfg)
    with pytest.raises(RltokError, match="model.stages=2 does not support chunker.pool='mean'"):
        build_model(build_config("rl", "smoke", overrides={"model.stages": 2, "chunker.pool": "mean"}))


@pytest.mark.parametrize("method,old,parts", [
    ("rl", {"upsample": "deviation", "pool": "mean"}, {"chunker": {"pool": "mean"}, "dechunker": {"upsample": "deviation"}}),
    ("rl", {"upsample": "add", "pool": "last"}, {"chunker": {"pool": ""}, "dechunker": {"upsample": "add"}}),
    ("hnet", {"upsample": "add", "scan_block": 16}, {"dechunker": {"scan_block": 16}}),
    ("uniform", {}, {}),  # before format 3: no part option at all, the defaults are what it did
])
def test_a_format_7_run_reads_its_part_options_into_chunker_and_dechunker(method, old, parts):
    import json

    from rltok.config import run_config_from_dict

    new = build_config(method, "smoke", overrides={f"{sec}.{k}": v for sec, kv in parts.items()
                                                   for k, v in kv.items()}).to_dict()
    d = json.loads(json.dumps(new))
    del d["chunker"], d["dechunker"]
    d["boundary"].update(old)
    assert run_config_from_dict(d, strict=True, format_version=7 if old else 2).to_dict() == new
    if old:  # at format 8 the old keys are a mistake, named
        with pytest.raises(Exception, match="boundary"):
            run_config_from_dict(d, strict=True, format_version=8)


def test_each_method_gets_its_own_parts_from_the_part_options():
    from rltok.errors import RltokError
    from rltok.model.dc import AddLatest, EMASmooth, MeanPool, SelectLast

    def parts(method, **over):
        torch.manual_seed(0)
        m = build_model(build_config(method, "smoke", overrides=over))
        return m.stage.chunker, m.stage.dechunker

    c, d = parts("rl")
    assert type(c) is SelectLast and type(d) is AddLatest and not d.deviation
    c, d = parts("rl", **{"chunker.pool": "mean", "dechunker.upsample": "deviation"})
    assert type(c) is MeanPool and not c.straight_through and d.deviation
    c, d = parts("nawrot")
    assert type(c) is MeanPool and c.straight_through and type(d) is AddLatest
    c, d = parts("hnet", **{"dechunker.scan_block": 16})
    assert type(c) is SelectLast and type(d) is EMASmooth and d.block == 16
    with pytest.raises(RltokError, match="method 'uniform' pools by last"):
        parts("uniform", **{"chunker.pool": "mean"})


def test_integral_rate_controller_by_hand():
    """boundary.rate_integral_gain=g: after a training micro-batch the logit offset moves by
    -g (F - r*), F the batch's boundary fraction (forced ends included); every logit moves with it;
    nothing moves in eval mode; the offset is a buffer (saved with the weights); off by default."""
    from rltok.data.loader import Batch
    from rltok.objectives import training_loss

    cfg = build_config("rl", "smoke", overrides={"boundary.rate_integral_gain": 2.0, "boundary.target_rate": 0.1})
    torch.manual_seed(0)
    model = build_model(cfg)
    pol = model.boundary
    assert "stage.router.rate_offset" in model.state_dict()
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, 256, (4, 64), generator=g)
    batch = Batch(ids=ids, targets=torch.randint(0, 256, (4, 64), generator=g),
                  noise=torch.rand(4, 64, generator=g), index=torch.arange(4))
    sl = training_loss(model, batch, cfg)
    F = float(sl.stats["n_boundary"] / sl.stats["n_valid"])
    assert F > 0.1  # the initial policy is above the target here
    assert float(pol.rate_offset) == pytest.approx(-2.0 * (F - 0.1), rel=1e-5)
    assert float(pol.bias0) == pytest.approx(math.log(0.1 / 0.9) + float(pol.rate_offset), rel=1e-6)
    with torch.no_grad():
        lo = model(ids, noise=batch.noise).boundary.logits
        pol.rate_offset.add_(0.5)
        hi = model(ids, noise=batch.noise).boundary.logits
    assert ((hi - lo) > 0).all()  # every logit follows the offset (through the soft cap)
    model.eval()
    before = float(pol.rate_offset)
    training_loss(model, batch, cfg)
    assert float(pol.rate_offset) == before
    # without the controller the offset is a knob for calibration only: not moved in training,
    # not saved (penalty-only weights keep their tensor names), but it moves every logit
    plain = build_model(build_config("rl", "smoke"))
    assert "stage.router.rate_offset" not in plain.state_dict()
    training_loss(plain, batch, build_config("rl", "smoke"))
    assert float(plain.boundary.rate_offset) == 0.0
    with torch.no_grad():
        lo = plain(ids, noise=batch.noise).boundary.logits
        plain.boundary.rate_offset.fill_(0.5)
        hi = plain(ids, noise=batch.noise).boundary.logits
    assert ((hi - lo) > 0).all()


def test_rate_penalty_sees_the_networks_own_rate_under_antiwindup():
    """A wound-up controller: the network's own logits sit at logit(r*) while the offset (-4)
    holds the policy far below r*. Without anti-windup the penalty sees the held rate and pushes
    the network's logits up (it winds further: the v2 study's windup); with it the penalty sees
    the network's own rate, r*, and leaves the network alone, so the integral term alone must
    bring the offset back."""
    from rltok.data.loader import Batch
    from rltok.objectives import training_loss

    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, 256, (4, 64), generator=g)
    batch = Batch(ids=ids, targets=torch.randint(0, 256, (4, 64), generator=g),
                  noise=torch.rand(4, 64, generator=g), index=torch.arange(4))
    seen, grads = {}, {}
    for antiwindup in (False, True):
        cfg = build_config("rl", "smoke", overrides={
            "boundary.rate_integral_gain": 1e-9, "boundary.rate_antiwindup": antiwindup,
            "boundary.pg_weight": 0.0, "boundary.target_rate": 0.2})
        torch.manual_seed(0)
        model = build_model(cfg)
        pol = model.boundary
        with torch.no_grad():
            for p in pol.parameters():
                p.zero_()  # the network's own logit is logit(r*) at every byte
            pol.rate_offset.fill_(-4.0)
        model.zero_grad()
        sl = training_loss(model, batch, cfg)
        sl.loss.backward()
        seen[antiwindup] = float(sl.stats["policy_rate"])
        grads[antiwindup] = sum(float(p.grad.abs().sum()) for p in pol.parameters() if p.grad is not None)
    # forced positions count as probability 1 in the penalty's rate: a few per row
    assert seen[False] < 0.08  # the held rate, sigmoid(logit(0.2) - 4) ~ 0.005 on decided bytes
    assert seen[True] == pytest.approx(0.2, abs=0.06)  # the network's own
    assert grads[False] > 3 * grads[True]  # what is left: the forced ends count as probability 1


def test_offset_as_a_function_of_the_requested_rate_by_hand():
    """boundary.rate_offset_knots=K (issue 38): the controller's offset is piecewise linear in
    the requested rate through K knots over the schedule's range; a training micro-batch at rate r
    moves only the two knots around r, each by its interpolation weight times -g (F - r); the
    logit every byte starts from is logit(r) + the trim + the curve at r."""
    from rltok.data.loader import Batch
    from rltok.objectives import training_loss
    from rltok.rates import requested_rate

    over = {"boundary.rate_schedule": "uniform:0.1:0.3", "boundary.rate_integral_gain": 2.0,
            "boundary.rate_offset_knots": 5}
    cfg = build_config("rl", "smoke", overrides=over)
    torch.manual_seed(0)
    model = build_model(cfg)
    pol = model.boundary
    assert "stage.router.rate_offset_curve" in model.state_dict()
    with torch.no_grad():
        pol.rate_offset_curve.copy_(torch.tensor([0.0, 1.0, 2.0, 3.0, 4.0]))  # knots 0.1, 0.15, ..., 0.3
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, 256, (4, 64), generator=g)
    batch = Batch(ids=ids, targets=torch.randint(0, 256, (4, 64), generator=g),
                  noise=torch.rand(4, 64, generator=g), index=torch.arange(4))
    with requested_rate(model, 0.1375):  # 3/4 of the way from knot 0 (0.1) to knot 1 (0.15)
        assert float(pol.controller_offset()) == pytest.approx(0.75)
        assert float(pol.bias0) == pytest.approx(math.log(0.1375 / 0.8625) + 0.75, rel=1e-6)
        sl = training_loss(model, batch, cfg)
    F = float(sl.stats["n_boundary"] / sl.stats["n_valid"])
    step = 2.0 * (F - 0.1375)
    assert abs(step) > 1e-3
    got = pol.rate_offset_curve.tolist()
    assert got[0] == pytest.approx(0.0 - 0.25 * step, rel=1e-5)
    assert got[1] == pytest.approx(1.0 - 0.75 * step, rel=1e-5)
    assert got[2:] == [2.0, 3.0, 4.0]  # knots away from the drawn rate do not move
    assert float(pol.rate_offset) == 0.0  # the trim is calibration's
    from rltok.errors import RltokError
    with pytest.raises(RltokError, match="rate_offset_knots"):
        build_config("rl", "smoke", overrides={"boundary.rate_offset_knots": 5})  # no conditioning
