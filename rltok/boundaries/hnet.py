"""``hnet``: H-Net dynamic chunking (Hwang et al. 2025), as ported by the paper (spec 4.3).

Routing: q_t = W_q h_t, k_t = W_k h_t (d x d, no bias, initialised to the identity),

    p_t = clamp((1 - cos(q_{t-1}, k_t)) / 2, 0, 1),   p_0 = 1,   b_t = [p_t >= 0.5]  (deterministic)

Chunking selects h at the boundaries (the U-Net default). Dechunking smooths the main network's
chunk outputs with an EMA over chunks,

    zbar_c = P_c zhat_c + (1 - P_c) zbar_{c-1},   P_c = clamp(p at chunk c's byte, 1e-4, 1 - 1e-4),

and gives byte t the smoothed output of its chunk times a straight-through confidence,

    u_t = zbar_{up(t)} * STE(c_t) + h_t,   c_t = p_t if b_t else 1 - p_t,   STE(x) = 1 forward, identity backward.

The ratio loss (weight ``alpha`` = 0.03) keeps the rate near r*: with N = 1/r*, F the fraction of
boundaries and G the mean probability, L = N/(N-1) ((N-1) F G + (1-F)(1-G)).

The ratio loss alone leaves the tiny preset at rate 0.27-0.31 for r* = 0.2 (the paper's port does
not say how closely its runs held r*). ``rate_control=threshold`` (rltok's, not H-Net's) holds the
rate where a rate-matched comparison needs it: the threshold theta of b_t = [p_t >= theta] is
an integral controller on the achieved training rate F, theta += control_gain * (F - r*) after
every training micro-batch (clamped to [0.02, 0.98]; a buffer, so saved and restored with the
weights, and fixed at evaluation). The routing, EMA and ratio loss are unchanged.

Differences from H-Net itself, as in the paper's port: Transformer encoder/decoder instead of
Mamba-2, a plain residual (no residual projection), no per-stage learning-rate multipliers. The
EMA is a pure-PyTorch blocked parallel scan (``ema_scan``) instead of Mamba-2's SSD kernel; a
reference loop (``ema_loop``) is kept for tests.

In H-Net's own words b_t = 1 means byte t *starts* a chunk whose vector is taken at t; here it is
the byte whose vector is selected, i.e. the end of a chunk in this library's convention. The
computation is identical: byte t receives the output selected at the latest boundary <= t.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .. import estimator as est
from ..schema import BoundaryConfig, ModelConfig
from ..errors import RltokError
from ..model.chunking import decided_mask, force_ends
from ..model.dc import P_MIN, EMASmooth, ema_loop, ema_scan  # noqa: F401  (ema_*, P_MIN re-exported)
from ..model.unet import unet_builder
from ..registry import MethodSpec, register
from .base import BoundaryModule, BoundaryOutput, BoundaryStep, LossContext



@dataclass
class HNetConfig(BoundaryConfig):
    alpha: float = 0.03  # weight of the ratio loss
    threshold: float = 0.5
    # "": the fixed threshold (H-Net); threshold: adapt it to hold target_rate (module docstring)
    rate_control: str = ""
    control_gain: float = 0.1

    def validate(self) -> None:
        super().validate()
        if self.alpha < 0:
            raise RltokError("boundary.alpha must be >= 0")
        if not 0 < self.threshold < 1:
            raise RltokError(f"boundary.threshold={self.threshold} must be in (0, 1)")
        if self.rate_control not in ("", "threshold"):
            raise RltokError(f"boundary.rate_control={self.rate_control!r} must be '' or threshold")
        if not 0 < self.control_gain < 10:
            raise RltokError(f"boundary.control_gain={self.control_gain} must be in (0, 10)")


class HNetBoundaries(BoundaryModule):
    name = "hnet"
    learned = True
    dechunk = "ema"  # EMASmooth: each byte gets the EMA of the chunk outputs (dechunker.scan_block)

    def __init__(self, model_cfg: ModelConfig, cfg: HNetConfig):
        super().__init__(model_cfg, cfg)
        d = model_cfg.d_model
        self.q_proj = nn.Linear(d, d, bias=False)
        self.k_proj = nn.Linear(d, d, bias=False)
        with torch.no_grad():
            self.q_proj.weight.copy_(torch.eye(d))
            self.k_proj.weight.copy_(torch.eye(d))
        if cfg.rate_control == "threshold":
            self.register_buffer("threshold", torch.tensor(float(cfg.threshold)))

    def rate_knob(self):
        # the controlled routing threshold (b_t = [p_t >= theta]: a higher one, fewer boundaries)
        if self.cfg.rate_control == "threshold":
            return self.threshold, -1.0, 0.0, 1.0
        return None

    def _threshold(self) -> Tensor | float:
        return self.threshold if self.cfg.rate_control == "threshold" else self.cfg.threshold

    def forward(self, h: Tensor, ids: Tensor, *, valid: Tensor, noise: Tensor | None = None,
                fixed: Tensor | None = None, mode: str = "sample") -> BoundaryOutput:
        q = F.normalize(self.q_proj(h[:, :-1]).float(), dim=-1)
        k = F.normalize(self.k_proj(h[:, 1:]).float(), dim=-1)
        cos = (q * k).sum(-1)
        p = torch.clamp((1 - cos) / 2, 0.0, 1.0)
        p = F.pad(p, (1, 0), value=1.0)  # p_0 = 1
        b = fixed.bool() if fixed is not None else p >= self._threshold()
        b = force_ends(b, valid)
        decided = decided_mask(valid)
        return BoundaryOutput(hard=b.float(), decided=decided, probs=p)

    # -- decoding: routing needs q of the previous byte (the dechunker keeps the EMA) -------------
    def step(self, h: Tensor, ids: Tensor, state: Tensor | None, *, pos: Tensor, noise: Tensor | None = None,
             fixed: Tensor | None = None, mode: str = "sample") -> BoundaryStep:
        """State: q_{t-1} / |q_{t-1}| (n, d), the routing's query of the previous byte."""
        q = F.normalize(self.q_proj(h).float(), dim=-1)
        k = F.normalize(self.k_proj(h).float(), dim=-1)
        p = torch.ones(h.shape[0], device=h.device) if state is None else torch.clamp((1 - (state * k).sum(-1)) / 2, 0.0, 1.0)
        p = torch.where(pos == 0, torch.ones_like(p), p)
        b = fixed.bool() if fixed is not None else p >= self._threshold()
        return BoundaryStep(b=b | (pos == 0), prob=p, state=q)

    def aux_loss(self, ctx: LossContext) -> tuple[Tensor, dict[str, Tensor]]:
        out = ctx.out
        v = ctx.valid.float()
        n = v.sum().clamp(min=1)
        dec = out.decided.float()
        # forced positions count as boundaries with probability 1, as in the rl policy's rate stats
        G = (out.probs * dec + (v - dec)).sum() / n
        Fr = ctx.reduce_mean((out.hard.detach() * v).sum() / n)
        loss = est.ratio_loss(Fr, G, self.cfg.target_rate)
        stats = {"ratio_loss": loss.detach(), "policy_rate": G.detach()}
        if self.cfg.rate_control == "threshold" and self.training:
            with torch.no_grad():
                self.threshold.add_(self.cfg.control_gain * (Fr.detach() - self.cfg.target_rate)).clamp_(0.02, 0.98)
            stats["threshold"] = self.threshold.detach().clone()
        return self.cfg.alpha * loss, stats


register(MethodSpec(
    name="hnet",
    config_cls=HNetConfig,
    build=unet_builder(HNetBoundaries),
    description="H-Net dynamic chunking (Hwang et al. 2025): cosine routing, EMA dechunking, ratio loss",
))
