"""The score-function (REINFORCE) estimator for boundary policies, as pure tensor functions.

Spec section 3. For per-position losses of a batch (B, S):

1. reward      r_t = CE^early_t - CE_t                  (or -CE_t without the early-exit baseline)
2. advantage   A_t = r_t - mean_batch(r_t)              (per position; or leave-one-out; or none)
3. return      G_t = sum_{k>=t} gamma^(k-t) A_k         (reward-to-go, detached)
4. surrogate   L_PG = -(1/N) sum_t G_t log pi(b_t)
5. rate        L_rate = (mean pi - r*)_sg * mean logit  (a proportional controller on all logits)

All on the model's device, float32, vectorised: no host round trip and no loop over time.
"""

from __future__ import annotations

import math
from typing import Callable

import torch
import torch.nn.functional as F
from torch import Tensor

from .errors import RltokError

REWARDS = ("early_exit", "neg_ce")
BASELINES = ("batch_mean", "leave_one_out", "none")


def rewards(ce: Tensor, ce_early: Tensor, kind: str = "early_exit") -> Tensor:
    """Per-position reward in nats: how much the chunk pathway improved the prediction."""
    if kind == "early_exit":
        return (ce_early - ce).detach().float()
    if kind == "neg_ce":
        return (-ce).detach().float()
    raise RltokError(f"boundary.reward={kind!r} must be one of {REWARDS}")


