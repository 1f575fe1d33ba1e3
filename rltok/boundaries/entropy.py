"""``entropy``: BLT's entropy patching (Pagnoni et al. 2024, "Byte Latent Transformer"), a
rule-based chunker driven by a small byte LM trained before the U-Net (issue 39).

The entropy model is a flat byte Transformer (``rltok.model.flat_lm.ByteLM``, ``boundary.em_*``
sizes, a sliding window of ``em_window`` bytes). ``setup`` trains it on the run's training split
(the first ``em_train_bytes`` of the same documents the BPE of ``bpe`` guidance is fitted on),
then calibrates the threshold so that the rate on held-out training documents is r*, and
stores both in RUN/entropy_model.safetensors + RUN/entropy_model.json (sizes, training bytes and
FLOPs, achieved rate). Its weights are frozen and travel inside the U-Net's own weights, so a
checkpoint or a shared model needs nothing else.

With e_t = H(p_e(. | x_<t)) the entropy, in nats, of the entropy model's prediction of byte t
(e_0 = 0 at BOS), the two rules of BLT's patcher (``bytelatent/data/patcher.py``):

* ``rule=global``:    b_t = [e_t > theta]                (BLT's global threshold)
* ``rule=monotonic``: b_t = [e_t - e_{t-1} > theta]      (BLT's approximate monotonicity)

BLT starts a new patch at such a byte t. This library marks the byte whose vector a chunk is
taken at, and follows the paper's "left shift" for prescribed boundaries (BPE guidance: the
boundary sits on the first byte of the next token): b_t = 1 at the byte that starts BLT's patch.
b_t depends on x_<t only, so the rule is causal; decoding runs the entropy model from its own
key/value caches, one byte at a time, and agrees with ``forward`` position by position.

``threshold`` is the router's rate knob (``rate_knob``: a higher threshold, fewer boundaries), so
evaluation can calibrate it to r* on each domain as it does hnet's threshold. The entropy model
runs forward only on every byte, in training and at inference: its FLOPs per byte (a third of
a training pass) are added to the U-Net's (``flops.unet_flops``); its own training is a one-time
cost, written in RUN/entropy_model.json (``train_flops``).

Not tried here: the U-Net's own early-exit head as the entropy model. It would cost nothing
extra, but its entropies move while the U-Net trains (dynamic pooling's authors answered the same
question, their issue #2, with a fixed small LM, as BLT does).
"""

from __future__ import annotations

import json
import math
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor
from tqdm import tqdm

from ..bpe import fit_docs
from ..errors import RltokError
from ..model.flat_lm import ByteLM
from ..flops import flat_flops
from ..model.layers import KVCache
from ..model.chunking import forced_mask
from ..model.unet import ByteUNet
from ..objectives import per_position_ce
from ..registry import MethodSpec, register
from ..schema import BOS, N_INPUT_IDS, N_OUTPUT_IDS, PAD, BoundaryConfig, RunConfig
from .base import BoundaryModule, BoundaryOutput, BoundaryStep
from .fixed import _rule_output, _rule_step

WEIGHTS = "entropy_model.safetensors"
INFO = "entropy_model.json"
RULES = ("global", "monotonic")
# where setup measures the rate it calibrates the threshold to: the U-Net's first training rows
# (the mix its batches are drawn from), or the held-out documents (up to format 13: 23 documents,
# 212 kB, of the multilingual T = 2 mix gave 0.200 there and 0.28-0.30 on training rows)
CALIBRATE_ON = ("train_rows", "heldout")


