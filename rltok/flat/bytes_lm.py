"""``bytes``: a flat byte-level Transformer, no hierarchy, at the U-Net's training FLOPs per byte
(``flat.match=flops``, the default) or at its parameter count (``flat.match=params``).

Every layer runs on every byte (full causal attention by default), so at equal parameters it
spends several times the U-Net's FLOPs per byte (2.1x at the tiny preset): the cost the hierarchy
saves; at equal FLOPs it has far fewer parameters. The width is the U-Net's d_model; the depth and
MLP width are chosen (``size_bytes_model``) so that the FLOPs per byte (or the parameters) equal
those of the U-Net of the same model config at its target rate (4d MLP layers, then the MLP width
adjusted to close the gap). The choice is written into the run's config at setup.
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch import Tensor, nn

from .reference import reference_unet_flops, reference_unet_params, size_to_flops
from ..flops import FlopCount, flat_flops, mean_causal_keys, solve_hidden, training_flops_per_byte
from ..objectives import LN2, ScoreOutput, StepLoss, per_position_ce, score, training_loss
from ..registry import MethodSpec, register
from ..schema import BoundaryConfig, N_INPUT_IDS, N_OUTPUT_IDS, RunConfig
from .config import BytesLMConfig
from ..model.flat_lm import ByteLM, flat_params


def size_bytes_model(cfg: RunConfig) -> tuple[int, int]:
    """(layers, MLP width) so the flat model has the reference U-Net's training FLOPs per byte
    (``match=flops``) or parameter count (``match=params``)."""

    bc, d = cfg.flat, cfg.model.d_model
    if bc.match == "flops":
        return size_to_flops(reference_unet_flops(cfg).per_byte, d, N_OUTPUT_IDS,
                             mean_causal_keys(cfg.model.seq_len, bc.window or None), bc.n_layers, bc.mlp_hidden)
    target = reference_unet_params(cfg)
    fixed = flat_params(N_INPUT_IDS, N_OUTPUT_IDS, d, 0, 0)
    per_layer_4d = flat_params(0, 0, d, 1, 4 * d)
    layers = bc.n_layers or max(1, round((target - fixed) / per_layer_4d))
    if bc.mlp_hidden:
        return layers, bc.mlp_hidden
    base = fixed + layers * flat_params(0, 0, d, 1, 0)
    return layers, solve_hidden(target, base, 3 * d * layers)


def _build(cfg: RunConfig, run_dir: Path | None = None) -> nn.Module:
    layers, hidden = size_bytes_model(cfg)
    m = cfg.model
    return ByteLM(N_INPUT_IDS, N_OUTPUT_IDS, m.d_model, m.n_heads, layers, hidden,
                  cfg.flat.window or None, m.rope_theta, m.norm_eps)


def _setup(cfg: RunConfig, train_corpus, run_dir: Path) -> None:
    cfg.flat.n_layers, cfg.flat.mlp_hidden = size_bytes_model(cfg)  # recorded in config.json


@training_loss.register
def bytes_training_loss(model: ByteLM, batch, cfg, reduce_mean=None, all_reduce_sum=None, forward=None):
    logits = (forward or model)(batch.ids)
    ce = per_position_ce(logits, batch.targets)
    n = (batch.targets >= 0).sum().clamp(min=1)
    lm = ce.sum() / n
    return StepLoss(loss=cfg.boundary.lm_weight * lm, stats={"lm_loss": lm.detach(), "bpb": lm.detach() / LN2})


@score.register
@torch.no_grad()
def bytes_score(model: ByteLM, batch, noise: Tensor | None = None, mode: str = "sample", boundaries=None):
    return ScoreOutput(nll=per_position_ce(model(batch.ids), batch.targets))


@training_flops_per_byte.register
def bytes_flops(model: ByteLM, cfg: RunConfig, rate: float | None = None, inner_rate: float | None = None) -> FlopCount:
    """Every layer on every byte: no rate enters (``rate`` is ignored)."""
    return flat_flops(model, cfg.model.seq_len)


register(MethodSpec(
    name="bytes",
    config_cls=BoundaryConfig,
    flat_cls=BytesLMConfig,
    build=_build,
    setup=_setup,
    description="flat byte-level Transformer, no hierarchy, at the U-Net's training FLOPs per byte (or parameters)",
))
