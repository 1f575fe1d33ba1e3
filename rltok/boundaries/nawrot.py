"""``nawrot``: dynamic pooling (Nawrot et al. 2023), as ported by the paper (spec 4.2).

* Boundary predictor: MLP(d -> d, ReLU, d -> 1) on the encoder output, logit l_t.
* Relaxed Bernoulli (Gumbel-sigmoid / binary Concrete) at temperature T:
  soft_t = sigmoid((l_t + log u_t - log(1 - u_t)) / T), with u_t the batch's noise uniforms.
* Hard boundary b_t = [soft_t > 0.5] with a straight-through estimator: the forward value is b_t,
  the gradient is that of soft_t.
* Downsampling: the mean of the bytes of each chunk (end-of-chunk convention: byte t belongs to
  chunk down(t) = sum_{j<t} b_j). The pooling weights are 1 in the forward pass and carry the
  straight-through gradient of the chunk assignment, as Nawrot's einsum pooling does: the weight of
  byte l in its chunk is 1 - (c - down(l)), whose derivative w.r.t. b_j is 1 for every j < l.
* Upsampling: chunk c's output is added to bytes t with up(t) = c (the U-Net default).
* Rate control (``boundary.rate_loss``):
  - ``binomial`` (default; Nawrot's prior): -log Binomial(n, r*).pmf(k) / n per sequence, with k
    the number of (straight-through) boundaries among its n decided positions;
  - ``logit_shift``: the paper's proportional controller (``estimator.rate_penalty``) with the
    relaxed samples as probabilities and their logits. This is what the paper's reference run
    used (spec 4.2, weight 2.0 inferred); select it with ``rate_loss=logit_shift rate_weight=2``.

Causal: b_t depends on h_t and u_t only, and chunk c pools bytes <= its last byte.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from .. import estimator as est
from ..schema import BoundaryConfig, ModelConfig
from ..errors import RltokError
from ..model.chunking import forced_mask
from ..model.dc import MeanPool, straight_through_pool_weights  # noqa: F401  (re-exported)
from ..model.unet import unet_builder
from ..registry import MethodSpec, register
from .base import BoundaryModule, BoundaryOutput, BoundaryStep, LossContext

_EPS = 1e-6  # keeps the logistic noise finite for u in {0, 1}


@dataclass
class NawrotConfig(BoundaryConfig):
    temperature: float = 1.0  # Gumbel-sigmoid temperature (the paper's port: 1; Nawrot's configs: 0.5)
    threshold: float = 0.5  # hard boundary where the relaxed sample exceeds this
    hidden_mult: float = 1.0  # predictor MLP width / d (the paper's port: d; Nawrot: d_inner = 4d)
    rate_loss: str = "binomial"  # binomial (Nawrot's prior) or logit_shift (the paper's reference runs)
    rate_weight: float = 1.0

    def validate(self) -> None:
        super().validate()
        if self.temperature <= 0:
            raise RltokError(f"boundary.temperature={self.temperature} must be > 0")
        if not 0 < self.threshold < 1:
            raise RltokError(f"boundary.threshold={self.threshold} must be in (0, 1)")
        if self.hidden_mult <= 0:
            raise RltokError(f"boundary.hidden_mult={self.hidden_mult} must be > 0")
        if self.rate_loss not in ("binomial", "logit_shift"):
            raise RltokError(f"boundary.rate_loss={self.rate_loss!r} must be binomial or logit_shift")
        if self.rate_weight < 0:
            raise RltokError("boundary.rate_weight must be >= 0")


def logistic_noise(u: Tensor) -> Tensor:
    """log u - log(1 - u): a Logistic(0, 1) sample from a uniform (the difference of two Gumbels)."""
    u = u.float().clamp(_EPS, 1 - _EPS)
    return torch.log(u) - torch.log1p(-u)


def binomial_nll(k: Tensor, n: Tensor, p: float) -> Tensor:
    """-log Binomial(n, p).pmf(k), differentiable in k (lgamma form, as torch's Binomial)."""
    k, n = k.float(), n.float()
    log_pmf = (torch.lgamma(n + 1) - torch.lgamma(k + 1) - torch.lgamma(n - k + 1)
               + k * math.log(p) + (n - k) * math.log1p(-p))
    return -log_pmf


class NawrotBoundaries(BoundaryModule):
    name = "nawrot"
    learned = True
    stochastic = True
    # dynamic pooling: the mean of each chunk's bytes, its weights carrying the boundaries' gradient
    pools = ("mean",)
    straight_through_pool = True

    def __init__(self, model_cfg: ModelConfig, cfg: NawrotConfig):
        super().__init__(model_cfg, cfg)
        d = model_cfg.d_model
        hidden = max(1, int(round(d * cfg.hidden_mult)))
        self.predictor = nn.Sequential(nn.Linear(d, hidden), nn.ReLU(), nn.Linear(hidden, 1))
        # an evaluation knob (evaluate.calibrate_rate): a logit offset, 0 in training and not
        # saved, so that dynamic pooling can be compared at r* on any text, as rl's offset allows
        self.register_buffer("rate_offset", torch.zeros(()), persistent=False)

    def rate_knob(self):
        return self.rate_offset, 1.0, -20.0, 20.0

    def forward(self, h: Tensor, ids: Tensor, *, valid: Tensor, noise: Tensor | None = None,
                fixed: Tensor | None = None, mode: str = "sample") -> BoundaryOutput:
        cfg = self.cfg
        B, S = ids.shape
        logits = self.predictor(h).squeeze(-1).float() + self.rate_offset
        forced = forced_mask(valid)
        decided = valid & ~forced
        if mode == "greedy":
            relaxed_logits = logits / cfg.temperature
        else:
            if noise is None:
                noise = torch.rand(B, S, device=ids.device)
            relaxed_logits = (logits + logistic_noise(noise)) / cfg.temperature
        soft = torch.sigmoid(relaxed_logits)
        if fixed is not None:
            hard = fixed.float()
        else:
            hard = (soft > cfg.threshold).float()
            hard = hard - soft.detach() + soft  # straight-through
        # forced ends are constants 1, padding constant 0 (no gradient through either)
        hard = torch.where(forced, torch.ones_like(hard), hard * valid)
        return BoundaryOutput(hard=hard, decided=decided, probs=torch.sigmoid(logits), logits=logits,
                              extras={"soft": soft, "relaxed_logits": relaxed_logits})

    # -- decoding: the same draw for one byte (the chunker keeps the open chunk's sum) ------------
    def step(self, h: Tensor, ids: Tensor, state: None, *, pos: Tensor, noise: Tensor | None = None,
             fixed: Tensor | None = None, mode: str = "sample") -> BoundaryStep:
        cfg = self.cfg
        logit = self.predictor(h).squeeze(-1).float() + self.rate_offset
        if mode == "greedy":
            relaxed = logit / cfg.temperature
        else:
            u = noise if noise is not None else torch.rand(h.shape[0], device=h.device)
            relaxed = (logit + logistic_noise(u)) / cfg.temperature
        b = fixed.bool() if fixed is not None else torch.sigmoid(relaxed) > cfg.threshold
        return BoundaryStep(b=b | (pos == 0), prob=torch.sigmoid(logit))

    def aux_loss(self, ctx: LossContext) -> tuple[Tensor, dict[str, Tensor]]:
        cfg, out = self.cfg, ctx.out
        dec = out.decided.float()
        soft = out.extras["soft"]
        if cfg.rate_loss == "binomial":
            n = dec.sum(1)
            k = (out.hard * dec).sum(1)
            rate = (binomial_nll(k, n, cfg.target_rate) / n.clamp(min=1)).mean()
        else:
            rate, _ = est.rate_penalty(soft, out.extras["relaxed_logits"], out.decided, ctx.valid,
                                       cfg.target_rate, ctx.reduce_mean)
        n_dec = dec.sum().clamp(min=1)
        stats = {"rate_loss": rate.detach(),
                 "policy_rate": (out.probs.detach() * dec).sum() / n_dec,
                 "soft_rate": (soft.detach() * dec).sum() / n_dec}
        return cfg.rate_weight * rate, stats


register(MethodSpec(
    name="nawrot",
    config_cls=NawrotConfig,
    build=unet_builder(NawrotBoundaries),
    description="dynamic pooling (Nawrot et al. 2023): Gumbel-sigmoid boundaries, straight-through, mean pooling",
))
