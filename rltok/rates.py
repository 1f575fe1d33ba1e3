"""Rate conditioning: one model, many boundary rates (the authors' ``DownsampleRateEmbedding``
with their random-uniform and random-choice rate schedulers).

``boundary.rate_schedule`` (rl) says which rate each optimizer step trains at:

    ""                     fixed at boundary.target_rate (the paper's runs; no conditioning)
    uniform:LO:HI          a rate drawn uniformly from [LO, HI] per optimizer step
    choice:R1:R2[:R3...]   one of the listed rates per optimizer step
    ...@N                  the first N training bytes at boundary.target_rate (e.g. uniform:0.1:0.3@1M)
    linear:R0[@N]          a curriculum, not conditioning: the rate moves linearly from R0 to
                           boundary.target_rate over the first N bytes (default: the whole run),
                           then stays there; the model runs at target_rate afterwards

The draw is a function of (train.seed, step), so every rank, every micro-batch of the step and a
resumed run see the same rate. A rate-conditioned policy adds a learned embedding of the
requested rate to its input and to the chunk vectors, uses logit(rate) as its prior and steers
its rate penalty toward the requested rate. At inference the rate is chosen with
``requested_rate(model, r)`` (``rltok eval --rate``, ``rltok generate --rate``, ``rate=`` in the
Python API); without it a conditioned model runs at boundary.target_rate.

Torch-free (config validation parses schedules).
"""

from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass

from .errors import RltokError


@dataclass(frozen=True)
class RateSchedule:
    kind: str  # fixed, uniform, choice or linear
    values: tuple[float, ...]  # fixed: (r*,); uniform: (lo, hi); choice: the rates
    fixed_bytes: int = 0  # the first fixed_bytes train at the target rate
    target: float = 0.2

    @property
    def conditioned(self) -> bool:
        """The model is conditioned on the rate (it can run at any trained rate)."""
        return self.kind in ("uniform", "choice")

    @property
    def varies(self) -> bool:
        """Training steps ask for different rates."""
        return self.kind != "fixed"

    @property
    def lo(self) -> float:
        return min(self.values + (self.target,) if self.fixed_bytes else self.values)

    @property
    def hi(self) -> float:
        return max(self.values + (self.target,) if self.fixed_bytes else self.values)

    def at(self, step: int, bytes_seen: int, seed: int, total_bytes: int = 0) -> float:
        """The rate optimizer step ``step`` trains at (``total_bytes``: the run's, for a
        curriculum over the whole run)."""
        if self.kind == "linear":
            span = self.fixed_bytes or total_bytes
            frac = min(1.0, bytes_seen / span) if span > 0 else 1.0
            return float(self.values[0] + frac * (self.target - self.values[0]))
        if self.kind == "fixed" or bytes_seen < self.fixed_bytes:
            return self.target
        import numpy as np

        rng = np.random.default_rng([seed, 19, step])
        if self.kind == "uniform":
            return float(rng.uniform(self.values[0], self.values[1]))
        return float(self.values[int(rng.integers(len(self.values)))])

    def check(self, rate: float, where: str = "--rate") -> float:
        """``rate`` if this schedule trained for it, else one line saying why not."""
        if not (isinstance(rate, (int, float)) and 0.0 < rate < 1.0 and math.isfinite(rate)):
            raise RltokError(f"{where} {rate}: a rate must be in (0, 1)")
        if not self.conditioned:
            raise RltokError(f"{where} {rate}: this model was trained at the fixed rate {self.target} "
                             f"(no boundary.rate_schedule); train with e.g. "
                             f"--set boundary.rate_schedule=uniform:0.1:0.3 to choose the rate at inference")
        tol = 1e-9
        if self.kind == "choice" and not any(abs(rate - v) < 1e-6 for v in self.values + (self.target,)):
            raise RltokError(f"{where} {rate}: this model was trained at the rates "
                             f"{', '.join(map(str, sorted(set(self.values + (self.target,)))))} only")
        if not (self.lo - tol <= rate <= self.hi + tol):
            raise RltokError(f"{where} {rate}: outside the rates this model was trained at "
                             f"[{self.lo}, {self.hi}]")
        return float(rate)


