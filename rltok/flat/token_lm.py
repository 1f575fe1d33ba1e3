"""``bpe-lm``: a standard Transformer LM over BPE tokens, at the U-Net's training FLOPs, scored
in bits per byte. The comparison the paper lacks: a tokenizer-first model trained on the same
bytes in the same order.

Tokenizer: as for ``bpe`` guidance (a byte-level BPE fitted on the training split to
``boundary.target_rate``, or ``flat.tokenizer``, or ``flat.vocab_size`` tokens), stored in
RUN/tokenizer.json. Width: the U-Net's d_model; depth
and MLP width are chosen at setup so that the training FLOPs per byte, counted by ``rltok.flops``
at the tokenizer's measured tokens-per-byte (vocabulary head included), equal the U-Net's at r*
(``size_bpe_lm``). The choice and the measured rate are written into the run's config.

From bytes to tokens (``to_tokens``). A batch row holds the id stream x_0..x_S (x_0 = ids[0],
x_{t+1} = targets[t]). It is split at BOS ids; every run of bytes is tokenized on its own; BOS is
a token of its own. The model reads tokens 0..n-2 and predicts tokens 1..n-1: the first token is
context only, as x_0 is for the byte models.

Bits per byte. The negative log-likelihood of each predicted token is summed and divided by the
bytes it covers (BOS, i.e. end of document, counts as one, as for the byte models). An evaluation
document is BOS + its first seq_len bytes, so all of its bytes are covered by predicted tokens
and the denominator is the same byte count as the byte models'. In the per-position output
(``score``) the token's NLL sits at the target position of its *last* byte and other positions
hold 0, so per-document sums are exact. The score is the probability of the canonical
tokenization of those bytes, a lower bound on the probability of the bytes (an upper bound on
their bits); a document truncated inside a word is tokenized as truncated. In training, a stream
window that starts inside a document leaves the bytes of its first token unscored.

``score`` also returns the token boundaries in the U-Net's convention (byte t ends a chunk iff a
token starts at t, and BOS), so the rate column of a comparison is this model's tokens per byte.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch import Tensor, nn

from ..bpe import encode_many, load_run_tokenizer, prepare_tokenizer
from ..errors import RltokError
from .reference import reference_unet_flops, reference_unet_head_flops, size_to_flops
from ..flops import FlopCount, flat_flops, mean_causal_keys, training_flops_per_byte
from ..objectives import LN2, ScoreOutput, StepLoss, boundary_counts, per_position_ce, score, training_loss
from ..registry import MethodSpec, register
from ..schema import BOS, PAD, BoundaryConfig, RunConfig
from .config import TokenLMConfig
from ..model.flat_lm import TokenLM

_PLACEHOLDER_VOCAB = 512  # vocabulary of an untrained model built without a tokenizer


def size_bpe_lm(cfg: RunConfig, vocab: int, token_rate: float) -> tuple[int, int]:
    """(layers, MLP width) with training FLOPs per byte equal to the reference U-Net's
    (``flat.match=flops``), or equal to them with each model's output head left out
    (``body_flops``: the token LM then spends its head's FLOPs on top)."""
    bc, d, S = cfg.flat, cfg.model.d_model, cfg.model.seq_len
    target = reference_unet_flops(cfg).per_byte / token_rate  # FLOPs per token
    if bc.match == "body_flops":
        target += 6 * d * (vocab + 1) - reference_unet_head_flops(cfg) / token_rate
    return size_to_flops(target, d, vocab + 1, mean_causal_keys(token_rate * S), bc.n_layers, bc.mlp_hidden)


def _vocab_and_rate(cfg: RunConfig, tok) -> tuple[int, float]:
    vocab = tok.get_vocab_size() if tok is not None else (cfg.flat.vocab_size or _PLACEHOLDER_VOCAB)
    return vocab, cfg.flat.token_rate or cfg.boundary.target_rate


def _build(cfg: RunConfig, run_dir: Path | None = None) -> nn.Module:
    tok = load_run_tokenizer(cfg.flat, run_dir)
    vocab, rate = _vocab_and_rate(cfg, tok)
    layers, hidden = size_bpe_lm(cfg, vocab, rate)
    m = cfg.model
    return TokenLM(vocab, m.d_model, m.n_heads, layers, hidden, rate, tok, m.rope_theta, m.norm_eps)


def _setup(cfg: RunConfig, train_corpus, run_dir: Path) -> None:
    info = prepare_tokenizer(cfg.flat, cfg.boundary.target_rate, train_corpus, run_dir, "bpe-lm")
    bc = cfg.flat
    bc.token_rate = float(info["rate"])
    bc.n_layers, bc.mlp_hidden = size_bpe_lm(cfg, int(info["vocab_size"]), bc.token_rate)
    with torch.device("meta"):
        model = _build(cfg, run_dir)
    ours, ref = flat_flops(model, cfg.model.seq_len, bc.token_rate).per_byte, reference_unet_flops(cfg).per_byte
    print(f"bpe-lm: {bc.n_layers} layers, MLP width {bc.mlp_hidden}: {ours / ref:.3f}x the U-Net's "
          f"training FLOPs per byte", file=sys.stderr)
    if bc.match == "body_flops":  # matched without the heads; the ratio above is what it spends
        head = 6 * cfg.model.d_model * model.head.out_features * bc.token_rate
        ours, ref = ours - head, ref - reference_unet_head_flops(cfg)
        print(f"bpe-lm: {ours / ref:.3f}x the U-Net's training FLOPs per byte without output heads "
              f"(flat.match=body_flops)", file=sys.stderr)
    if abs(ours / ref - 1) > 0.05:
        print(f"bpe-lm: warning: FLOPs could not be matched within 5% (the vocabulary head of "
              f"{info['vocab_size']:,} tokens costs too much at d_model={cfg.model.d_model})", file=sys.stderr)


# -- bytes -> tokens ------------------------------------------------------------------------------

@dataclass
class TokenBatch:
    inputs: Tensor  # (B, T) long token ids (PAD id after the end)
    targets: Tensor  # (B, T) long next token ids, -1 where none
    target_pos: Tensor  # (B, T) long: byte-space target index of the target token's last byte, -1 where none
    target_bytes: Tensor  # (B, T) long: bytes covered by the target token (BOS: 1)
    boundaries: Tensor  # (B, S) bool: token boundaries in input positions (U-Net convention)


def _stream(ids_row: np.ndarray, tgt_row: np.ndarray) -> np.ndarray:
    """x_0..x_n: the first input id, then the targets up to the first missing one."""
    miss = np.flatnonzero(tgt_row < 0)
    n = len(tgt_row) if len(miss) == 0 else int(miss[0])
    return np.concatenate([ids_row[:1], tgt_row[:n]])


def to_tokens(model: TokenLM, ids: Tensor, targets: Tensor) -> TokenBatch:
    if model.tokenizer is None:
        raise RltokError("bpe-lm: the model has no tokenizer (train the run with `rltok train "
                         "--method bpe-lm`, or set flat.tokenizer)")
    ids_np, tgt_np = ids.cpu().numpy(), targets.cpu().numpy()
    B, S = ids_np.shape
    streams = [_stream(ids_np[r], tgt_np[r]) for r in range(B)]
    # every run of bytes in every row, tokenized in one call
    runs: list[tuple[int, int, bytes]] = []
    for r, x in enumerate(streams):
        is_byte = x < 256
        t = 0
        while t < len(x):
            if not is_byte[t]:
                t += 1
                continue
            s = t
            while t < len(x) and is_byte[t]:
                t += 1
            runs.append((r, s, x[s:t].astype(np.uint8).tobytes()))
    encoded = encode_many(model.tokenizer, [r[2] for r in runs])
    per_row: list[list[tuple[int, int, int]]] = [[] for _ in range(B)]  # (first pos, last pos, id)
    for (r, s, _), (tids, lens) in zip(runs, encoded):
        off = s
        for tid, L in zip(tids, lens):
            per_row[r].append((off, off + L - 1, tid))
            off += L
    for r, x in enumerate(streams):
        for p in np.flatnonzero(x == BOS):
            per_row[r].append((int(p), int(p), model.bos_id))
        per_row[r].sort()
    T = max(1, max(len(toks) - 1 for toks in per_row))
    inputs = np.full((B, T), model.pad_id, dtype=np.int64)
    tgts = np.full((B, T), -1, dtype=np.int64)
    tpos = np.full((B, T), -1, dtype=np.int64)
    tbytes = np.zeros((B, T), dtype=np.int64)
    bnd = np.zeros((B, S), dtype=bool)
    for r, toks in enumerate(per_row):
        n = len(toks)
        if n == 0:
            continue
        first = np.array([t[0] for t in toks])
        last = np.array([t[1] for t in toks])
        tid = np.array([t[2] for t in toks])
        inputs[r, : n - 1] = tid[:-1]
        tgts[r, : n - 1] = tid[1:]
        tpos[r, : n - 1] = last[1:] - 1  # x position p is target index p - 1
        tbytes[r, : n - 1] = last[1:] - first[1:] + 1
        # boundaries: BOS positions, and token starts except the first token of each byte run
        is_bos = tid == model.bos_id
        run_first = np.zeros(n, dtype=bool)
        run_first[1:] = is_bos[:-1]
        run_first[0] = True
        b = (is_bos | ~run_first) & (first < S)
        bnd[r, first[b]] = True
    dev = ids.device
    return TokenBatch(*(torch.from_numpy(a).to(dev) for a in (inputs, tgts, tpos, tbytes, bnd)))


def _token_nll(model: TokenLM, fwd, tb: TokenBatch) -> Tensor:
    return per_position_ce(fwd(tb.inputs), tb.targets)


@training_loss.register
def bpe_lm_training_loss(model: TokenLM, batch, cfg, reduce_mean=None, all_reduce_sum=None, forward=None):
    tb = to_tokens(model, batch.ids, batch.targets)
    ce = _token_nll(model, forward or model, tb)
    has = tb.targets >= 0
    n_tok = has.sum().clamp(min=1)
    lm = ce.sum() / n_tok
    n_bytes = (tb.target_bytes * has).sum().clamp(min=1)
    valid = batch.ids != PAD
    counts = boundary_counts(batch.ids, tb.boundaries, valid)
    stats = {"lm_loss": lm.detach(), "bpb": ce.detach().sum() / (n_bytes * LN2),
             "tokens": has.sum(1).float().mean(), **{k: v.float() for k, v in counts.items()}}
    return StepLoss(loss=cfg.boundary.lm_weight * lm, stats=stats)


@score.register
@torch.no_grad()
def bpe_lm_score(model: TokenLM, batch, noise: Tensor | None = None, mode: str = "sample", boundaries=None):
    tb = to_tokens(model, batch.ids, batch.targets)
    ce = _token_nll(model, model, tb)
    has = tb.targets >= 0
    nll = torch.zeros(batch.ids.shape, dtype=torch.float32, device=batch.ids.device)
    nll.view(-1).index_add_(0, (tb.target_pos + torch.arange(nll.shape[0], device=nll.device)[:, None]
                                * nll.shape[1])[has], ce[has].float())
    return ScoreOutput(nll=nll, boundaries=tb.boundaries)


@training_flops_per_byte.register
def bpe_lm_flops(model: TokenLM, cfg: RunConfig, rate: float | None = None, inner_rate: float | None = None) -> FlopCount:
    """Per byte at ``rate`` tokens per byte (default: the tokenizer's measured rate)."""
    return flat_flops(model, cfg.model.seq_len, model.token_rate if rate is None else rate)


register(MethodSpec(
    name="bpe-lm",
    config_cls=BoundaryConfig,
    flat_cls=TokenLMConfig,
    build=_build,
    setup=_setup,
    description="Transformer LM over BPE tokens at the U-Net's training FLOPs, scored in bits per byte",
))