@dataclass
class EntropyConfig(BoundaryConfig):
    rule: str = "global"  # global: e_t > threshold; monotonic: e_t - e_{t-1} > threshold
    threshold: float = 2.0  # nats; set by setup when calibrate is true
    calibrate: bool = True  # setup moves the threshold until the rate on calibrate_on is target_rate
    calibrate_on: str = "train_rows"  # CALIBRATE_ON: train_rows (em_calibration_rows of them) or heldout
    em_calibration_rows: int = 1024  # the first training rows (of model.seq_len) the threshold is set on
    entropy_model: str = ""  # a run directory (or its entropy_model.safetensors) to reuse, not train
    # the entropy model ("em"): a small flat byte Transformer with a sliding window
    em_d_model: int = 96
    em_layers: int = 2
    em_heads: int = 4
    em_mlp: int = 256
    em_window: int = 128
    em_train_bytes: int = 2_000_000  # bytes it trains on (one pass, windows of em_seq_len)
    em_seq_len: int = 256
    em_batch: int = 16
    em_lr: float = 3e-3
    em_holdout_bytes: int = 200_000  # held-out training bytes: its loss and the threshold's rate

    def validate(self) -> None:
        super().validate()
        if self.rule not in RULES:
            raise RltokError(f"boundary.rule={self.rule!r} must be one of {', '.join(RULES)}")
        if self.calibrate_on not in CALIBRATE_ON:
            raise RltokError(f"boundary.calibrate_on={self.calibrate_on!r} must be one of {', '.join(CALIBRATE_ON)}")
        for k in ("em_d_model", "em_layers", "em_heads", "em_mlp", "em_window", "em_train_bytes",
                  "em_seq_len", "em_batch", "em_holdout_bytes", "em_calibration_rows"):
            if getattr(self, k) < 1:
                raise RltokError(f"boundary.{k}={getattr(self, k)} must be >= 1")
        if self.em_d_model % self.em_heads or (self.em_d_model // self.em_heads) % 2:
            raise RltokError(f"boundary.em_d_model={self.em_d_model} must split into em_heads="
                             f"{self.em_heads} heads of an even size")
        if not 0 < self.em_lr < 1:
            raise RltokError(f"boundary.em_lr={self.em_lr} must be in (0, 1)")


def build_entropy_model(cfg: EntropyConfig, rope_theta: float = 10000.0, norm_eps: float = 1e-6) -> ByteLM:
    return ByteLM(N_INPUT_IDS, N_OUTPUT_IDS, cfg.em_d_model, cfg.em_heads, cfg.em_layers, cfg.em_mlp,
                  cfg.em_window, rope_theta, norm_eps)


def next_byte_entropy(logits: Tensor) -> Tensor:
    """(..., V) logits -> (...) entropy in nats, float32."""
    logp = F.log_softmax(logits.float(), dim=-1)
    return -(logp.exp() * logp).sum(-1)


def byte_entropies(em: ByteLM, ids: Tensor) -> Tensor:
    """e (B, S): e[:, t] = H(p_e(. | ids[:, :t])), the entropy of the entropy model's prediction
    of position t; e[:, 0] = 0 (nothing predicts the first position)."""
    with torch.no_grad():
        H = next_byte_entropy(em(ids))
    return F.pad(H[:, :-1], (1, 0))


def rule_decisions(e: Tensor, e_prev: Tensor, rule: str, threshold: Tensor | float) -> Tensor:
    """The rule (module docstring) from e_t and e_{t-1}, any matching shapes."""
    return (e - e_prev if rule == "monotonic" else e) > threshold


def rule_boundaries(e: Tensor, rule: str, threshold: Tensor | float) -> Tensor:
    """The rule's b (B, S) from entropies e (B, S) (e_{-1} = 0)."""
    return rule_decisions(e, F.pad(e[:, :-1], (1, 0)), rule, threshold)


@dataclass
class EntropyState:
    """Decoding state of the entropy router, batch on the first axis of every tensor."""

    caches: list[KVCache]  # the entropy model's keys/values, one ring cache per layer
    next_entropy: Tensor  # (n,) e of the next byte: the entropy of the model's latest prediction
    last_entropy: Tensor  # (n,) e of the byte just consumed (the monotonic rule's e_{t-1})


class EntropyBoundaries(BoundaryModule):
    name = "entropy"

    def __init__(self, model_cfg, cfg: EntropyConfig, em: ByteLM | None = None):
        super().__init__(model_cfg, cfg)
        self.entropy_model = em if em is not None else build_entropy_model(cfg, model_cfg.rope_theta, model_cfg.norm_eps)
        self.entropy_model.requires_grad_(False)  # trained before the U-Net, frozen in it
        self.register_buffer("threshold", torch.tensor(float(cfg.threshold)))

    def rate_knob(self):
        lim = math.log(N_OUTPUT_IDS)  # entropies lie in [0, ln V]
        return self.threshold, -1.0, (-lim if self.cfg.rule == "monotonic" else 0.0), lim

    def forward_only_lms(self) -> list:
        return [self.entropy_model]

    def forward(self, h, ids, *, valid, noise=None, fixed=None, mode="sample") -> BoundaryOutput:
        e = byte_entropies(self.entropy_model, ids)
        b = rule_boundaries(e, self.cfg.rule, self.threshold) | (ids == BOS)
        out = _rule_output(b, valid, fixed)
        out.extras["byte_entropy"] = e
        return out

    def step(self, h, ids, state: EntropyState | None, *, pos, noise=None, fixed=None, mode="sample") -> BoundaryStep:
        em = self.entropy_model
        if state is None:
            zero = torch.zeros(ids.shape[0], device=ids.device)
            state = EntropyState(em.allocate_inference_cache(ids.shape[0], ids.device), zero, zero)
        e = torch.where(pos == 0, torch.zeros_like(state.next_entropy), state.next_entropy)
        b = rule_decisions(e, state.last_entropy, self.cfg.rule, self.threshold)
        with torch.no_grad():
            nxt = next_byte_entropy(em.decode_step(ids, pos, state.caches))
        return _rule_step(b | (ids == BOS), pos, fixed, state=EntropyState(state.caches, nxt, e))

    def decode_state(self, h, ids, out, lengths) -> EntropyState:
        """Read off one forward pass of the entropy model over the prefix (its keys/values)."""
        with torch.no_grad():
            logits, caches = self.entropy_model.decode_prefill(ids, lengths)
            H = next_byte_entropy(logits)
        last = (lengths - 1).clamp(min=0)[:, None]
        e = F.pad(H[:, :-1], (1, 0))
        return EntropyState(caches, H.gather(1, last)[:, 0], e.gather(1, last)[:, 0])


# -- setup: train the entropy model, calibrate the threshold -----------------------------------------

def _stream(docs: list[bytes]) -> np.ndarray:
    """The documents as one id stream, each after a BOS."""
    parts = []
    for d in docs:
        parts.append(np.array([BOS], dtype=np.int64))
        parts.append(np.frombuffer(d, dtype=np.uint8).astype(np.int64))
    return np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)