def parse_schedule(spec: str, target: float) -> RateSchedule:
    """A schedule from its string (module docstring); one line naming what does not parse."""
    key = "boundary.rate_schedule"
    s = (spec or "").strip()
    if not s:
        return RateSchedule("fixed", (target,), 0, target)
    body, _, fixed = s.partition("@")
    fixed_bytes = 0
    if fixed:
        try:
            fixed_bytes = _size(fixed)
        except ValueError:
            raise RltokError(f"{key}={spec!r}: '@{fixed}' is not a byte count (e.g. @1M)") from None
    kind, _, rest = body.partition(":")
    try:
        values = tuple(float(x) for x in rest.split(":")) if rest else ()
    except ValueError:
        raise RltokError(f"{key}={spec!r}: the rates must be numbers (uniform:LO:HI or choice:R1:R2:...)") from None
    if kind not in ("uniform", "choice", "linear"):
        raise RltokError(f"{key}={spec!r}: must be uniform:LO:HI, choice:R1:R2[:...] or linear:R0, "
                         f"optionally @BYTES")
    if kind == "linear" and len(values) != 1:
        raise RltokError(f"{key}={spec!r}: linear needs one starting rate (linear:0.3 moves from 0.3 "
                         f"to boundary.target_rate)")
    if any(not (0.0 < v < 1.0) for v in values):
        raise RltokError(f"{key}={spec!r}: every rate must be in (0, 1)")
    if kind == "uniform" and (len(values) != 2 or values[0] >= values[1]):
        raise RltokError(f"{key}={spec!r}: uniform needs two rates LO < HI (uniform:0.1:0.3)")
    if kind == "choice" and len(values) < 2:
        raise RltokError(f"{key}={spec!r}: choice needs at least two rates (choice:0.1:0.2:0.3)")
    return RateSchedule(kind, values, fixed_bytes, target)


def _size(text: str) -> int:
    t = text.strip().upper()
    mult = {"K": 10**3, "M": 10**6, "G": 10**9}.get(t[-1:], 1)
    v = float(t[:-1] if t[-1:] in "KMG" else t)
    if v < 0 or not math.isfinite(v):
        raise ValueError(text)
    return int(v * mult)


def _boundary_module(model):
    inner = getattr(model, "module", model)  # DDP / FSDP wrappers
    return getattr(inner, "boundary", None)


def schedule_of(model) -> RateSchedule | None:
    """The rate schedule a model was trained with (None for methods without one)."""
    b = _boundary_module(model)
    return getattr(b, "rate_schedule", None)


def check_rate(model, rate: float, where: str = "--rate") -> float:
    """``rate`` if ``model`` was trained to run at it, else one line saying why not."""
    sched = schedule_of(model)
    if sched is None:
        raise RltokError(f"{where} {rate}: this method has no rate to choose")
    return sched.check(rate, where)


@contextlib.contextmanager
def requested_rate(model, rate: float | None, where: str = "--rate", check: bool = True):
    """Run ``model`` at ``rate`` inside the block (None: its default). Refuses, in one line, a
    rate the model was not trained for (``check=False``: training, whose schedule chose it)."""
    if rate is None:
        yield model
        return
    if check:
        check_rate(model, rate, where)
    b = _boundary_module(model)
    before = b.requested
    b.requested = float(rate)
    try:
        yield model
    finally:
        b.requested = before


@contextlib.contextmanager
def off_policy(model, bytes_seen: int):
    """The off-policy warm start (the authors' ``warm_start_steps``): while ``bytes_seen`` is
    below ``boundary.warm_start_bytes``, the policy's training boundaries are drawn from
    Bernoulli(rate) instead of from the policy, which learns from them with clipped importance
    ratios (``BoundaryPolicy.aux_loss``). A no-op for methods without the option."""
    b = _boundary_module(model)
    n = getattr(getattr(b, "cfg", None), "warm_start_bytes", 0)
    if not n or bytes_seen >= n:
        yield model
        return
    b.behaviour = True
    try:
        yield model
    finally:
        b.behaviour = False
