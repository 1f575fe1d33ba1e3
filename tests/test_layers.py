"""Attention: the blocked sliding-window path equals full attention with a band mask."""

import pytest
import torch
import torch.nn.functional as F

from rltok.model.layers import local_attention, rope_angles


@pytest.mark.parametrize("T,W", [(37, 8), (64, 16), (5, 4), (100, 1)])
def test_local_attention_matches_masked_full(T, W):
    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 3, T, 8) for _ in range(3))
    i = torch.arange(T)[:, None]
    j = torch.arange(T)[None, :]
    mask = (j <= i) & (j > i - W)
    ref = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    out = local_attention(q, k, v, W)
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)


def test_rope_positions_are_exact_integers():
    # the reference code built positions in bf16, which cannot represent 4095; we must not
    cos, _ = rope_angles(torch.tensor([4095, 4094]), 8, 10000.0)
    assert not torch.equal(cos[..., 0, :], cos[..., 1, :])
    assert torch.bfloat16 != cos.dtype


@pytest.mark.parametrize("T,W", [(37, 8), (64, 16), (5, 4), (100, 1)])
def test_explicit_local_attention_matches_sdpa(T, W):
    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 3, T, 8) for _ in range(3))
    torch.testing.assert_close(local_attention(q, k, v, W, "explicit"), local_attention(q, k, v, W, "sdpa"),
                               atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("T", [1, 7, 130])
def test_explicit_causal_attention_matches_sdpa_and_bf16_error_is_flash_like(T):
    from rltok.model.layers import causal_attention

    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 3, T, 64) for _ in range(3))
    ref = causal_attention(q, k, v, "sdpa")
    torch.testing.assert_close(causal_attention(q, k, v, "explicit"), ref, atol=1e-5, rtol=1e-5)
    # in bf16 the explicit path's error is of the order of the fused kernel's
    qb, kb, vb = (x.bfloat16() for x in (q, k, v))
    err_explicit = (causal_attention(qb, kb, vb, "explicit").float() - ref).abs().max().item()
    err_sdpa = (causal_attention(qb, kb, vb, "sdpa").float() - ref).abs().max().item()
    assert err_explicit < 0.05 and err_explicit < 3 * err_sdpa + 1e-3


def test_main_network_on_packed_chunks_matches_the_padded_layout():
    """The main network run on the real chunks only (PackedRows) gives the padded layout's
    outputs on every real chunk, values and gradients."""
    from rltok.methods import get_method
    from rltok.config import build_config

    cfg = build_config("rl", "smoke", overrides={"model.seq_len": 32})
    torch.manual_seed(0)
    model = get_method("rl").build(cfg, None)
    B, M, d = 3, 9, cfg.model.d_model
    z = torch.randn(B, M, d, requires_grad=True)
    counts = torch.tensor([9, 4, 6])
    valid = torch.arange(M)[None, :] < counts[:, None]
    z_in = z * valid[..., None]
    positions = torch.where(valid, torch.arange(M)[None, :] * 3, torch.full((B, M), 31))
    padded = model.stage.main(z_in, positions)
    packed = model.stage.main(z_in, positions, valid=valid)
    torch.testing.assert_close(packed[valid], padded[valid], atol=1e-5, rtol=1e-5)
    assert packed[~valid].abs().max() == 0
    g1, = torch.autograd.grad(padded[valid].sum(), z, retain_graph=True)
    g2, = torch.autograd.grad(packed[valid].sum(), z)
    torch.testing.assert_close(g2, g1, atol=1e-5, rtol=1e-5)
