"""The two-stage U-Net (model.stages=2): index arithmetic on hand-worked examples, causality of
imposed decisions at both levels, cached decoding against the full forward pass, the inner
router's uniforms, FLOPs per stage, evaluation's rates, and the configuration's errors.
Elsewhere: the estimator at two levels against exact enumeration (test_estimator_training_path.py),
causality of both routers' own draws (test_causality.py), cached = recomputed generation
(test_generate.py), batch invariance, resume, two ranks = one process."""

import numpy as np
import pytest
import torch

from rltok.methods import get_method
from rltok.schema import BOS, PAD
from rltok.config import build_config
from rltok.errors import RltokError
from rltok.generate import prefill, step
from rltok.model.chunking import chunk_indices
from rltok.model.stage import chunk_sums, inner_boundary_bytes, inner_noise

S = 48
ATOL = 2e-5


def _cfg(**over):
    return build_config("rl", "smoke", overrides={"model.stages": 2, "model.seq_len": S, "model.window": 8,
                                                   "model.chunk_pad_multiple": 1, "model.inner_enc_layers": 1,
                                                   "model.inner_dec_layers": 1, **over})


def _model(**over):
    cfg = _cfg(**over)
    torch.manual_seed(0)
    m = get_method("rl").build(cfg, None)
    with torch.no_grad():  # sharper than the init, so that outputs and decisions depend on inputs
        for p in m.parameters():
            if p.dim() >= 2:
                p.mul_(3.0)
    return m.eval()


# -- index arithmetic, by hand ----------------------------------------------------------------------

def test_chunk_sums_credit_each_chunk_with_the_bytes_that_read_it():
    """b = [1,0,0,1,0,0,0,1,0,1] (model/chunking.py's example): up = [0,0,0,1,1,1,1,2,2,3], so chunk
    0's output reaches bytes 0-2, chunk 1's bytes 3-6, chunk 2's bytes 7-8, chunk 3's byte 9."""
    b = torch.tensor([[1, 0, 0, 1, 0, 0, 0, 1, 0, 1]], dtype=torch.bool)
    ch = chunk_indices(b)
    x = torch.arange(1.0, 11.0)[None]  # byte t carries t + 1
    assert chunk_sums(x, ch).tolist() == [[1 + 2 + 3, 4 + 5 + 6 + 7, 8 + 9, 10]]


def test_inner_boundaries_land_on_the_last_byte_of_their_last_outer_chunk():
    """Outer chunks end at bytes (0, 3, 7, 9); inner decisions (1, 0, 1, 1) over them: inner chunks
    {0}, {1, 2}, {3}, ending at bytes 0, 7 and 9. A padded chunk column lands nowhere."""
    from types import SimpleNamespace

    b = torch.tensor([[1, 0, 0, 1, 0, 0, 0, 1, 0, 1]], dtype=torch.bool)
    ch = chunk_indices(b, pad_multiple=8)  # 4 chunks padded to 8
    b2 = torch.zeros(1, 8, dtype=torch.bool)
    b2[0, :4] = torch.tensor([True, False, True, True])
    b2[0, 6] = True  # on a padding chunk (position S - 1): must not mark byte 9 twice or count
    stage = SimpleNamespace(boundary=SimpleNamespace(b=b2))
    got = inner_boundary_bytes(stage, ch, 10)
    assert got[0].nonzero().squeeze(1).tolist() == [0, 7, 9]
    b2[0, 3] = False
    assert inner_boundary_bytes(stage, ch, 10)[0].nonzero().squeeze(1).tolist() == [0, 7]