def _windows(stream: np.ndarray, length: int) -> Tensor:
    """Consecutive windows of length + 1 ids (input and target), the tail padded."""
    n = max(1, math.ceil((len(stream) - 1) / length))
    out = np.full((n, length + 1), PAD, dtype=np.int64)
    for i in range(n):
        w = stream[i * length: i * length + length + 1]
        out[i, : len(w)] = w
    return torch.from_numpy(out)


def train_entropy_model(cfg: EntropyConfig, train_docs: list[bytes], seed: int, progress: bool = True) -> tuple[ByteLM, dict]:
    """One pass over ``train_docs`` in windows of em_seq_len (AdamW, cosine decay); returns the
    model and its record (sizes, bytes, FLOPs)."""
    torch.manual_seed(seed)
    em = build_entropy_model(cfg)
    win = _windows(_stream(train_docs), cfg.em_seq_len)
    win = win[torch.randperm(len(win), generator=torch.Generator().manual_seed(seed))]
    steps = max(1, math.ceil(len(win) / cfg.em_batch))
    opt = torch.optim.AdamW(em.parameters(), lr=cfg.em_lr, weight_decay=0.1, betas=(0.9, 0.95))
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / max(1, steps // 20))
                                              * 0.5 * (1 + math.cos(math.pi * min(s, steps) / steps)))
    bar = tqdm(range(steps), desc="entropy model", disable=not progress, file=sys.stderr)
    loss = torch.tensor(float("nan"))
    for s in bar:
        batch = win[s * cfg.em_batch:(s + 1) * cfg.em_batch]
        targets = batch[:, 1:].clone()
        targets[targets == PAD] = -1
        ce = per_position_ce(em(batch[:, :-1]), targets)
        loss = ce.sum() / (targets >= 0).sum().clamp(min=1)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(em.parameters(), 1.0)
        opt.step()
        sched.step()
        if s % 20 == 0:
            bar.set_postfix(bpb=f"{loss.item() / math.log(2):.3f}")
    n_bytes = int((win[:, 1:] != PAD).sum())
    fl = flat_flops(em, cfg.em_seq_len)
    return em.eval(), {"params": sum(p.numel() for p in em.parameters()), "train_bytes": n_bytes,
                       "train_steps": steps, "train_flops": fl.per_byte * n_bytes,
                       "forward_flops_per_byte": fl.per_byte / 3, "final_train_bpb": loss.item() / math.log(2)}


