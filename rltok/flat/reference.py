"""The U-Net that the flat baselines are sized against: ``bytes`` matches its parameters (or its
training FLOPs per byte), ``bpe-lm`` its training FLOPs per byte. Here, beside the baselines,
because it builds a model: ``rltok.flops`` counts FLOPs of any model and builds none."""

from __future__ import annotations

import dataclasses

import torch
from torch import nn

from ..boundaries.fixed import UniformBoundaries
from ..flops import ATTN_FLOPS_PER_KEY_DIM, FlopCount, solve_hidden, unet_flops
from ..model.unet import ByteUNet
from ..schema import BoundaryConfig, RunConfig


def reference_unet(cfg: RunConfig) -> nn.Module:
    """The U-Net of this model config with parameter-free boundaries, on the meta device (no
    memory): the reference that ``bytes`` matches in parameters and ``bpe-lm`` in FLOPs."""
    with torch.device("meta"):  # one stage: the reference is the paper's U-Net at any depth asked
        router = UniformBoundaries(cfg.model, BoundaryConfig(target_rate=cfg.boundary.target_rate))
        return ByteUNet(dataclasses.replace(cfg.model, stages=1), router)


def reference_unet_flops(cfg: RunConfig) -> FlopCount:
    return unet_flops(reference_unet(cfg), cfg, cfg.boundary.target_rate)


def reference_unet_head_flops(cfg: RunConfig) -> float:
    """Training FLOPs per byte of the reference U-Net's output heads (applied at every byte, twice:
    the early exit and the prediction), part of ``reference_unet_flops``."""
    m = reference_unet(cfg)
    heads = [m.head, m.head] if m.cfg.shared_head else [m.head, m.early_head]
    return 6.0 * sum(p.numel() for h in heads for p in h.parameters() if p.dim() >= 2)


def reference_unet_params(cfg: RunConfig) -> int:
    return sum(p.numel() for p in reference_unet(cfg).parameters())


def size_to_flops(target: float, d: int, head_outputs: int, keys: float, n_layers: int = 0,
                  mlp_hidden: int = 0) -> tuple[int, int]:
    """(layers, MLP width) of a flat Transformer of width ``d`` whose training FLOPs per position
    are ``target``: 6 x its matmul parameters (4 d^2 attention and 3 d h GeGLU MLP per layer, the
    d x ``head_outputs`` head) plus attention over ``keys`` keys per layer. ``n_layers`` /
    ``mlp_hidden`` (flat.*; 0: solve) fix either."""
    head = 6 * d * head_outputs
    attn = ATTN_FLOPS_PER_KEY_DIM * d * keys
    per_layer_4d = 6 * (4 * d * d + 3 * d * 4 * d) + attn
    layers = n_layers or max(1, round((target - head) / per_layer_4d))
    if mlp_hidden:
        return layers, mlp_hidden
    return layers, solve_hidden(target, head + layers * (6 * 4 * d * d + attn), 6 * 3 * d * layers)
