"""``rl``: the learned boundary policy trained with the score-function estimator (spec 2-3).

Policy logit at byte t, from the encoder output h_t and, for w > 1, its own last w-1 decisions:

    V_t = W h_t + beta                                       (Linear(d, w))
    l_t = softcap( s * (V_t[w-1] + sum_{j=1}^{w-1} V_t[w-1-j] * b_{t-j}) + logit(r*) )
    b_t ~ Bernoulli(sigmoid(l_t));  b_0 = b_{S-1} = 1 (forced, log-prob 0)

For w = 1 every position is an independent Bernoulli given h and is sampled in parallel. For
w > 1 sampling is a scan over time under no_grad; the logits are then recomputed differentiably
from the sampled decisions (teacher forcing), which gives log pi(b_t | h, b_<t).

Decoding (``step``): the same logit for one byte at a time; the state is the last w-1 decisions
(None for w = 1), b_{t-w+1} .. b_{t-1}, with b_{<0} = 0 and b_0 = 1 as in ``forward``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from ..schema import BOS, BoundaryConfig, ModelConfig
from ..errors import RltokError
from ..syncs import accelerator_path
from .. import estimator as est
from ..model.chunking import decided_mask, force_ends
from ..model.unet import ByteUNet, unet_builder
from ..registry import MethodSpec, register
from .base import BoundaryModule, BoundaryOutput, BoundaryStep, LossContext, bernoulli_entropy, bernoulli_log_prob
from ..flops import unet_flops
from ..text import whitespace_mask
from ..rates import parse_schedule


@dataclass
class PolicyConfig(BoundaryConfig):
    lm_weight: float = 0.9
    early_weight: float = 0.1
    window: int = 1  # w: condition on the policy's own last w-1 decisions (paper runs: 8)
    scale: float = 1.0  # s: logit scale (paper: 1/16; 1 learns far faster at small scale)
    softcap: float = 6.0  # l -> c * tanh(l / c); 0 disables
    cap_at_eval: bool = True  # keep the soft cap in eval mode (the reference code is ambiguous)
    detach_input: bool = False  # True: policy gradients do not reach the encoder
    gamma: float = 0.99  # discount of the reward-to-go; 1 = undiscounted
    reward: str = "early_exit"  # early_exit: CE_early - CE; neg_ce: -CE
    baseline: str = "batch_mean"  # batch_mean (paper), leave_one_out (unbiased), none
    baseline_group: int = 0  # sequences sharing a baseline; 0 = the whole micro-batch
    baseline_scope: str = "local"  # local: per rank (the paper); global: summed over ranks
    pg_weight: float = 0.01  # weight of the policy-gradient surrogate
    rate_weight: float = 0.01  # weight of the rate penalty ("consistency loss")
    # logit_shift (the paper); hinge: the same controller, acting only above target_rate (a rate
    # ceiling, FLEXITOKENS-style); hnet: H-Net's ratio loss
    rate_loss: str = "logit_shift"
    # batch: one rate controller over the batch (the paper); document: one per document, so each
    # document is held at the target rate (equal compression everywhere; issue 16); content: one
    # per document, each asked for boundaries in proportion to its information under the model
    # (its summed cross-entropy, detached), with the one constant that gives r* on the batch
    rate_scope: str = "batch"
    # > 0: the policy pays flop_price nats per byte per unit of training FLOPs per byte relative to
    # those at target_rate (the model's FLOP curve), where flop_price_in says: reward (each decided
    # boundary costs flop_price x its marginal relative FLOPs in its REINFORCE return, so a
    # boundary is kept where it lowers the loss by more than it costs) or loss (the relative FLOPs
    # at the expected rate added to the loss, differentiable; format <= 10 runs: this one)
    flop_price: float = 0.0
    flop_price_in: str = "reward"
    # boundaries given, not decided, at these bytes ("", "newline", "whitespace"): forced to 1
    # and left out of the estimator (the authors' prescribed boundaries)
    prescribed: str = ""
    # the first N training bytes draw boundaries from Bernoulli(rate) and learn from them with
    # importance ratios pi/pi_off clipped at is_clip (the authors' off-policy warm start)
    warm_start_bytes: int = 0
    is_clip: float = 5.0
    return_block: int = 64  # block length of the blocked reward-to-go
    # multiplies the policy head's default (PyTorch) initialisation; 0 starts every byte at
    # exactly p = r*, with no initial preference for any byte
    init_scale: float = 1.0
    # "" (fixed at target_rate) or a schedule of rates to train at, e.g. uniform:0.1:0.3 (rltok/rates.py)
    rate_schedule: str = ""
    # model.stages=2: the inner router's r*, boundaries per outer chunk (0.5: about two outer
    # chunks, i.e. two words at r* = 0.2, per inner chunk)
    inner_target_rate: float = 0.5
    # model.stages=2: the inner router's reward baseline. skip: the same prediction with the inner
    # stage skipped (a forward-only pass of the byte decoder); early: the outer early exit (free,
    # noisier: it also carries the outer stage's gain)
    inner_baseline: str = "skip"
    # > 0: rltok's integral rate controller (not the paper's): after every training micro-batch the
    # logit offset c moves by -gain * (F - r*), F the achieved boundary fraction (as H-Net's
    # rate_control=threshold); holds the training rate at r* where the penalty alone drifts
    rate_integral_gain: float = 0.0
    # with the controller: the rate penalty sees the network's own rate (its logits less the
    # controller's offset), so the network keeps carrying r* and the offset only trims what is
    # left. Without it the penalty sees the held rate (~r*, no restoring force), the policy
    # gradient moves the network's logits freely and the offset follows them without bound
    # (v2 study: -3 to -5 at 8 MB, -9.5 to -17.3 at 32 MB, toward the clamp at -20). Off by
    # default so that older runs, which lack the key, train as they did.
    rate_antiwindup: bool = False
    # K >= 2, a rate-conditioned policy (rate_schedule uniform/choice) with the controller: the
    # controller's offset is a function of the requested rate, piecewise linear through K knots
    # spread evenly over the schedule's range; each step moves the knots around the rate it drew
    # (issue 38). 0: one offset for every rate (a conditioned model then runs between its request
    # and the rate it prefers)
    rate_offset_knots: int = 0

    def validate(self) -> None:
        super().validate()

        parse_schedule(self.rate_schedule, self.target_rate)
        if self.window < 1:
            raise RltokError(f"boundary.window={self.window} must be >= 1")
        if not (0.0 < self.gamma <= 1.0):
            raise RltokError(f"boundary.gamma={self.gamma} must be in (0, 1]")
        if self.scale <= 0:
            raise RltokError(f"boundary.scale={self.scale} must be > 0")
        if self.softcap < 0:
            raise RltokError(f"boundary.softcap={self.softcap} must be >= 0")
        if self.reward not in est.REWARDS:
            raise RltokError(f"boundary.reward={self.reward!r} must be one of {est.REWARDS}")
        if self.baseline not in est.BASELINES:
            raise RltokError(f"boundary.baseline={self.baseline!r} must be one of {est.BASELINES}")
        if self.baseline_scope not in ("local", "global"):
            raise RltokError(f"boundary.baseline_scope={self.baseline_scope!r} must be local or global")
        if self.baseline_group < 0:
            raise RltokError("boundary.baseline_group must be >= 0")
        if self.rate_loss not in ("logit_shift", "hinge", "hnet"):
            raise RltokError(f"boundary.rate_loss={self.rate_loss!r} must be logit_shift, hinge or hnet")
        if self.rate_scope not in ("batch", "document", "content"):
            raise RltokError(f"boundary.rate_scope={self.rate_scope!r} must be batch, document or content")
        if self.rate_scope != "batch" and self.rate_loss == "hnet":
            raise RltokError(f"boundary.rate_scope={self.rate_scope} needs boundary.rate_loss=logit_shift or hinge")
        if not (0.0 <= self.flop_price < 1e6):
            raise RltokError(f"boundary.flop_price={self.flop_price} must be >= 0")
        if self.flop_price_in not in ("reward", "loss"):
            raise RltokError(f"boundary.flop_price_in={self.flop_price_in!r} must be reward or loss")
        if self.prescribed not in ("", "newline", "whitespace"):
            raise RltokError(f"boundary.prescribed={self.prescribed!r} must be '', newline or whitespace")
        if self.warm_start_bytes < 0:
            raise RltokError(f"boundary.warm_start_bytes={self.warm_start_bytes} must be >= 0")
        if not (self.is_clip >= 1.0):
            raise RltokError(f"boundary.is_clip={self.is_clip} must be >= 1")
        if self.pg_weight < 0 or self.rate_weight < 0:
            raise RltokError("boundary.pg_weight and boundary.rate_weight must be >= 0")
        if not (0.0 <= self.init_scale < 1e6):
            raise RltokError(f"boundary.init_scale={self.init_scale} must be >= 0")
        if self.return_block < 1:
            raise RltokError("boundary.return_block must be >= 1")
        if not 0.0 <= self.rate_integral_gain < 100:
            raise RltokError(f"boundary.rate_integral_gain={self.rate_integral_gain} must be in [0, 100)")
        if self.rate_offset_knots:
            sched = parse_schedule(self.rate_schedule, self.target_rate)
            if self.rate_offset_knots < 2 or not sched.conditioned or self.rate_integral_gain <= 0:
                raise RltokError(f"boundary.rate_offset_knots={self.rate_offset_knots}: needs >= 2 knots, a "
                                 "conditioned boundary.rate_schedule (uniform: or choice:) and "
                                 "boundary.rate_integral_gain > 0")
        if self.inner_baseline not in ("skip", "early"):
            raise RltokError(f"boundary.inner_baseline={self.inner_baseline!r} must be skip or early")
        if not 0.0 < self.inner_target_rate < 1.0:
            raise RltokError(f"boundary.inner_target_rate={self.inner_target_rate} must be in (0, 1)")


def scan_decisions(d: Tensor) -> Tensor:
    """Run the decision automaton given every step's decision for every history.

    ``d`` (B, S, n) bool, n = 2^(w-1): ``d[:, t, s]`` is the decision at t if the previous w-1
    decisions are the bits of s (bit k = b_{t-w+1+k}, so the newest is the top bit). The history
    evolves as s -> (s >> 1) | (b_t << (w-2)); it starts at 0. Each step is a map on the n
    histories; the history before every t is a prefix composition of these maps, computed by
    doubling (Hillis-Steele) in ceil(log2 S) gathers of (B, S, n) instead of S sequential steps.
    Returns b (B, S) bool.
    """
    B, S, n = d.shape
    top = n.bit_length() - 2  # w - 2
    s = torch.arange(n, device=d.device)
    nxt = (s >> 1)[None, None, :] | (d.long() << top) if n > 1 else d.long() * 0  # (B, S, n)
    # after the scan P[:, t, s] = history after step t when the history before step 0 is s
    P = nxt
    k = 1
    while k < S:
        P = torch.cat([P[:, :k], torch.gather(P[:, k:], 2, P[:, :-k])], dim=1)
        k *= 2
    before = torch.cat([torch.zeros(B, 1, dtype=torch.long, device=d.device), P[:, :-1, 0]], dim=1)
    return torch.gather(d, 2, before[..., None])[..., 0]


class BoundaryPolicy(BoundaryModule):
    name = "rl"
    learned = True
    stochastic = True
    # chunker.pool=mean: the authors' AverageTokenDownsampler under RL
    pools = ("last", "mean")

    def __init__(self, model_cfg: ModelConfig, cfg: PolicyConfig):
        super().__init__(model_cfg, cfg)
        self.proj = nn.Linear(model_cfg.d_model, cfg.window)
        if cfg.init_scale != 1.0:
            with torch.no_grad():
                self.proj.weight.mul_(cfg.init_scale)
                self.proj.bias.mul_(cfg.init_scale)

        self.rate_schedule = parse_schedule(cfg.rate_schedule, cfg.target_rate)
        self.requested: float | None = None  # set by rates.requested_rate; None = target_rate
        self.behaviour = False  # set by rates.off_policy: draw training boundaries from Bernoulli(rate)
        self.flop_curve: tuple[float, float, float] | None = None  # FLOPs/byte = a + b r + c r^2 (flop_price)
        if self.rate_schedule.conditioned:
            # the requested rate's embedding, added to the policy's input and the chunk vectors;
            # zero-initialised so the model starts as the unconditioned one
            self.rate_embed = nn.Linear(2, model_cfg.d_model)
            nn.init.zeros_(self.rate_embed.weight)
            nn.init.zeros_(self.rate_embed.bias)
        # the logit offset: the integral controller (rate_integral_gain > 0) moves it in training
        # and it is saved with the weights; evaluate.calibrate_rate sets it at evaluation for any
        # rl policy. Without the controller it stays 0 in training and is not saved, so
        # penalty-only weights keep the tensor names they always had
        self.register_buffer("rate_offset", torch.zeros(()), persistent=cfg.rate_integral_gain > 0)
        if cfg.rate_offset_knots:
            # the controller's offset as a function of the requested rate (rate_offset stays the
            # evaluation's calibration trim, 0 in training)
            self.register_buffer("rate_offset_curve", torch.zeros(cfg.rate_offset_knots))

    @property
    def rate(self) -> float:
        """The rate the policy runs at: the requested one, else boundary.target_rate."""
        return self.cfg.target_rate if self.requested is None else self.requested

    def rate_knob(self):
        # the logit offset (moved in training only by the integral controller; fixed at evaluation)
        return self.rate_offset, 1.0, -20.0, 20.0

    @property
    def prior_logit(self) -> float:
        r = self.rate
        return math.log(r / (1 - r))

    def _knot_weights(self) -> list[tuple[int, float]]:
        """(knot, weight) pairs that interpolate the offset curve at the requested rate (clamped
        to the schedule's range; weights sum to 1)."""
        K = self.cfg.rate_offset_knots
        lo, hi = self.rate_schedule.lo, self.rate_schedule.hi
        x = min(max((self.rate - lo) / (hi - lo), 0.0), 1.0) * (K - 1) if hi > lo else 0.0
        k = min(int(x), K - 2)
        return [(k, 1.0 - (x - k)), (k + 1, x - k)]

    def controller_offset(self) -> Tensor:
        """The logit offset the controller and the calibration add: the trim ``rate_offset``, plus
        the curve's value at the requested rate where the offset is a function of the rate."""
        if not self.cfg.rate_offset_knots:
            return self.rate_offset
        (k0, w0), (k1, w1) = self._knot_weights()
        return self.rate_offset + w0 * self.rate_offset_curve[k0] + w1 * self.rate_offset_curve[k1]

    @property
    def bias0(self) -> Tensor:
        """The logit every byte starts from: logit(rate) plus the logit offset, a 0-d tensor
        (reading the buffer as a float would wait on an accelerator)."""
        return self.controller_offset() + self.prior_logit

    def _rate_vector(self, like: Tensor) -> Tensor | None:
        """E(r) (d,), or None for an unconditioned policy. Features: logit(r) relative to the
        target's, and 1."""
        if not self.rate_schedule.conditioned:
            return None
        t = self.cfg.target_rate
        # filled on the device (a tensor made from host data would be a blocking copy to a GPU)
        f = torch.stack([like.new_full((), self.prior_logit - math.log(t / (1 - t))), like.new_ones(())])
        return self.rate_embed(f).to(like.dtype)

    def _given(self, ids: Tensor) -> Tensor | None:
        """Where boundaries are prescribed (``boundary.prescribed``): bool, the shape of ids; None
        when none are."""
        p = self.cfg.prescribed
        if p == "newline":
            return ids == 10
        if p == "whitespace":
            return whitespace_mask(ids)
        return None

    def _conditioned(self, h: Tensor) -> Tensor:
        e = self._rate_vector(h)
        return h if e is None else h + e

    def adjust_chunks(self, z: Tensor) -> Tensor:
        return self._conditioned(z)

    # -- logits ------------------------------------------------------------------------------
    def _cap(self, x: Tensor) -> Tensor:
        c = self.cfg.softcap
        if c > 0 and (self.training or self.cfg.cap_at_eval):
            return c * torch.tanh(x / c)
        return x

    def _uncap(self, logit: Tensor) -> Tensor:
        """The inverse of ``_cap`` (saturated logits clamped just inside the cap)."""
        c = self.cfg.softcap
        if c > 0 and (self.training or self.cfg.cap_at_eval):
            return c * torch.atanh((logit.float() / c).clamp(-1 + 1e-6, 1 - 1e-6))
        return logit.float()

    def _network_probs(self, logits: Tensor) -> Tensor:
        """Boundary probabilities without the controller's offset: what the network's own
        logits give (rate_antiwindup). No gradient: the penalty's gradient is on the logits."""
        with torch.no_grad():
            return torch.sigmoid(self._cap(self._uncap(logits) - self.controller_offset()))

    def _logits(self, V: Tensor, b: Tensor | None) -> Tensor:
        """Teacher-forced logits (B, S) from V (B, S, w) and decisions b (B, S)."""
        w = V.shape[-1]
        a = V[..., w - 1]
        if w > 1:
            hist = torch.nn.functional.pad(b.float(), (w - 1, 0))[:, :-1]  # b_{t-1} at t
            win = hist.unfold(1, w - 1, 1)  # (B, S, w-1): win[..., k] = b_{t-w+1+k}
            a = a + (V[..., : w - 1] * win).sum(-1)
        return self._cap(self.cfg.scale * a + self.bias0)

    def _scan(self, V: Tensor, u: Tensor | None, valid: Tensor, greedy: bool, given: Tensor | None = None) -> Tensor:
        """Sampling for w > 1. The two versions give the same decisions; on an accelerator the
        parallel one replaces S tiny sequential steps (S x ~10 kernel launches) by ~3 log2(S)
        large ones; on a CPU, which has no width to spend, the sequential one is cheaper
        (measured at B=8, S=4096, w=8 on 2 cores: 0.6 s sequential, 2.0 s parallel)."""
        if not accelerator_path(V.device):
            return self._scan_sequential(V, u, valid, greedy, given)
        return self._scan_parallel(V, u, valid, greedy, given)

    @torch.no_grad()
    def _scan_parallel(self, V: Tensor, u: Tensor | None, valid: Tensor, greedy: bool, given: Tensor | None = None) -> Tensor:
        """Sampling for w > 1 in O(log S) parallel steps (see :func:`scan_decisions`)."""
        w = V.shape[-1]
        coef, bias = V[..., : w - 1], V[..., w - 1]
        B, S = bias.shape
        states = torch.arange(2 ** (w - 1), device=V.device)
        bits = ((states[:, None] >> torch.arange(w - 1, device=V.device)) & 1).to(V.dtype)  # (n, w-1)
        # the logit at every t for every possible history; the same arithmetic as the sequential scan
        hist = (coef[:, :, None, :] * bits).sum(-1)  # (B, S, n)
        lt = self._cap(self.cfg.scale * (bias[..., None] + hist) + self.bias0)
        if greedy:
            d = lt > 0
        else:
            d = u[..., None] < torch.sigmoid(lt)
        d = d & valid[..., None]
        if given is not None:
            d = d | given[..., None]
        d[:, 0] = True
        d[:, S - 1] = True
        return scan_decisions(d)

    @torch.no_grad()
    def _scan_sequential(self, V: Tensor, u: Tensor | None, valid: Tensor, greedy: bool,
                         given: Tensor | None = None) -> Tensor:
        """Reference: sequential sampling for w > 1, each decision conditioned on the previous w-1
        (one step per byte; ``_scan_parallel`` must agree with it). The loop runs in numpy: its
        steps are a few operations on (B, w-1) arrays, where a torch op's dispatch costs several
        times the arithmetic (5.5x faster at B=16, S=512, w=8 on one CPU thread)."""
        import numpy as np

        B, S, w = V.shape
        Vn = V.detach().float().cpu().numpy()
        coef, bias = Vn[..., : w - 1], Vn[..., w - 1]
        scale, bias0 = np.float32(self.cfg.scale), np.float32(self.bias0)
        c = self.cfg.softcap
        cap = c > 0 and (self.training or self.cfg.cap_at_eval)
        c32 = np.float32(c)
        un = None if greedy else u.detach().float().cpu().numpy()
        vn = valid.cpu().numpy()
        gn = None if given is None else given.cpu().numpy()
        hist = np.zeros((B, S + w - 1), dtype=np.float32)  # hist[:, t + j] = b_{t-w+1+j}
        out = np.zeros((B, S), dtype=bool)
        np_err = np.seterr(over="ignore")  # exp(-lt) of an uncapped very negative logit: inf -> p = 0
        for t in range(S):
            if t == 0 or t == S - 1:
                bt = np.ones(B, dtype=bool)
            else:
                x = scale * (bias[:, t] + np.einsum("bj,bj->b", coef[:, t], hist[:, t:t + w - 1])) + bias0
                lt = c32 * np.tanh(x / c32) if cap else x
                bt = (lt > 0) if greedy else (un[:, t] < np.float32(1) / (np.float32(1) + np.exp(-lt)))
                bt = bt & vn[:, t]
                if gn is not None:
                    bt = bt | gn[:, t]
            out[:, t] = bt
            hist[:, t + w - 1] = bt
        np.seterr(**np_err)
        return torch.from_numpy(out).to(V.device)

    # -- forward -----------------------------------------------------------------------------
    def forward(self, h: Tensor, ids: Tensor, *, valid: Tensor, noise: Tensor | None = None,
                fixed: Tensor | None = None, mode: str = "sample") -> BoundaryOutput:
        x = self._conditioned(h.detach() if self.cfg.detach_input else h)
        V = self.proj(x).float()
        B, S, w = V.shape
        greedy = mode == "greedy"
        if fixed is None and not greedy and noise is None:
            noise = torch.rand(B, S, device=h.device)
        given = self._given(ids)
        if given is not None:
            given = given & valid
        if fixed is not None:
            b = fixed.bool()
        elif self.behaviour and self.training and not greedy:
            b = noise < self.rate  # the off-policy warm start's behaviour policy
        elif w == 1:
            l1 = self._logits(V, None)
            b = (l1 > 0) if greedy else (noise < torch.sigmoid(l1))
        else:
            b = self._scan(V.detach(), noise, valid, greedy, given)
        decided = decided_mask(valid)
        if given is not None:
            b, decided = b | given, decided & ~given
        b = force_ends(b, valid)
        logits = self._logits(V, b)
        probs = torch.sigmoid(logits)
        log_prob = bernoulli_log_prob(b, logits) * decided
        return BoundaryOutput(hard=b.float(), decided=decided, probs=probs, logits=logits,
                              log_prob=log_prob, entropy=bernoulli_entropy(logits))

    # -- incremental decoding ----------------------------------------------------------------
    def step(self, h: Tensor, ids: Tensor, state: Tensor | None, *, pos: Tensor,
             noise: Tensor | None = None, fixed: Tensor | None = None, mode: str = "sample") -> BoundaryStep:
        x = self._conditioned(h.detach() if self.cfg.detach_input else h)
        V = self.proj(x).float()  # (n, w)
        n, w = V.shape
        hist = state if state is not None else V.new_zeros(n, w - 1)  # b_{t-w+1} .. b_{t-1}
        a = V[:, w - 1] + (V[:, : w - 1] * hist).sum(-1)
        logit = self._cap(self.cfg.scale * a + self.bias0)
        if fixed is not None:
            b = fixed.bool()
        elif mode == "greedy":
            b = logit > 0
        else:
            u = noise if noise is not None else torch.rand(n, device=h.device)
            b = u < torch.sigmoid(logit)
        forced = pos == 0
        given = self._given(ids)
        if given is not None:
            forced = forced | given
        b = b | forced
        new_state = torch.cat([hist[:, 1:], b[:, None].float()], dim=1) if w > 1 else None
        return BoundaryStep(b=b, prob=torch.sigmoid(logit),
                            log_prob=bernoulli_log_prob(b, logit) * ~forced, state=new_state)

    def decode_state(self, h: Tensor, ids: Tensor, out: BoundaryOutput, lengths: Tensor) -> Tensor | None:
        w = self.cfg.window
        if w == 1:
            return None
        # decisions at positions L-w+1 .. L-1 of each row (zeros before position 0)
        b = torch.nn.functional.pad(out.b.float(), (w - 1, 0))
        idx = lengths[:, None] + torch.arange(w - 1, device=b.device)[None, :]  # padded index
        return b.gather(1, idx)

    # -- estimator ---------------------------------------------------------------------------
    def aux_loss(self, ctx: LossContext) -> tuple[Tensor, dict[str, Tensor]]:
        cfg, out = self.cfg, ctx.out
        mask = ctx.target_mask
        r = est.rewards(ctx.ce, ctx.ce_early, cfg.reward)
        reducer = ctx.all_reduce_sum if cfg.baseline_scope == "global" else None
        adv = est.batch_relative(r, mask, cfg.baseline, cfg.baseline_group, reducer)
        G = est.discounted_reward_to_go(adv, cfg.gamma, cfg.return_block)
        price = None
        if cfg.flop_price > 0 and cfg.flop_price_in == "reward":
            # each decided boundary's own cost, credited to that decision alone (a later boundary's
            # cost does not depend on an earlier decision), baseline-subtracted as the reward is
            price = cfg.flop_price * self.marginal_relative_flops(out.probs.detach()[ctx.valid].mean())
            cost = price * (out.hard.detach().float() * out.decided)
            G = G + est.batch_relative(-cost, mask, cfg.baseline, cfg.baseline_group, reducer)
        rho = None
        if self.behaviour:
            # off-policy warm start: weight each decision by pi(b) / pi_off(b), clipped
            rho = est.importance_ratio(out.log_prob, out.hard.bool(), self.rate, out.decided, cfg.is_clip)
            G = G * rho
        pg = est.policy_gradient_surrogate(G, out.log_prob, mask, ctx.n_targets)
        probs = out.probs
        if cfg.rate_integral_gain > 0 and cfg.rate_antiwindup:
            probs = self._network_probs(out.logits)
        if cfg.rate_loss in ("logit_shift", "hinge"):
            segments = est.document_segments(ctx.ids, BOS) if cfg.rate_scope != "batch" else None
            rate, pbar = est.rate_penalty(probs, out.logits, out.decided, ctx.valid,
                                          self.rate, ctx.reduce_mean, one_sided=cfg.rate_loss == "hinge",
                                          segments=segments, all_reduce_sum=ctx.all_reduce_sum,
                                          content=ctx.ce if cfg.rate_scope == "content" else None)
        else:
            v = ctx.valid.float()
            n = v.sum().clamp(min=1)
            pbar = (probs * out.decided + (v - out.decided.float())).sum() / n
            fbar = ctx.reduce_mean((out.hard.detach() * v).sum() / n)
            rate = est.ratio_loss(fbar, pbar, self.rate)
        dm = out.decided & mask
        adv_mean, adv_std = est.masked_mean_std(adv, dm)
        _, ret_std = est.masked_mean_std(G, dm)
        n_dec = dm.float().sum().clamp(min=1)
        stats = {
            "pg_loss": pg.detach(), "rate_loss": rate.detach(), "policy_rate": pbar.detach(),
            "reward_mean": (r * mask).sum().detach() / mask.float().sum().clamp(min=1),
            "adv_mean": adv_mean, "adv_std": adv_std, "return_std": ret_std,
            "logp_mean": (out.log_prob.detach() * dm).sum() / n_dec,
            "entropy": (out.entropy.detach() * dm).sum() / n_dec,
        }
        if self.rate_schedule.varies:
            stats["requested_rate"] = out.probs.new_tensor(self.rate)
        if cfg.rate_integral_gain > 0 and self.training:
            with torch.no_grad():
                v = ctx.valid.float()
                num, den = (out.hard.detach().float() * v).sum(), v.sum()
                if ctx.all_reduce_sum is not None:  # the rate over all ranks' positions
                    num, den = ctx.all_reduce_sum(num), ctx.all_reduce_sum(den)
                achieved = num / den.clamp(min=1)
                step = cfg.rate_integral_gain * (achieved - self.rate)
                if cfg.rate_offset_knots:  # the knots around the drawn rate, by their weights
                    for k, w in self._knot_weights():
                        self.rate_offset_curve[k].sub_(w * step).clamp_(-20.0, 20.0)
                else:
                    self.rate_offset.sub_(step).clamp_(-20.0, 20.0)
            stats["rate_offset"] = self.controller_offset().detach().clone()
        if rho is not None:
            stats["importance_ratio"] = (rho * dm).sum() / n_dec
        loss = cfg.pg_weight * pg + cfg.rate_weight * rate
        if cfg.flop_price > 0:
            cost = self.relative_flops(pbar)
            stats["relative_flops"] = cost.detach()
            if price is None:
                loss = loss + cfg.flop_price * cost
            else:
                stats["boundary_price"] = price.detach()
        return loss, stats

    def marginal_relative_flops(self, rate: Tensor) -> Tensor:
        """What one more boundary costs: d(FLOPs per byte)/d(rate) at ``rate`` over FLOPs per byte
        at target_rate. A sequence of S bytes with one more boundary runs at rate + 1/S, so its
        FLOPs grow by S x (b + 2 c rate) / S: this, in units of the FLOPs of one byte at r*."""
        if self.flop_curve is None:
            raise RltokError("boundary.flop_price needs the model's FLOP curve (build the model with "
                             "rltok.run.build_model)")
        a, b, c = self.flop_curve
        r0 = self.cfg.target_rate
        return (b + 2 * c * rate) / (a + b * r0 + c * r0 * r0)

    def relative_flops(self, rate: Tensor) -> Tensor:
        """Training FLOPs per byte at ``rate`` over those at target_rate (differentiable in rate),
        from the curve a + b r + c r^2 the model's FLOP count gives (``flops.unet_flops``)."""
        if self.flop_curve is None:
            raise RltokError("boundary.flop_price needs the model's FLOP curve (build the model with "
                             "rltok.run.build_model)")
        a, b, c = self.flop_curve
        r0 = self.cfg.target_rate
        return (a + b * rate + c * rate * rate) / (a + b * r0 + c * r0 * r0)


def build_policy_unet(cfg, run_dir=None):
    """The rl U-Net; with boundary.flop_price its policy gets the model's FLOPs-per-byte curve.
    With model.stages = N > 1 every level below the bytes has a policy of its own over the chunks
    of the level above (rltok/model/stage.py): the same estimator at r* = boundary.inner_target_rate."""
    if cfg.model.stages > 1:
        return _multi_stage_unet(cfg)
    model = unet_builder(BoundaryPolicy)(cfg, run_dir)
    if cfg.boundary.flop_price > 0:
        # exact: FLOPs/byte is quadratic in the rate (main-network attention over r S chunks)
        f0, f1, f2 = (unet_flops(model, cfg, r).per_byte for r in (0.0, 0.5, 1.0))
        c = 2 * (f2 - 2 * f1 + f0)
        model.boundary.flop_curve = (f0, f2 - f0 - c, c)
    return model


def _multi_stage_unet(cfg):
    import dataclasses

    bc = cfg.boundary
    unsupported = {"boundary.flop_price": 0.0, "boundary.prescribed": "", "boundary.warm_start_bytes": 0,
                   "boundary.rate_schedule": "", "boundary.rate_scope": "batch", "chunker.pool": ""}
    for key, default in unsupported.items():
        section, name = key.split(".")
        if getattr(getattr(cfg, section), name) != default:
            raise RltokError(f"model.stages={cfg.model.stages} does not support {key}="
                             f"{getattr(getattr(cfg, section), name)!r} (leave it at {default!r})")
    inner_cfg = dataclasses.replace(bc, target_rate=bc.inner_target_rate)
    return ByteUNet(cfg.model, lambda level: BoundaryPolicy(cfg.model, bc if level == 0 else inner_cfg),
                    cfg.chunker, cfg.dechunker)


register(MethodSpec(
    name="rl",
    config_cls=PolicyConfig,
    build=build_policy_unet,
    description="learned boundary policy trained with REINFORCE (the paper's method)",
    stages=8,  # any depth the sequence length supports (model.stages)
    # the paper's policy (w = 8, logit scale 1/16; spec 2.1) on the paper's sizes; the tiny preset
    # keeps the fast-learning defaults (w = 1, scale 1), see docs/methods.md "Fast-learning vs paper-faithful"
    # the tiny preset zero-initialises the policy head (every byte starts at p = r*): it found the
    # whitespace-aligned chunks in 4 of 5 seeds on English (the default seed among them)
    # (results/first-run/README.md)
    preset_overrides={"tiny": {"boundary.init_scale": 0.0},
                      **{name: {"boundary.window": 8, "boundary.scale": 0.0625}
                         for name in ("18M", "32M", "40M", "73M", "130M", "147M", "346M", "90M-code")}},
))