def test_inner_uniforms_are_rescaled_only_where_the_outer_boundary_was_sampled():
    """u / pi at sampled outer boundaries, u at forced ones and when boundaries are imposed."""
    from types import SimpleNamespace

    noise = torch.tensor([[0.9, 0.5, 0.1, 0.2, 0.7]])
    b = torch.tensor([[1, 0, 1, 1, 1]], dtype=torch.bool)  # chunks end at 0 (forced), 2, 3, 4 (forced)
    ch = chunk_indices(b)
    probs = torch.tensor([[1.0, 0.3, 0.4, 0.8, 1.0]])
    decided = torch.tensor([[False, True, True, True, False]])
    bo = SimpleNamespace(probs=probs, decided=decided)
    u = inner_noise(noise, bo, ch, "sample", fixed=False)
    torch.testing.assert_close(u, torch.tensor([[0.9, 0.1 / 0.4, 0.2 / 0.8, 0.7]]))
    assert inner_noise(noise, bo, ch, "sample", fixed=True).tolist() == noise[:, [0, 2, 3, 4]].tolist()
    assert inner_noise(noise, bo, ch, "greedy", fixed=False) is None


def test_inner_draws_are_bernoulli_at_the_inner_probability():
    """Through the model: across many sequences sharing a prefix, the inner router's decision at a
    fixed outer chunk is drawn with its own probability (the rescaled uniform is uniform)."""
    model = _model()
    with torch.no_grad():  # both routers at p = r* (0.2, 0.5), so that byte 1 often ends a chunk
        for router in model.routers:
            router.proj.weight.zero_()
            router.proj.bias.zero_()
    g = torch.Generator().manual_seed(3)
    ids = torch.randint(97, 123, (1, 12), generator=g).expand(20000, -1).clone()
    ids[:, 0] = BOS
    noise = torch.rand(20000, 12, generator=g)
    with torch.no_grad():
        out = model(ids, noise=noise)
    # the rows where byte 1 ended an outer chunk (sampled): there outer chunk 1 is byte 1, the
    # same in every such row, and so is the inner router's probability at it
    keep = out.boundary.b[:, 1]
    assert 300 < keep.sum() < 19700
    p_inner = out.levels[1].boundary.probs[keep][:, 1:2]
    d_inner = out.levels[1].boundary.b[keep][:, 1:2].float()
    # same prefix, same decisions before: the probability is the same in every kept row
    torch.testing.assert_close(p_inner[:, 0], p_inner[:1, 0].expand(len(p_inner)), atol=1e-5, rtol=0)
    n = keep.sum().item()
    mean, p = d_inner[:, 0].mean().item(), p_inner[0, 0].item()
    assert p == pytest.approx(0.5)
    assert abs(mean - p) < 4 * np.sqrt(p * (1 - p) / n), (mean, p, n)


# -- causality at both levels (the routers' own draws: test_causality.py) ------------------------------

def test_fixed_boundaries_at_both_levels_are_causal():
    model = _model()
    g = torch.Generator().manual_seed(4)
    ids = torch.randint(0, 256, (2, S), generator=g)
    b = torch.rand(2, S, generator=g) < 0.4
    b[:, 0] = b[:, -1] = True
    M = chunk_indices(b).max_chunks
    b2 = torch.rand(2, M, generator=g) < 0.5
    base = model(ids, boundaries=b, inner_boundaries=b2).logits
    for t in (5, 30):
        ids2 = ids.clone()
        ids2[:, t + 1:] = torch.randint(0, 256, (2, S - t - 1), generator=g)
        out = model(ids2, boundaries=b, inner_boundaries=b2).logits
        torch.testing.assert_close(out[:, : t + 1], base[:, : t + 1], atol=1e-5, rtol=1e-5)


# -- cached decoding -----------------------------------------------------------------------------------

@pytest.mark.parametrize("over", [{}, {"boundary.window": 4}, {"dechunker.upsample": "deviation"},
                                  {"model.inner_enc_layers": 0, "model.inner_dec_layers": 0, "model.main_layers": 2}],
                         ids=["w1", "w4", "deviation", "no-inner-layers"])