def _row_entropies(em: ByteLM, ids: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """Entropies e, the valid mask and the forced mask of rows of ids as the U-Net sees them: BOS
    and the positions ``forward`` forces (each row's first and its last valid position), so the
    calibrated rate is the rate training runs at."""
    e = torch.cat([byte_entropies(em, ids[i:i + 32]) for i in range(0, len(ids), 32)])
    valid = ids != PAD
    return e, valid, (ids == BOS) | forced_mask(valid)


def _held_out_entropies(em: ByteLM, docs: list[bytes], seq_len: int) -> tuple[Tensor, Tensor, Tensor]:
    """:func:`_row_entropies` over held-out documents, in rows of ``seq_len``."""
    return _row_entropies(em, _windows(_stream(docs), seq_len)[:, :-1])


def _train_row_entropies(em: ByteLM, cfg: RunConfig, train_corpus, rows: int) -> tuple[Tensor, Tensor, Tensor]:
    """Entropies, valid and forced masks over the first ``rows`` rows the U-Net trains on (the
    training sampler's own order and packing), each row's first position forced as in training."""
    from ..data.loader import SequenceDataset

    ds = SequenceDataset(train_corpus, cfg.model.seq_len, cfg.train.seed, cfg.data.packing)
    return _row_entropies(em, ds.batch(np.arange(rows, dtype=np.int64)).ids)


def rule_rate(e: Tensor, valid: Tensor, forced: Tensor, rule: str, threshold: float) -> float:
    """The rule's rate at ``threshold`` over the valid positions, forced positions included."""
    b = (rule_boundaries(e, rule, threshold) | forced) & valid
    return float(b.sum()) / max(1, int(valid.sum()))


def calibrate_threshold(e: Tensor, valid: Tensor, forced: Tensor, rule: str, rate: float) -> tuple[float, float]:
    """The threshold whose rate (forced positions included) over the valid positions is closest
    to ``rate``, and that rate (bisection: the rate falls as the threshold rises)."""
    lim = math.log(N_OUTPUT_IDS)
    lo, hi = (-lim if rule == "monotonic" else 0.0), lim
    for _ in range(40):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if rule_rate(e, valid, forced, rule, mid) > rate else (lo, mid)
    t = (lo + hi) / 2
    return t, rule_rate(e, valid, forced, rule, t)


def _load_em(cfg: EntropyConfig, src: Path) -> tuple[ByteLM, dict]:
    from safetensors.torch import load_file
    path = src / WEIGHTS if src.is_dir() else src
    if not path.is_file():
        raise RltokError(f"boundary.entropy_model={cfg.entropy_model!r}: no {WEIGHTS} there")
    info_path = path.with_name(INFO)
    info = json.loads(info_path.read_text()) if info_path.is_file() else {}
    em = build_entropy_model(cfg)
    try:
        em.load_state_dict(load_file(str(path)))
    except RuntimeError as e:
        raise RltokError(f"{path}: its sizes are not boundary.em_* of this run ({str(e).splitlines()[0]})") from None
    return em.eval(), {**info, "source": str(path)}


def entropy_model_docs(bc: EntropyConfig, train_corpus) -> tuple[list[bytes], list[bytes]]:
    """(the documents the entropy model trains on, its held-out documents): the held-out ones are
    the last drawn (at least one, em_holdout_bytes), never trained on."""
    docs = fit_docs(train_corpus, bc.em_train_bytes + bc.em_holdout_bytes)
    held, total = [], 0
    while docs and total < bc.em_holdout_bytes and len(docs) > 1:
        held.append(docs.pop())
        total += len(held[-1])
    return docs, held or docs[-1:]


def _setup(cfg: RunConfig, train_corpus, run_dir: Path) -> None:
    from safetensors.torch import save_file
    bc: EntropyConfig = cfg.boundary
    docs, held = entropy_model_docs(bc, train_corpus)
    if bc.entropy_model:
        em, info = _load_em(bc, Path(bc.entropy_model).expanduser())
    else:
        em, info = train_entropy_model(bc, docs, cfg.train.seed)
    heldout = _held_out_entropies(em, held, cfg.model.seq_len)
    heldout_bpb = _held_out_bpb(em, held, bc.em_seq_len)
    on = heldout if bc.calibrate_on == "heldout" else _train_row_entropies(em, cfg, train_corpus, bc.em_calibration_rows)
    if bc.calibrate:
        bc.threshold, rate = calibrate_threshold(*on, bc.rule, bc.target_rate)
    else:
        rate = rule_rate(*on, bc.rule, bc.threshold)
    info.update(rule=bc.rule, threshold=bc.threshold, rate=rate, target_rate=bc.target_rate,
                heldout_docs=len(held), heldout_bytes=sum(len(d) for d in held), heldout_bpb=heldout_bpb,
                heldout_rate=rule_rate(*heldout, bc.rule, bc.threshold),
                rate_measured_on=("held-out training documents, rows of model.seq_len" if bc.calibrate_on == "heldout"
                                  else f"the first {bc.em_calibration_rows} training rows of model.seq_len"))
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    save_file({k: v.contiguous() for k, v in em.state_dict().items()}, str(run_dir / WEIGHTS))
    (run_dir / INFO).write_text(json.dumps(info, indent=2) + "\n")
    print(f"entropy: {info['params']:,}-parameter entropy model, held-out {heldout_bpb:.3f} bits/byte; "
          f"{bc.rule} threshold {bc.threshold:.4f} nats gives rate {rate:.4f} on {info['rate_measured_on']} "
          f"(target {bc.target_rate}; {info['heldout_rate']:.4f} on the held-out documents); "
          f"saved {run_dir / WEIGHTS}", file=sys.stderr)


def _held_out_bpb(em: ByteLM, docs: list[bytes], seq_len: int) -> float:
    win = _windows(_stream(docs), seq_len)
    tot, n = 0.0, 0
    with torch.no_grad():
        for i in range(0, len(win), 32):
            w = win[i:i + 32]
            t = w[:, 1:].clone()
            t[t == PAD] = -1
            tot += float(per_position_ce(em(w[:, :-1]), t).sum())
            n += int((t >= 0).sum())
    return tot / max(1, n) / math.log(2)


def _build(cfg: RunConfig, run_dir: Path | None = None):
    if cfg.model.stages != 1:
        raise RltokError(f"model.stages={cfg.model.stages}: method 'entropy' has one stage only")
    em = None
    if run_dir is not None and (Path(run_dir) / WEIGHTS).is_file():
        em, _ = _load_em(cfg.boundary, Path(run_dir))
    router = EntropyBoundaries(cfg.model, cfg.boundary, em)
    return ByteUNet(cfg.model, router, cfg.chunker, cfg.dechunker)


register(MethodSpec(
    name="entropy",
    config_cls=EntropyConfig,
    build=_build,
    setup=_setup,
    description="BLT's entropy patching: a boundary where a small byte LM's next-byte entropy exceeds a threshold",
    preset_overrides={"smoke": {"boundary.em_train_bytes": 60_000, "boundary.em_holdout_bytes": 20_000,
                                "boundary.em_d_model": 32, "boundary.em_heads": 2, "boundary.em_layers": 1,
                                "boundary.em_mlp": 64, "boundary.em_window": 32, "boundary.em_seq_len": 64}},
))
