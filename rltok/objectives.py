"""Losses and scoring, kept beside (not inside) the models.

* ``training_loss(model, batch, cfg)``: the scalar to minimise plus detached statistics.
  For the U-Net: lm_weight * CE + early_weight * CE_early + the boundary method's aux loss.
* ``score(model, batch)``: per-position negative log-likelihoods (nats) and the boundaries used,
  for evaluation of any model.

Both are chosen by the model's class (``functools.singledispatch``): the U-Net's are below and are
the default; a flat baseline registers its own for its model class in its module (rltok/flat/).
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field
from typing import Callable, Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .model.router import LossContext
from .schema import PAD, RunConfig
from .data.loader import Batch
from .model.stage import chunk_sums, level_boundary_bytes
from .text import whitespace_mask

LN2 = math.log(2.0)


@dataclass
class StepLoss:
    loss: Tensor
    stats: dict[str, Tensor] = field(default_factory=dict)


@dataclass
class ScoreOutput:
    nll: Tensor  # (B, S) float32 nats; 0 where there is no target
    boundaries: Tensor | None = None  # (B, S) bool, None for models without chunks
    probs: Tensor | None = None  # (B, S) boundary probabilities, when the method has them
    correct: Tensor | None = None  # (B, S) bool: the target is the most likely next id (greedy)
    # (B, S) bool per level below the bytes (level 1 first): the bytes that end a chunk of that level
    level_boundaries: list[Tensor] = field(default_factory=list)

    @property
    def inner_boundaries(self) -> Tensor | None:
        """(B, S) bool, two levels or more: the bytes that end a level-1 chunk."""
        return self.level_boundaries[0] if self.level_boundaries else None


def _identity(x: Tensor) -> Tensor:
    return x


def per_position_ce(logits: Tensor, targets: Tensor) -> Tensor:
    """(B, S) cross-entropy in nats (float32); 0 where target == -1."""
    B, S, V = logits.shape
    ce = F.cross_entropy(logits.float().reshape(B * S, V), targets.reshape(B * S).clamp(min=0),
                         reduction="none").view(B, S)
    return ce * (targets >= 0)


def level_key(level: int, name: str) -> str:
    """A statistic's name for level ``level`` >= 1 below the bytes: inner_rate, inner2_rate, ..."""
    return f"inner_{name}" if level == 1 else f"inner{level}_{name}"


def boundary_counts(ids: Tensor, b: Tensor, valid: Tensor, decided: Tensor | None = None,
                    inner: Tensor | Sequence[Tensor] | None = None) -> dict[str, Tensor]:
    """Sums from which rate and whitespace recall/precision are computed (additive over batches).

    rate = boundaries / valid bytes (forced ends included, as the paper reports it);
    whitespace recall = whitespace bytes that end a chunk / whitespace bytes;
    whitespace precision = chunk ends (decided, i.e. not forced) on whitespace / decided chunk ends;
    word-start recall = first bytes of words (a non-whitespace byte after a whitespace byte) that
    end a chunk / such bytes. A policy can settle on either of two word-aligned segmentations:
    chunks ending on the space ("word " chunks, the paper's finding) or on the first byte of the
    next word (the same chunks shifted by one byte); the two recalls tell them apart.
    ``inner`` (two levels or more): per level below the bytes, the bytes that end a chunk of that
    level; level k's rate is its chunk ends per chunk end of level k - 1.
    """
    b = b.bool() & valid
    ws_all = whitespace_mask(ids)
    ws = ws_all & valid
    prev_ws = torch.zeros_like(ws_all)
    prev_ws[:, 1:] = ws_all[:, :-1]
    word_start = prev_ws & ~ws_all & valid
    dec = valid if decided is None else decided
    ends = [] if inner is None else [inner] if isinstance(inner, Tensor) else list(inner)
    extra = {f"n_{level_key(k, 'boundary')}": (e.bool() & b).sum() for k, e in enumerate(ends, 1)}
    return {
        **extra,
        "n_valid": valid.sum(), "n_boundary": b.sum(),
        "n_ws": ws.sum(), "n_ws_boundary": (b & ws).sum(),
        "n_decided_boundary": (b & dec).sum(), "n_decided_ws_boundary": (b & ws & dec).sum(),
        "n_word_start": word_start.sum(), "n_word_start_boundary": (b & word_start).sum(),
    }


