"""Boundaries that are not learned.

``uniform`` (the paper's "Uniform", spec 4.1): exactly round(r* * n) boundaries per sequence of n
bytes, at uniformly random positions (top-k of uniform noise), first and last forced, resampled on
every forward pass, evaluation included. It is not a fixed stride.

Decoding: an exact count per sequence is not causal (whether byte t ends a chunk depends on how
many later bytes there are), so ``step`` draws each boundary as Bernoulli(r*) instead: the same
rate, a different distribution from training (``decode_matches_forward = False``). Teacher-forced
decoding with given boundaries is exact.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from ..config import BoundaryConfig
from ..model.chunking import force_ends, forced_mask
from .base import BoundaryModule, BoundaryOutput, BoundaryStep, MethodSpec, register, unet_builder


def exact_count_boundaries(noise: Tensor, valid: Tensor, rate: float) -> Tensor:
    """b with exactly max(2, round(rate * n_valid)) ones per row: the forced ends plus the
    positions with the largest noise among the remaining valid ones."""
    B, S = noise.shape
    forced = forced_mask((B, S), noise.device)
    n = valid.sum(1)
    k = torch.clamp(torch.round(rate * n.float()).long(), min=2)
    k = torch.minimum(k, n + 1)  # a padded row also forces position S-1
    score = torch.where(valid, noise.float(), torch.full_like(noise, -1.0, dtype=torch.float))
    score = torch.where(forced, torch.full_like(score, 2.0), score)
    ranked, _ = score.sort(dim=1, descending=True)
    thr = ranked.gather(1, (k - 1).clamp(max=S - 1)[:, None])
    return score >= thr


class UniformBoundaries(BoundaryModule):
    name = "uniform"
    stochastic = True
    decode_matches_forward = False  # decodes as Bernoulli(r*), see the module docstring

    def forward(self, h, ids, *, valid, noise=None, fixed=None, mode="sample") -> BoundaryOutput:
        B, S = ids.shape
        if fixed is not None:
            b = force_ends(fixed.bool(), valid)
        else:
            if noise is None:
                noise = torch.rand(B, S, device=ids.device)
            b = exact_count_boundaries(noise, valid, self.cfg.target_rate)
        decided = valid & ~forced_mask((B, S), ids.device)
        probs = torch.where(decided, torch.full((B, S), self.cfg.target_rate, device=ids.device),
                            b.float())
        return BoundaryOutput(hard=b.float(), decided=decided, probs=probs)

    def step(self, h, ids, state, *, pos, noise=None, fixed=None, mode="sample") -> BoundaryStep:
        r = self.cfg.target_rate
        if fixed is not None:
            b = fixed.bool()
        else:  # no greedy variant: uniform boundaries are random by definition
            u = noise if noise is not None else torch.rand(ids.shape, device=ids.device)
            b = u < r
        b = b | (pos == 0)
        return BoundaryStep(b=b, prob=torch.where(pos == 0, 1.0, r).to(torch.float32))


register(MethodSpec(
    name="uniform",
    config_cls=BoundaryConfig,
    build=unet_builder(UniformBoundaries),
    description="exactly round(r*S) boundaries at uniformly random positions (the paper's Uniform)",
))
