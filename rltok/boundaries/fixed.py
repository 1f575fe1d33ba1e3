"""Boundaries that are not learned.

``uniform`` (the paper's "Uniform", spec 4.1): exactly round(r* * n) boundaries per sequence of n
bytes, at uniformly random positions (top-k of uniform noise), first and last forced, resampled on
every forward pass, evaluation included. It is not a fixed stride.

Causality: an exact count per sequence is not causal (whether byte t ends a chunk depends on how
many bytes the sequence has), so ``causal = False``. It never depends on the *content* of later
bytes, and in stream-packed training every row has seq_len bytes, so the count there is a
constant; `compare` uses this variant because it is the paper's Uniform (``ExactRandomGater``)
and holds the rate exactly. Decoding: ``step`` is a causal stand-in that draws each boundary as
Bernoulli(r*): the same rate, a different distribution from training
(``decode_matches_forward = False``). Teacher-forced decoding with given boundaries is exact.

``stride`` (hourglass / MEGABYTE style): a boundary every 1/r* positions of the sequence window.

``whitespace`` (SpaceByte's rule): a boundary at every "spacelike" byte that follows a
non-spacelike one; no learning, no rate control (the rate is whatever the text gives).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from ..schema import BOS, BoundaryConfig
from ..model.chunking import decided_mask, force_ends, forced_mask
from ..model.unet import unet_builder
from ..registry import MethodSpec, register
from .base import BoundaryModule, BoundaryOutput, BoundaryStep
from ..errors import RltokError
from ..text import whitespace_mask


def exact_count_boundaries(noise: Tensor, valid: Tensor, rate: float) -> Tensor:
    """b with exactly max(2, round(rate * n)) ones among the n valid positions of each row (at
    most n): the forced ends (position 0 and the row's last valid position) plus the largest
    noise values among its other valid positions. Everything is per row, so a document's
    boundaries do not depend on the padding it shares a batch with."""
    B, S = noise.shape
    forced = forced_mask(valid)
    n = valid.sum(1)
    k = torch.minimum(torch.round(rate * n.float()).long().clamp(min=2), n).clamp(min=1)
    score = torch.where(valid, noise.float(), torch.full_like(noise, -1.0, dtype=torch.float))
    score = torch.where(forced, torch.full_like(score, 2.0), score)
    ranked, _ = score.sort(dim=1, descending=True)
    thr = ranked.gather(1, (k - 1).clamp(max=S - 1)[:, None])
    return (score >= thr) & (valid | forced)


class UniformBoundaries(BoundaryModule):
    name = "uniform"
    stochastic = True
    # the exact count makes a prefix's boundaries depend on the sequence's length (not on its
    # later bytes): with the same noise, a 100-byte and a 200-byte document with a common prefix
    # are cut differently inside it. Stream-packed training rows all have length seq_len.
    causal = False
    decode_matches_forward = False  # decodes as Bernoulli(r*), see the module docstring

    def forward(self, h, ids, *, valid, noise=None, fixed=None, mode="sample") -> BoundaryOutput:
        B, S = ids.shape
        if fixed is not None:
            b = force_ends(fixed.bool(), valid)
        else:
            if noise is None:
                noise = torch.rand(B, S, device=ids.device)
            b = exact_count_boundaries(noise, valid, self.cfg.target_rate)
        decided = decided_mask(valid)
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


def _rule_output(b: Tensor, valid: Tensor, fixed: Tensor | None) -> BoundaryOutput:
    """BoundaryOutput for a deterministic rule: probability 1 where b is set, 0 elsewhere."""
    if fixed is not None:
        b = fixed.bool()
    b = force_ends(b, valid)
    decided = decided_mask(valid)
    return BoundaryOutput(hard=b.float(), decided=decided, probs=b.float())


def stride_boundaries(shape: tuple[int, int], rate: float, device=None) -> Tensor:
    """b[t] = 1 when floor(t * r) steps up, i.e. every 1/r positions counted from the window start
    (for r = 0.2: t = 5, 10, 15, ...; chunks {0}, {1..5}, {6..10}, ...). A non-integer period
    alternates between its floor and ceiling so the rate is exactly r over long windows."""
    B, S = shape
    t = torch.arange(S, device=device, dtype=torch.float64)
    eps = 1e-9  # guards against r * t landing just below an integer in floating point
    step = torch.floor(t * rate + eps) > torch.floor((t - 1) * rate + eps)
    step[0] = True
    return step[None, :].expand(B, S).clone()


@dataclass
class StrideConfig(BoundaryConfig):
    pass


def _rule_step(b: Tensor, pos: Tensor, fixed: Tensor | None, state=None) -> BoundaryStep:
    """A deterministic rule's decoding step: b, or the imposed decisions; position 0 forced."""
    if fixed is not None:
        b = fixed.bool()
    b = b | (pos == 0)
    return BoundaryStep(b=b, prob=b.float(), state=state)


class StrideBoundaries(BoundaryModule):
    name = "stride"

    def forward(self, h, ids, *, valid, noise=None, fixed=None, mode="sample") -> BoundaryOutput:
        return _rule_output(stride_boundaries(tuple(ids.shape), self.cfg.target_rate, ids.device),
                            valid, fixed)

    def step(self, h, ids, state, *, pos, noise=None, fixed=None, mode="sample") -> BoundaryStep:
        # stride_boundaries' rule at position t (its t - 1 term at t = 0 is the forced BOS)
        t = pos.double()
        r, eps = self.cfg.target_rate, 1e-9
        return _rule_step(torch.floor(t * r + eps) > torch.floor((t - 1) * r + eps), pos, fixed)


def spacelike(ids: Tensor) -> Tensor:
    """SpaceByte's "spacelike" bytes: everything except ASCII letters and digits and UTF-8
    continuation bytes (0x80-0xBF). A UTF-8 lead byte counts as spacelike, so in scripts written
    without spaces every multi-byte character ends a chunk at its lead byte."""
    digit = (ids >= 0x30) & (ids <= 0x39)
    upper = (ids >= 0x41) & (ids <= 0x5A)
    lower = (ids >= 0x61) & (ids <= 0x7A)
    cont = (ids >= 0x80) & (ids <= 0xBF)
    return ~(digit | upper | lower | cont)


def whitespace_boundaries(ids: Tensor, rule: str = "spacebyte") -> Tensor:
    """``spacebyte``: b[t] = 1 iff byte t is spacelike and byte t-1 is not (SpaceByte's
    ``use_global``), so a run like ", " gives one boundary, at its first byte; BOS is always a
    boundary. ``ascii``: b[t] = 1 at every ASCII whitespace byte (and BOS)."""
    if rule == "ascii":
        b = whitespace_mask(ids)
    else:
        sp = spacelike(ids)
        b = sp.clone()
        b[:, 1:] &= ~sp[:, :-1]
    return b | (ids == BOS)


@dataclass
class WhitespaceConfig(BoundaryConfig):
    rule: str = "spacebyte"  # spacebyte: SpaceByte's spacelike rule; ascii: every ASCII whitespace byte

    def validate(self) -> None:
        super().validate()
        if self.rule not in ("spacebyte", "ascii"):
            raise RltokError(f"boundary.rule={self.rule!r} must be spacebyte or ascii")


class WhitespaceBoundaries(BoundaryModule):
    name = "whitespace"

    def forward(self, h, ids, *, valid, noise=None, fixed=None, mode="sample") -> BoundaryOutput:
        return _rule_output(whitespace_boundaries(ids, self.cfg.rule), valid, fixed)

    def step(self, h, ids, state, *, pos, noise=None, fixed=None, mode="sample") -> BoundaryStep:
        """State: whether the previous byte was spacelike (the spacebyte rule looks one back)."""
        if self.cfg.rule == "ascii":
            return _rule_step(whitespace_mask(ids) | (ids == BOS), pos, fixed)
        sp = spacelike(ids)
        prev = torch.zeros_like(sp) if state is None else state
        return _rule_step((sp & ~prev) | (ids == BOS), pos, fixed, state=sp)


register(MethodSpec(
    name="stride",
    config_cls=StrideConfig,
    build=unet_builder(StrideBoundaries),
    description="a boundary every 1/r* bytes (hourglass / MEGABYTE fixed patches)",
))

register(MethodSpec(
    name="whitespace",
    config_cls=WhitespaceConfig,
    build=unet_builder(WhitespaceBoundaries),
    description="a boundary at each spacelike byte after a non-spacelike one (SpaceByte's rule)",
))
