"""The one interface every boundary method implements, and the method registry.

A boundary method is a small ``nn.Module`` that, given the encoder output ``h`` (and the input
bytes, for rule-based methods), returns a :class:`BoundaryOutput`. It may override how bytes are
pooled into chunks (``downsample``) and how chunk outputs return to bytes (``upsample``), and it
supplies its auxiliary loss and statistics (``aux_loss``). The U-Net does not know which method it
runs; a method does not know the training loop.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, ClassVar

import torch
from torch import Tensor, nn

from ..config import BoundaryConfig, ModelConfig, RunConfig
from ..errors import RltokError
from ..model.chunking import Chunks, gather_up, select


@dataclass
class BoundaryOutput:
    """Boundaries of a batch, shapes (B, S).

    ``hard`` is 0/1 in the forward pass (b[t] = 1: byte t ends a chunk); straight-through methods
    let gradients flow through it. ``log_prob`` is log pi(b_t) of the decision actually taken
    (score-function methods), 0 where nothing was decided. ``decided`` marks positions where the
    method made a decision: not forced (first/last) and not padding.
    """

    hard: Tensor
    decided: Tensor
    probs: Tensor | None = None
    logits: Tensor | None = None
    log_prob: Tensor | None = None
    entropy: Tensor | None = None
    extras: dict[str, Tensor] = field(default_factory=dict)

    @property
    def b(self) -> Tensor:
        return self.hard.detach() > 0.5


@dataclass
class LossContext:
    """What a method's auxiliary loss may look at. Losses are per position, float32, nats."""

    out: BoundaryOutput
    ce: Tensor  # (B, S) cross-entropy of the final head; 0 where target_mask is False
    ce_early: Tensor  # (B, S) cross-entropy of the early-exit head
    target_mask: Tensor  # (B, S) bool: positions with a target
    valid: Tensor  # (B, S) bool: real input positions (not padding)
    reduce_mean: Callable[[Tensor], Tensor]  # mean of a detached tensor across data-parallel ranks
    all_reduce_sum: Callable[[Tensor], Tensor] | None = None  # sum across ranks (None: one process)


class BoundaryModule(nn.Module):
    """Base class: fixed boundaries from ``fixed`` only. Subclasses implement ``forward``."""

    name: ClassVar[str] = ""
    learned: ClassVar[bool] = False  # has parameters trained through the boundary decision
    stochastic: ClassVar[bool] = False  # boundaries are sampled (evaluation can average samples)
    causal: ClassVar[bool] = True  # b[t] depends only on bytes <= t (so it can decode)

    def __init__(self, model_cfg: ModelConfig, cfg: BoundaryConfig):
        super().__init__()
        self.model_cfg = model_cfg
        self.cfg = cfg

    def forward(self, h: Tensor, ids: Tensor, *, valid: Tensor, noise: Tensor | None = None,
                fixed: Tensor | None = None, mode: str = "sample") -> BoundaryOutput:
        raise NotImplementedError

    def downsample(self, h: Tensor, out: BoundaryOutput, chunks: Chunks) -> Tensor:
        return select(h, chunks)

    def upsample(self, h: Tensor, zhat: Tensor, out: BoundaryOutput, chunks: Chunks) -> Tensor:
        return h + gather_up(zhat, chunks)

    def aux_loss(self, ctx: LossContext) -> tuple[Tensor, dict[str, Tensor]]:
        return ctx.ce.new_zeros(()), {}


@dataclass
class MethodSpec:
    """A registered method: its config class, how to build its model, optional setup."""

    name: str
    config_cls: type[BoundaryConfig]
    build: Callable[[RunConfig, Path | None], nn.Module]
    description: str = ""
    # defaults per preset that only this method needs, e.g. {"tiny": {"boundary.x": 1}}
    preset_overrides: dict[str, dict[str, Any]] = field(default_factory=dict)
    # called once before training with (config, training corpus, run directory), e.g. to train
    # a tokenizer and store it in the run directory
    setup: Callable[..., None] | None = None


_METHODS: dict[str, MethodSpec] = {}


def register(spec: MethodSpec) -> MethodSpec:
    _METHODS[spec.name] = spec
    return spec


def get_method(name: str) -> MethodSpec:
    from . import _load_all

    _load_all()
    if name not in _METHODS:
        raise RltokError(f"unknown method {name!r}; choose one of: {', '.join(sorted(_METHODS))}")
    return _METHODS[name]


def method_names() -> list[str]:
    from . import _load_all

    _load_all()
    return list(_METHODS)


def unet_builder(module_cls: type[BoundaryModule]) -> Callable[[RunConfig, Path | None], nn.Module]:
    """The usual ``build``: a ByteUNet around a boundary module of this class."""

    def build(cfg: RunConfig, run_dir: Path | None = None) -> nn.Module:
        from ..model.unet import ByteUNet

        return ByteUNet(cfg.model, module_cls(cfg.model, cfg.boundary))

    return build


def bernoulli_log_prob(b: Tensor, logits: Tensor) -> Tensor:
    """log pi(b) for Bernoulli(sigmoid(logits)), stable."""
    return torch.where(b, torch.nn.functional.logsigmoid(logits),
                       torch.nn.functional.logsigmoid(-logits))


def bernoulli_entropy(logits: Tensor) -> Tensor:
    p = torch.sigmoid(logits)
    return -(p * torch.nn.functional.logsigmoid(logits) + (1 - p) * torch.nn.functional.logsigmoid(-logits))