def ratios(c: dict[str, Tensor | float]) -> dict[str, float]:
    f = {k: float(v) for k, v in c.items()}
    inner = {}
    k, above = 1, f["n_boundary"]
    while f"n_{level_key(k, 'boundary')}" in f:
        n = f[f"n_{level_key(k, 'boundary')}"]
        inner[level_key(k, "rate")] = n / max(above, 1)
        inner[f"bytes_per_{level_key(k, 'chunk')}"] = f["n_valid"] / n if n else float("nan")
        k, above = k + 1, n
    return {
        **inner,
        "rate": f["n_boundary"] / max(f["n_valid"], 1),
        "whitespace_recall": f["n_ws_boundary"] / f["n_ws"] if f["n_ws"] else float("nan"),
        "whitespace_precision": (f["n_decided_ws_boundary"] / f["n_decided_boundary"]
                                 if f["n_decided_boundary"] else float("nan")),
        "word_start_recall": (f["n_word_start_boundary"] / f["n_word_start"]
                              if f.get("n_word_start") else float("nan")),
    }


# -- U-Net family --------------------------------------------------------------------------------

def unet_training_loss(model: nn.Module, batch: Batch, cfg: RunConfig,
                       reduce_mean: Callable[[Tensor], Tensor] = _identity,
                       all_reduce_sum: Callable[[Tensor], Tensor] | None = None,
                       forward: Callable | None = None) -> StepLoss:
    """``forward`` is the callable to run (a DDP wrapper); ``model`` the bare module."""
    fwd = forward or model
    out = fwd(batch.ids, noise=batch.noise)
    tmask = batch.targets >= 0
    valid = batch.ids != PAD
    n = tmask.sum().clamp(min=1)
    ce = per_position_ce(out.logits, batch.targets)
    ce_e = per_position_ce(out.early_logits, batch.targets)
    lm, early = ce.sum() / n, ce_e.sum() / n
    ctx = LossContext(out=out.boundary, ce=ce, ce_early=ce_e, target_mask=tmask, valid=valid,
                      reduce_mean=reduce_mean, all_reduce_sum=all_reduce_sum, ids=batch.ids)
    aux, stats = model.boundary.aux_loss(ctx)
    bc = cfg.boundary
    # the early term is always in the graph (weight 0 included) so that every parameter gets a
    # gradient, which DDP requires
    loss = bc.lm_weight * lm + bc.early_weight * early + aux
    inner_bytes = None
    if len(out.levels) > 1:
        inner_loss, inner_stats, inner_bytes = _deeper_levels_loss(model, out, ce, batch, n, ctx)
        loss = loss + inner_loss
        stats.update(inner_stats)
    counts = boundary_counts(batch.ids, out.boundary.b, valid, out.boundary.decided, inner_bytes)
    stats = {k: v.detach().float() for k, v in stats.items()}
    stats.update({
        "lm_loss": lm.detach(), "bpb": lm.detach() / LN2, "bpb_early": early.detach() / LN2,
        "chunks": out.chunks.counts.float().mean(),
        **{k: v.float() for k, v in counts.items()},
    })
    if out.chunk_fill is not None:  # static chunk shapes: the training step reads and removes it
        stats["chunk_fill"] = out.chunk_fill
    return StepLoss(loss=loss, stats=stats)


