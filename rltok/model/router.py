"""The routing interface: what a stage asks of the part that decides where its chunks end
(a boundary method's router; the methods in ``rltok/boundaries/`` implement it).

A router is a small ``nn.Module`` that, given a stage's encoder output ``h`` (and the input bytes,
for rule-based methods at the byte level), returns a :class:`BoundaryOutput`; it declares the
chunker and dechunker it works with (``pools``, ``dechunk``: the stage builds them, model/dc.py)
and supplies its auxiliary loss and statistics (``aux_loss``). The stage does not know which
method it runs; a method does not know the training loop.

Incremental decoding asks a router one position at a time through :meth:`Router.step`. A method
whose boundaries depend only on the past implements it (a few lines for most methods); its
decoding state (``BoundaryStep.state``) is any nesting of tensors with the batch on the first
axis (or None), so the decoder can drop finished rows (:func:`select_rows`).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Callable, ClassVar

import torch
from torch import Tensor, nn

from ..schema import BoundaryConfig, ModelConfig

# a router's (or chunker's) decoding state: None, a tensor, or lists/tuples/dicts/dataclasses of
# them, the batch on every tensor's first axis (what map_states walks)
RouterState = Any


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
class BoundaryStep:
    """One decoding step of a boundary method, shapes (n,) over the rows being decoded."""

    b: Tensor  # bool: the byte just consumed ends a chunk
    prob: Tensor | None = None  # probability of a boundary, when the method has one
    log_prob: Tensor | None = None  # log pi(b) of the decision taken; 0 where forced
    state: Any = None  # the method's decoding state after this byte


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
    ids: Tensor | None = None  # (B, S) long: the input ids (documents start at BOS)
    # what the policy-gradient surrogate divides by; None: the positions with a target. A
    # two-stage U-Net's inner router divides by the byte targets, so that both routers' estimates
    # are of the gradient of the same per-byte loss
    n_targets: Tensor | None = None


class Router(nn.Module):
    """Base class of every boundary method's router. Subclasses implement ``forward`` (and
    ``step`` to decode from caches)."""

    name: ClassVar[str] = ""
    learned: ClassVar[bool] = False  # has parameters trained through the boundary decision
    stochastic: ClassVar[bool] = False  # boundaries are sampled (evaluation can average samples)
    # b[t] depends only on bytes <= t, not on later bytes nor on the sequence's length (the
    # causality tests check it, with documents of different lengths sharing a prefix)
    causal: ClassVar[bool] = True
    # step() draws from the same distribution as forward() (False: a causal stand-in, e.g. the
    # exact-count uniform, which is not causal, decodes as Bernoulli(r*)); teacher-forced
    # decoding is exact either way
    decode_matches_forward: ClassVar[bool] = True
    # the stage parts a method combines with its router (model/dc.py): the chunker.pool values it
    # supports (the first is its own), whether its mean pool carries the straight-through
    # gradient of the boundaries (Nawrot's), and its dechunker: add (AddLatest) or ema (EMASmooth)
    pools: ClassVar[tuple[str, ...]] = ("last",)
    straight_through_pool: ClassVar[bool] = False
    dechunk: ClassVar[str] = "add"

    def __init__(self, model_cfg: ModelConfig, cfg: BoundaryConfig):
        super().__init__()
        self.model_cfg = model_cfg
        self.cfg = cfg

    def forward(self, h: Tensor, ids: Tensor, *, valid: Tensor, noise: Tensor | None = None,
                fixed: Tensor | None = None, mode: str = "sample") -> BoundaryOutput:
        raise NotImplementedError

    def adjust_chunks(self, z: Tensor) -> Tensor:
        """The chunk vectors as the main network receives them, from the chunker's (identity;
        a rate-conditioned policy adds its rate embedding)."""
        return z

    def rate_knob(self) -> tuple[Tensor, float, float, float] | None:
        """The 0-d buffer that sets this router's rate, for calibrating the rate at evaluation
        (``evaluate.calibrate_rate``): (buffer, +1 if a larger value gives more boundaries else -1,
        lowest, highest value). None: the router has none."""
        return None

    def forward_only_lms(self) -> list[nn.Module]:
        """Flat language models this router runs forward only on every byte, frozen (entropy
        patching's entropy model): the FLOP count adds a third of their training FLOPs per byte
        and leaves their weights out of the training pass."""
        return []

    def decodable(self) -> bool:
        """Whether this instance decodes from caches (``can_decode``)."""
        return type(self).can_decode()

    def aux_loss(self, ctx: LossContext) -> tuple[Tensor, dict[str, Tensor]]:
        return ctx.ce.new_zeros(()), {}

    # -- incremental decoding (rltok.generate) ---------------------------------------------------
    def step(self, h: Tensor, ids: Tensor, state: Any, *, pos: Tensor, noise: Tensor | None = None,
             fixed: Tensor | None = None, mode: str = "sample") -> BoundaryStep:
        """Decide whether the byte just consumed ends a chunk, from its encoder output ``h``
        (n, d), its id ``ids`` (n,), its position ``pos`` (n,) and the method's ``state`` after
        the previous byte (None before position 0). Position 0 (BOS) is a forced boundary. There
        is no forced boundary at the end: while decoding there is no last position. ``noise``
        (n,) are the uniforms that ``forward`` would read at these positions; ``fixed`` (n,)
        imposes the decisions (teacher forcing) and still advances the state. Must agree with
        ``forward`` position by position (the parity tests check it)."""
        raise NotImplementedError(f"boundary method {self.name!r} cannot decode byte by byte")

    def decode_state(self, h: Tensor, ids: Tensor, out: BoundaryOutput, lengths: Tensor) -> Any:
        """The decoding state after the first ``lengths[r]`` positions of row r, given the full
        forward pass over them (h (B, S, d), ids, its BoundaryOutput). The default replays
        :meth:`step` with the forward pass's decisions; override it when the state can be read
        off directly."""
        state = None
        b = out.b
        for t in range(int(lengths.max().item())):
            pos = torch.full_like(lengths, t)
            st = self.step(h[:, t], ids[:, t], state, pos=pos, fixed=b[:, t])
            state = where_rows(t < lengths, st.state, state)
        return state

    @classmethod
    def can_decode(cls) -> bool:
        """True when the method implements :meth:`step` (its parts always have theirs), so
        ``rltok.generate`` can decode it from caches."""
        if cls.step is Router.step:
            return False
        # a non-causal method decodes only through a declared causal stand-in (uniform)
        return cls.causal or not cls.decode_matches_forward


def map_states(fn: Callable[..., Tensor], state: Any, *others: Any) -> Any:
    """``fn`` applied to each tensor of a nested state (None, tensors, lists, tuples, dicts,
    dataclasses) and the tensors at the same place in ``others`` (states of the same structure);
    every other leaf of ``state`` is kept as it is."""
    if isinstance(state, Tensor):
        return fn(state, *others)
    if isinstance(state, (list, tuple)):
        return type(state)(map_states(fn, *xs) for xs in zip(state, *others))
    if isinstance(state, dict):
        return {k: map_states(fn, v, *(o[k] for o in others)) for k, v in state.items()}
    if dataclasses.is_dataclass(state):
        return dataclasses.replace(state, **{f.name: map_states(fn, getattr(state, f.name),
                                                                *(getattr(o, f.name) for o in others))
                                             for f in dataclasses.fields(state)})
    return state


def select_rows(state: Any, rows: Tensor) -> Any:
    """Index the batch (first) axis of every tensor in a nested state."""
    return map_states(lambda x: x[rows], state)


def assign_rows(state: Any, rows: Tensor, new: Any) -> Any:
    """``state`` with the batch rows ``rows`` (n,) replaced by ``new`` (a nested state of n rows,
    as :func:`select_rows` returns)."""
    if new is None:
        return state
    placed = []

    def put(x: Tensor, n: Tensor | None) -> Tensor:
        if n is None:
            return x
        placed.append(n)
        return x.index_copy(0, rows, n.to(x.dtype))

    out = map_states(put, state, new)
    given = []
    map_states(given.append, new)
    if len(placed) != len(given):  # a tensor of ``new`` where ``state`` has None would be dropped
        raise ValueError("assign_rows: rows for a part of the state that does not exist (None)")
    return out


def where_rows(mask: Tensor, new: Any, old: Any) -> Any:
    """``new`` on the rows where ``mask`` (B,) is True, ``old`` elsewhere, for nested states."""
    if old is None or new is None:
        return new
    return map_states(lambda n, o: n if o is None else torch.where(mask.view(-1, *([1] * (n.dim() - 1))), n, o),
                      new, old)


def bernoulli_log_prob(b: Tensor, logits: Tensor) -> Tensor:
    """log pi(b) for Bernoulli(sigmoid(logits)), stable."""
    return torch.where(b, torch.nn.functional.logsigmoid(logits),
                       torch.nn.functional.logsigmoid(-logits))


def bernoulli_entropy(logits: Tensor) -> Tensor:
    p = torch.sigmoid(logits)
    return -(p * torch.nn.functional.logsigmoid(logits) + (1 - p) * torch.nn.functional.logsigmoid(-logits))