@pytest.mark.parametrize("mode", ["sample", "greedy"])
def test_cached_decoding_matches_the_full_forward_pass_at_both_levels(over, mode):
    """Prompts of different lengths (some past the byte window), then one step per byte: the
    cached decoder gives the full forward pass's log-probabilities at every position, with the
    decisions of both levels drawn from the same noise; a row dropped midway changes nothing."""
    model = _model(**{"model.seq_len": 96, **over})
    g = torch.Generator().manual_seed(1)
    N = 30
    prompt_lens = [1, 11, 3, 20]
    seqs = [[BOS] + torch.randint(0, 256, (L + N - 1,), generator=g).tolist() for L in prompt_lens]
    width = max(map(len, seqs)) + 1
    noise = torch.rand(4, width, generator=g)
    pre = prefill(model, [s[:L] for s, L in zip(seqs, prompt_lens)], noise=noise, mode=mode)
    state = pre.state
    rows = list(range(4))
    got = {r: [torch.log_softmax(pre.logits[r].float(), -1)] for r in rows}
    decided = {r: [] for r in rows}
    for k in range(N):
        if k == N // 2:
            rows = rows[1:]
            state = state.select(torch.arange(1, 4))
        pos = state.pos
        ids = torch.tensor([seqs[r][p] for r, p in zip(rows, pos.tolist())])
        out = step(model, state, ids, noise=noise[rows, pos], mode=mode)
        for j, r in enumerate(rows):
            got[r].append(torch.log_softmax(out.logits[j].float(), -1))
            decided[r].append(bool(out.boundary.b[j]))
    inner_any = False
    for r, L in enumerate(prompt_lens):
        n = len(got[r])
        ids = torch.tensor([seqs[r][: L - 1 + n] + [PAD]])
        with torch.no_grad():
            full = model(ids, noise=noise[r: r + 1, : ids.shape[1]], mode=mode,
                         valid=torch.ones_like(ids, dtype=torch.bool))
        ref = torch.log_softmax(full.logits[0].float(), -1)[L - 1: L - 1 + n]
        torch.testing.assert_close(torch.stack(got[r]), ref, atol=ATOL, rtol=0)
        assert full.boundary.b[0, L: L - 1 + n].tolist() == decided[r][: n - 1]
        inner_any |= bool(inner_boundary_bytes(full.levels[1], full.chunks, ids.shape[1])[0, 1:-1].any())
    assert inner_any


# -- FLOPs, evaluation, configuration -----------------------------------------------------------------

def test_flops_count_each_stage_at_its_rate():
    """By hand from the parts: 6 x matmul parameters at each level's positions, attention per
    layer over that level's keys, and the skip exit's byte decoder and head forward only (2 x)."""
    from rltok.flops import ATTN_FLOPS_PER_KEY_DIM as A, _matmul_params, mean_causal_keys, unet_flops

    model, cfg = _model(), _cfg()
    d, r1, r2 = cfg.model.d_model, 0.25, 0.4
    outer, inner = model.stage.stages
    byte = _matmul_params([*outer.encoder, *outer.decoder, model.head, model.early_head, outer.router])
    skip = _matmul_params([*outer.decoder, model.head])
    mid = _matmul_params([*inner.encoder, *inner.decoder, inner.router])
    top = _matmul_params(list(inner.main.layers))
    assert mid > 0 and top > 0
    want = 6 * (byte + r1 * mid + r1 * r2 * top) + 2 * skip + A * d * (
        (2 + 1 / 3) * mean_causal_keys(S, 8) + r1 * 2 * mean_causal_keys(r1 * S)
        + r1 * r2 * 1 * mean_causal_keys(r1 * r2 * S))
    got = unet_flops(model, cfg, r1, r2)
    assert got.per_byte == pytest.approx(want, rel=1e-12)
    # boundary.inner_baseline=early: no skip pass, and training runs none
    early = _cfg(**{"boundary.inner_baseline": "early"})
    no_skip = want - 2 * skip - A * d * (1 / 3) * mean_causal_keys(S, 8)
    assert unet_flops(model, early, r1, r2).per_byte == pytest.approx(no_skip, rel=1e-12)
    assert unet_flops(model, cfg, r1, 0.8).per_byte > got.per_byte  # more inner chunks cost more


