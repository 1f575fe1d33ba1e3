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
from typing import Callable

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .boundaries.base import LossContext
from .schema import PAD, RunConfig
from .data.loader import Batch
from .model.stage import chunk_sums, inner_boundary_bytes

LN2 = math.log(2.0)
WHITESPACE = (9, 10, 11, 12, 13, 32)


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
    inner_boundaries: Tensor | None = None  # (B, S) bool, two stages: bytes that end an inner chunk


def _identity(x: Tensor) -> Tensor:
    return x


def per_position_ce(logits: Tensor, targets: Tensor) -> Tensor:
    """(B, S) cross-entropy in nats (float32); 0 where target == -1."""
    B, S, V = logits.shape
    ce = F.cross_entropy(logits.float().reshape(B * S, V), targets.reshape(B * S).clamp(min=0),
                         reduction="none").view(B, S)
    return ce * (targets >= 0)


def whitespace_mask(ids: Tensor) -> Tensor:
    ws = torch.zeros(ids.shape, dtype=torch.bool, device=ids.device)
    for c in WHITESPACE:
        ws |= ids == c
    return ws


def boundary_counts(ids: Tensor, b: Tensor, valid: Tensor, decided: Tensor | None = None,
                    inner: Tensor | None = None) -> dict[str, Tensor]:
    """Sums from which rate and whitespace recall/precision are computed (additive over batches).

    rate = boundaries / valid bytes (forced ends included, as the paper reports it);
    whitespace recall = whitespace bytes that end a chunk / whitespace bytes;
    whitespace precision = chunk ends (decided, i.e. not forced) on whitespace / decided chunk ends;
    word-start recall = first bytes of words (a non-whitespace byte after a whitespace byte) that
    end a chunk / such bytes. A policy can settle on either of two word-aligned segmentations:
    chunks ending on the space ("word " chunks, the paper's finding) or on the first byte of the
    next word (the same chunks shifted by one byte); the two recalls tell them apart.
    ``inner`` (two stages): the bytes that end an inner chunk; the inner rate is inner chunk ends
    per outer chunk end.
    """
    b = b.bool() & valid
    ws_all = whitespace_mask(ids)
    ws = ws_all & valid
    prev_ws = torch.zeros_like(ws_all)
    prev_ws[:, 1:] = ws_all[:, :-1]
    word_start = prev_ws & ~ws_all & valid
    dec = valid if decided is None else decided
    extra = {} if inner is None else {"n_inner_boundary": (inner.bool() & b).sum()}
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
    if "n_inner_boundary" in f:
        inner = {"inner_rate": f["n_inner_boundary"] / max(f["n_boundary"], 1),
                 "bytes_per_inner_chunk": f["n_valid"] / f["n_inner_boundary"] if f["n_inner_boundary"] else float("nan")}
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
    if out.inner is not None:
        inner_loss, inner_stats, inner_bytes = _inner_stage_loss(model, out, ce, batch, n, ctx)
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


def _inner_stage_loss(model: nn.Module, out, ce: Tensor, batch: Batch, n: Tensor,
                      ctx: LossContext) -> tuple[Tensor, dict[str, Tensor], Tensor]:
    """Two stages: the inner router's estimator (docs/two_stage.md), its statistics and the bytes
    that end an inner chunk.

    The inner router decides over the outer chunks. Its per-position loss is chunk m's share of
    the byte losses, summed over the bytes that read chunk m; its reward baseline is the same sum
    through the exit that skips the inner stage (``skip_logits``). Then the one-stage estimator
    runs unchanged on that axis: batch-relative advantage per chunk index, reward-to-go
    discounted by gamma per outer chunk, its own rate penalty at boundary.inner_target_rate. Its
    surrogate is divided by the byte targets, as the outer one is, so that both estimate the
    gradient of the same per-byte loss. The skip exit runs forward only (no loss of its own)."""
    ch = out.chunks
    # the baseline: the skip exit's losses, or (boundary.inner_baseline=early) the outer early exit's
    ce_skip = ctx.ce_early if out.skip_logits is None else per_position_ce(out.skip_logits, batch.targets)
    inner_ctx = LossContext(out=out.inner.boundary, ce=chunk_sums(ce, ch), ce_early=chunk_sums(ce_skip, ch),
                            target_mask=(chunk_sums(ctx.target_mask.float(), ch) > 0) & ch.valid, valid=ch.valid,
                            reduce_mean=ctx.reduce_mean, all_reduce_sum=ctx.all_reduce_sum, ids=None,
                            n_targets=n.float())
    aux, stats = model.inner.boundary.aux_loss(inner_ctx)
    stats = {f"inner_{k}": v for k, v in stats.items()}
    if out.skip_logits is not None:
        stats["bpb_skip"] = ce_skip.sum() / n / LN2
    return aux, stats, inner_boundary_bytes(out.inner, ch, batch.ids.shape[1])


@torch.no_grad()
def unet_score(model: nn.Module, batch: Batch, noise: Tensor | None = None, mode: str = "sample",
               boundaries: Tensor | None = None) -> ScoreOutput:
    out = model(batch.ids, noise=noise, mode=mode, boundaries=boundaries)
    nll = per_position_ce(out.logits, batch.targets)
    correct = out.logits.argmax(-1) == batch.targets
    inner = None
    if out.inner is not None:
        inner = inner_boundary_bytes(out.inner, out.chunks, batch.ids.shape[1])
    return ScoreOutput(nll=nll, boundaries=out.boundary.b, probs=out.boundary.probs, correct=correct,
                       inner_boundaries=inner)


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