def _deeper_levels_loss(model: nn.Module, out, ce: Tensor, batch: Batch, n: Tensor,
                        ctx: LossContext) -> tuple[Tensor, dict[str, Tensor], list[Tensor]]:
    """Two levels or more: each deeper router's estimator (docs/two_stage.md), its statistics and
    the bytes that end a chunk of its level.

    The router of level k decides over the chunks of level k - 1. Its per-position loss is that
    chunk's share of the byte losses, summed over the bytes that read it; its reward baseline is
    the same sum through the exit that skips level k (``skip_logits``). Then the one-stage
    estimator runs unchanged on that axis: batch-relative advantage per chunk index, reward-to-go
    discounted by gamma per chunk, its own rate penalty at boundary.inner_target_rate. Its
    surrogate is divided by the byte targets, as the byte router's is, so that every level
    estimates the gradient of the same per-byte loss. The skip exits run forward only."""
    levels, routers = out.levels, model.routers
    total, stats = ce.new_zeros(()), {}
    for k in range(1, len(levels)):
        skip = out.skip_logits[k - 1]
        # the baseline: the skip exit's losses, or (boundary.inner_baseline=early) the early exit's
        ce_skip = ctx.ce_early if skip is None else per_position_ce(skip, batch.targets)
        c, c_skip, targets = ce, ce_skip, ctx.target_mask.float()
        for j in range(k):  # byte values summed up to the chunks of level k - 1
            ch = levels[j].chunks
            c, c_skip, targets = chunk_sums(c, ch), chunk_sums(c_skip, ch), chunk_sums(targets, ch)
        valid = levels[k - 1].chunks.valid
        level_ctx = LossContext(out=levels[k].boundary, ce=c, ce_early=c_skip, target_mask=(targets > 0) & valid,
                                valid=valid, reduce_mean=ctx.reduce_mean, all_reduce_sum=ctx.all_reduce_sum,
                                ids=None, n_targets=n.float())
        aux, level_stats = routers[k].aux_loss(level_ctx)
        total = aux if k == 1 else total + aux
        stats.update({level_key(k, name): v for name, v in level_stats.items()})
        if skip is not None:
            stats["bpb_skip" if k == 1 else f"bpb_skip{k}"] = ce_skip.sum() / n / LN2
    return total, stats, level_boundary_bytes(out.stage, batch.ids.shape[1])


@torch.no_grad()
def unet_score(model: nn.Module, batch: Batch, noise: Tensor | None = None, mode: str = "sample",
               boundaries: Tensor | None = None) -> ScoreOutput:
    out = model(batch.ids, noise=noise, mode=mode, boundaries=boundaries)
    nll = per_position_ce(out.logits, batch.targets)
    correct = out.logits.argmax(-1) == batch.targets
    return ScoreOutput(nll=nll, boundaries=out.boundary.b, probs=out.boundary.probs, correct=correct,
                       level_boundaries=level_boundary_bytes(out.stage, batch.ids.shape[1]))


@torch.no_grad()
def unet_boundaries(model: nn.Module, batch: Batch, noise: Tensor | None = None, mode: str = "sample") -> Tensor:
    """The byte-level boundaries :func:`unet_score` gives (``ScoreOutput.boundaries``), from the
    encoder and the router alone: the same operations on the same inputs as the full forward up
    to the router, so the same decisions (tests/test_rates.py), at the encoder's cost."""
    ids = batch.ids
    return model.stage.router(model.encode(ids), ids, valid=ids != PAD, noise=noise, fixed=None, mode=mode).b


@functools.singledispatch
def training_loss(model: nn.Module, batch: Batch, cfg: RunConfig, **kw) -> StepLoss:
    """The training loss of ``model`` on ``batch`` (the U-Net's unless the model's class
    registered its own: ``training_loss.register``)."""
    return unet_training_loss(model, batch, cfg, **kw)


@functools.singledispatch
def score(model: nn.Module, batch: Batch, noise: Tensor | None = None, mode: str = "sample",
          boundaries: Tensor | None = None) -> ScoreOutput:
    """Per-position NLL of ``model`` on ``batch`` (the U-Net's unless the model's class
    registered its own: ``score.register``)."""
    return unet_score(model, batch, noise=noise, mode=mode, boundaries=boundaries)