def test_other_methods_and_unsupported_options_are_refused_in_one_line():
    with pytest.raises(RltokError, match="one stage only"):
        build_config("uniform", "smoke", overrides={"model.stages": 2})
    with pytest.raises(RltokError, match="model.stages=0"):
        build_config("rl", "smoke", overrides={"model.stages": 0})
    cfg = build_config("rl", "smoke", overrides={"model.stages": 2, "boundary.rate_scope": "document"})
    with pytest.raises(RltokError, match="rate_scope"):
        get_method("rl").build(cfg, None)


def test_training_loss_reports_both_stages_and_every_parameter_learns():
    from rltok.data.loader import Batch
    from rltok.objectives import ratios, training_loss

    cfg = build_config("rl", "smoke", overrides={"model.stages": 2})
    torch.manual_seed(0)
    model = get_method("rl").build(cfg, None)
    g = torch.Generator().manual_seed(2)
    ids = torch.randint(0, 256, (4, 64), generator=g)
    ids[:, 0] = BOS
    batch = Batch(ids=ids, targets=torch.randint(0, 256, (4, 64), generator=g),
                  noise=torch.rand(4, 64, generator=g), index=torch.arange(4))
    sl = training_loss(model, batch, cfg)
    sl.loss.backward()
    assert [n for n, p in model.named_parameters() if p.grad is None or not p.grad.any()] == []
    for k in ("inner_pg_loss", "inner_rate_loss", "inner_policy_rate", "bpb_skip", "n_inner_boundary"):
        assert k in sl.stats
    r = ratios({k: v for k, v in sl.stats.items() if k.startswith("n_")})
    assert 0 < r["inner_rate"] <= 1 and r["bytes_per_inner_chunk"] >= 1 / r["rate"]


def test_level_stats_by_hand():
    """'Hi, you. Ok' with ends after 'Hi,' (on ','), after ' ' (the space after ','), inside
    'you' and on '.': 4 ends; 1 on whitespace, 2 on punctuation, 1 inside a word; words 'you'
    and 'Ok' start after whitespace (2 starts, neither an end); both clause ends (', ' and '. ')
    are hit: ',' ends a chunk and '.' does."""
    from rltok.analysis import level_stats

    text = b"Hi, you. Ok"
    e = np.zeros(len(text), bool)
    e[[2, 3, 5, 7]] = True
    st = level_stats([text], [e])
    assert st["ends"] == 4 and st["on_whitespace"] == 0.25 and st["on_punctuation"] == 0.5
    assert st["inside_words"] == 0.25 and st["words_per_chunk"] == 0.5
    assert st["word_start_recall"] == 0.0 and st["clause_recall"] == 1.0 and st["clause_ends"] == 2
    assert st["bytes_per_chunk"] == (len(text) - 1) / 4
    e2 = np.zeros(len(text), bool)
    e2[[4]] = True  # 'y': a word start, no clause end hit
    st2 = level_stats([text], [e2])
    assert st2["word_start_recall"] == 0.5 and st2["clause_recall"] == 0.0


def test_early_exit_inner_baseline_runs_no_skip_pass():
    """boundary.inner_baseline=early: training runs no skip pass (no skip logits, no bpb_skip) and
    the inner router still learns (its gradient's correctness: the enumeration test)."""
    from rltok.data.loader import Batch
    from rltok.objectives import training_loss

    cfg = build_config("rl", "smoke", overrides={"model.stages": 2, "boundary.inner_baseline": "early"})
    torch.manual_seed(0)
    model = get_method("rl").build(cfg, None)
    g = torch.Generator().manual_seed(2)
    ids = torch.randint(0, 256, (4, 64), generator=g)
    batch = Batch(ids=ids, targets=torch.randint(0, 256, (4, 64), generator=g),
                  noise=torch.rand(4, 64, generator=g), index=torch.arange(4))
    assert model(ids, noise=batch.noise).skip_logits == [None]
    sl = training_loss(model, batch, cfg)
    assert "bpb_skip" not in sl.stats and "inner_pg_loss" in sl.stats
    sl.loss.backward()
    assert model.routers[1].proj.weight.grad.abs().sum() > 0