def batch_relative(r: Tensor, mask: Tensor, kind: str = "batch_mean", group: int = 0,
                   all_reduce_sum: Callable[[Tensor], Tensor] | None = None) -> Tensor:
    """Subtract a per-position baseline computed across the sequences of a group.

    ``group`` consecutive sequences share a baseline (0: the whole micro-batch). With
    ``all_reduce_sum`` the sums run over the same group on every data-parallel rank (global).

    * ``batch_mean`` (the paper): A = r - mean(r). Includes the sequence itself, so in
      expectation the gradient is scaled by (n-1)/n (n sequences per baseline): same direction,
      slightly smaller; unbiased up to that factor.
    * ``leave_one_out``: A = r - mean of the *other* sequences. Unbiased.
    * ``none``: A = r.
    """
    if kind not in BASELINES:
        raise RltokError(f"boundary.baseline={kind!r} must be one of {BASELINES}")
    r = r.float()
    m = mask.float()
    if kind == "none":
        return r * m
    B, S = r.shape
    g = B if group <= 0 else group
    if B % g:
        raise RltokError(f"boundary.baseline_group={group} must divide the micro-batch ({B})")
    rg, mg = (r * m).view(B // g, g, S), m.view(B // g, g, S)
    total, count = rg.sum(1, keepdim=True), mg.sum(1, keepdim=True)
    if all_reduce_sum is not None:
        total, count = all_reduce_sum(total), all_reduce_sum(count)
    if kind == "batch_mean":
        base = total / count.clamp(min=1)
    else:
        others = count - mg
        base = torch.where(others > 0, (total - rg) / others.clamp(min=1), torch.zeros_like(rg))
    return ((rg - base) * mg).view(B, S)


def discounted_reward_to_go(r: Tensor, gamma: float, block: int = 64) -> Tensor:
    """G_t = sum_{k>=t} gamma^(k-t) r_k along the last axis, float32.

    Two-level blocked form: a discounted sum inside blocks of ``block`` positions (a small
    Toeplitz matmul) plus a carry between blocks (another one). Every power of gamma used is
    <= 1, so it is stable at any length (the one-shot gamma^-t rescaling overflows beyond
    ~1000 positions); cost O(S * block + S^2 / block).
    """
    if not (0.0 < gamma <= 1.0):
        raise RltokError(f"boundary.gamma={gamma} must be in (0, 1]")
    # (the meta device has no autocast: rltok plan traces the loss there)
    with torch.autocast(device_type="cpu" if r.is_meta else r.device.type, enabled=False):
        x = r.float()
        *lead, S = x.shape
        L = max(1, min(block, S))
        nb = math.ceil(S / L)
        x = F.pad(x, (0, nb * L - S)).view(*lead, nb, L)
        dev = x.device
        i = torch.arange(L, device=dev)
        e = (i[None, :] - i[:, None]).double()  # e[i, j] = j - i
        g = float(gamma)  # a scalar argument: a tensor made from it would be a blocking copy to a GPU
        D = torch.where(e >= 0, g ** e.clamp(min=0), torch.zeros_like(e)).float()  # (L, L)
        local = x @ D.T  # local[n, i] = sum_{j>=i} gamma^(j-i) x[n, j]
        n = torch.arange(nb, device=dev)
        en = (n[None, :] - n[:, None] - 1).double()  # m - n - 1
        E = torch.where(en >= 0, g ** (L * en.clamp(min=0)), torch.zeros_like(en)).float()
        carry = local[..., 0] @ E.T  # value at the start of block n+1, discounted to its start
        decay = (g ** (L - i).double()).float()  # gamma^(L - i): from position i to the next block
        G = local + carry[..., None] * decay
        return G.reshape(*lead, nb * L)[..., :S]


def policy_gradient_surrogate(returns: Tensor, log_prob: Tensor, mask: Tensor, n: Tensor | None = None) -> Tensor:
    """-(1/N) sum G_t log pi(b_t); N = positions with a target (or ``n``). Its gradient is the estimate."""
    m = mask.float()
    n = m.sum() if n is None else n
    return -(returns.detach() * log_prob.float() * m).sum() / n.clamp(min=1)


def rate_penalty(probs: Tensor, logits: Tensor, decided: Tensor, valid: Tensor, target: float,
                 reduce_mean: Callable[[Tensor], Tensor] | None = None,
                 one_sided: bool = False, segments: Tensor | None = None,
                 all_reduce_sum: Callable[[Tensor], Tensor] | None = None,
                 content: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """(pbar - r*)_sg * mean logit, with forced positions counted as probability 1 (the paper).

    Returns (loss, pbar). The gradient on every decided logit is (pbar - r*)/N: all logits move
    down together when the rate is above target and up when below. ``one_sided``: only above
    (max(pbar - r*, 0)), so r* is a ceiling the policy may stay under. ``segments`` ((B, S) ids
    below B*(S+1), e.g. ``document_segments``): pbar per segment instead of over the batch (not reduced across
    ranks: a document lives on one rank). ``all_reduce_sum``: the controller's pbar is the ratio
    of sums over ranks (as one process over the whole batch computes it, also when ranks hold
    different numbers of positions, e.g. an inner stage's chunks); else ``reduce_mean`` of pbar.
    ``content`` (B, S, with ``segments``): each position's information (nats, e.g. its
    cross-entropy; detached here): a segment's target is then r* x (its nats per position) / (the
    batch's nats per position), i.e. boundaries in proportion to information, with the one
    constant that gives r* on the batch as a whole.
    """
    d, v = decided.float(), valid.float()
    n = v.sum().clamp(min=1)
    p_forced = probs.float() * d + (v - d)
    pbar = p_forced.sum() / n
    if segments is not None:
        # one controller per segment (document): each decided logit moves by its own segment's
        # (pbar_seg - r*)/N, so every document is pushed to the target rate, not just their mean
        seg = segments.reshape(-1)
        # ids below B*(S+1) (as document_segments gives them): sized from the shape, so the
        # training step reads nothing back from the device
        size = probs.shape[0] * (probs.shape[1] + 1)
        num = torch.zeros(size, device=probs.device).index_add_(0, seg, p_forced.detach().reshape(-1))
        den = torch.zeros(size, device=probs.device).index_add_(0, seg, v.reshape(-1))
        goal: Tensor | float = target
        if content is not None:
            info = torch.zeros(size, device=probs.device).index_add_(0, seg, (content.detach().float() * v).reshape(-1))
            per_nat = target * v.sum() / info.sum().clamp(min=1e-9)  # boundaries per nat: r* on the batch
            goal = per_nat * info / den.clamp(min=1)
        excess = (num / den.clamp(min=1) - goal)[seg].reshape(probs.shape)
        if one_sided:
            excess = excess.clamp(min=0)
        return (excess * logits.float() * d).sum() / n, pbar
    if all_reduce_sum is not None:
        pbar_g = all_reduce_sum(p_forced.sum().detach()) / all_reduce_sum(v.sum()).clamp(min=1)
    else:
        pbar_g = pbar.detach() if reduce_mean is None else reduce_mean(pbar.detach())
    # divided by the mean count over ranks, so that averaging the ranks' gradients (DDP) gives one
    # process's gradient also when ranks hold different numbers of positions (an inner stage)
    lbar = (logits.float() * d).sum() / (n if reduce_mean is None else reduce_mean(n.detach()))
    excess = pbar_g - target
    if one_sided:
        excess = excess.clamp(min=0)
    return excess * lbar, pbar


def document_segments(ids: Tensor, bos: int) -> Tensor:
    """(B, S) long: an id per (row, document) -- a document starts at each BOS; the bytes of a row
    before its first BOS are the tail of a document that began in an earlier window."""
    B, S = ids.shape
    within = torch.cumsum((ids == bos).long(), dim=1)
    return within + (S + 1) * torch.arange(B, device=ids.device)[:, None]


def importance_ratio(log_prob: Tensor, b: Tensor, behaviour_rate: float, decided: Tensor,
                     clip: float) -> Tensor:
    """rho_t = pi(b_t) / pi_off(b_t) for boundaries drawn from Bernoulli(behaviour_rate),
    detached and clipped at ``clip`` (truncated importance sampling: bounded variance, biased
    toward the behaviour policy where the ratio is cut); 1 where nothing was decided."""
    r = behaviour_rate
    log_off = torch.where(b, torch.full_like(log_prob, math.log(r)), torch.full_like(log_prob, math.log(1 - r)))
    rho = torch.exp(log_prob.detach().float() - log_off).clamp(max=clip)
    return torch.where(decided, rho, torch.ones_like(rho))


def masked_mean_std(x: Tensor, mask: Tensor) -> tuple[Tensor, Tensor]:
    m = mask.float()
    n = m.sum().clamp(min=1)
    mean = (x * m).sum() / n
    var = (((x - mean) ** 2) * m).sum() / n
    return mean, var.sqrt()


def ratio_loss(hard_mean: Tensor, prob_mean: Tensor, target: float) -> Tensor:
    """H-Net's load-balancing ratio loss: N/(N-1) * ((N-1) F G + (1-F)(1-G)), N = 1/r*.

    F (fraction of boundaries) enters as a constant, G (mean probability) carries the gradient;
    the minimum over G is at F = 1/N.
    """
    N = 1.0 / target
    F_, G_ = hard_mean.detach(), prob_mean
    return N / (N - 1) * ((N - 1) * F_ * G_ + (1 - F_) * (1 - G_))
