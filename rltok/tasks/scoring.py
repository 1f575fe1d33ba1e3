"""Log-likelihood of continuations given contexts: the one scorer behind ``rltok tasks``, the
lm-eval adapter and the boundary analysis.

A request is (context, continuation). The model reads ``BOS + context + continuation`` (BOS only
when ``bos``; the rolling windows of a long text have none after the first), left-truncated to
the model's ``seq_len`` positions like lm-eval does (BOS is dropped first); the log-probabilities
of the continuation bytes are summed. Paper spec 6: context with BOS, continuation without.

Two choices make a request's score a function of the request alone, never of the batch it
shares or of the order requests come in:

* The last byte of the continuation is fed as an input too (its own prediction is ignored), so
  every scored prediction sits before the last input position. The U-Net forces a boundary at
  each row's last input position; that forced boundary would otherwise change the prediction of
  the last byte. Here every prediction uses boundaries the method decided.
* The random numbers behind sampled boundaries come from (seed, sample k, hash of BOS + context;
  of BOS + continuation when there is no context),
  laid over the untruncated sequence: choices of one question see the same uniforms on their
  shared context (common random numbers: their difference is not blurred by different
  segmentations of the context), and any two runs or tools see the same draws.

Requests are sorted by length (longest first) and batched; K samples are averaged in nats.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass
from typing import Sequence

import numpy as np
import torch
from torch import nn

from ..schema import BOS, PAD
from ..data.loader import Batch
from ..evaluate import model_width
from ..precision import autocast_for
from ..objectives import score as score_batch


@dataclass
class Request:
    context: bytes
    continuation: bytes
    bos: bool = True

    @property
    def tokens(self) -> list[int]:
        return ([BOS] if self.bos else []) + list(self.context) + list(self.continuation)


@dataclass
class RequestScore:
    nll: float  # nats summed over the scored continuation bytes (mean over boundary samples)
    n_bytes: int  # continuation bytes scored (all of them unless the continuation exceeds the window)
    greedy: float  # fraction of samples in which every scored byte was the model's argmax
    truncated: bool  # the context was left-truncated to fit the window
    # per scored byte, when details were requested (sample 0 for boundaries/probs)
    logprobs: np.ndarray | None = None
    boundaries: np.ndarray | None = None
    probs: np.ndarray | None = None
    inner_boundaries: np.ndarray | None = None  # two stages: the bytes that end an inner chunk

    @property
    def bits_per_byte(self) -> float:
        return self.nll / (self.n_bytes * math.log(2)) if self.n_bytes else float("nan")


def as_bytes(s: str | bytes) -> bytes:
    return s.encode("utf-8") if isinstance(s, str) else bytes(s)


def model_seq_len(model: nn.Module) -> int:
    cfg = getattr(model, "run_config", None)
    return cfg.model.seq_len if cfg is not None else model.cfg.seq_len


def request_noise(seed: int, sample: int, req: Request, length: int) -> np.ndarray:
    # A request without context is a document of its own (analysis pieces, the first window of a
    # rolling score): key it by its text, or every such document would see the same draws (and a
    # uniform method would cut them all at the same positions).
    own = req.context if req.context else b"\x02" + req.continuation
    h = hashlib.blake2b((b"\x01" if req.bos else b"\x00") + own, digest_size=8).digest()
    key = int.from_bytes(h, "little")
    return np.random.default_rng([seed, 17, sample, key]).random(length, dtype=np.float32)


@dataclass
class _Row:
    keep: list[int]  # the tokens fed (after left truncation)
    offset: int  # tokens dropped on the left
    first: int  # position whose output predicts the first scored byte
    n: int  # scored bytes


def _layout(req: Request, seq_len: int) -> _Row:
    toks = req.tokens
    keep = toks[-seq_len:]
    offset = len(toks) - len(keep)
    n_cont = len(req.continuation)
    # token j (>= 1) is predicted at position j - 1; the continuation is the last n_cont tokens
    first_tok = max(1, len(keep) - n_cont)
    return _Row(keep=keep, offset=offset, first=first_tok - 1, n=len(keep) - first_tok)


@torch.no_grad()
def score_requests(model: nn.Module, requests: Sequence[Request], *, samples: int = 1, seed: int = 0,
                   mode: str = "sample", batch_size: int = 16, dtype: str = "auto",
                   details: bool = False, progress: bool | str = False) -> list[RequestScore]:
    """Score requests (see the module docstring). ``mode``: ``sample`` boundaries (the paper's
    evaluation) or ``greedy`` (probability > 0.5; one pass). ``details`` keeps per-byte
    log-probabilities, boundaries and boundary probabilities of the continuation."""
    seq_len = model_seq_len(model)
    device = next(model.parameters()).device
    rows = [_layout(r, seq_len) for r in requests]
    order = sorted(range(len(requests)), key=lambda i: (-len(rows[i].keep), i))
    k_samples = 1 if mode == "greedy" else max(1, samples)
    nll = np.zeros(len(requests))
    greedy = np.zeros(len(requests))
    lp_out: list[np.ndarray | None] = [None] * len(requests)
    b_out: list[np.ndarray | None] = [None] * len(requests)
    p_out: list[np.ndarray | None] = [None] * len(requests)
    i_out: list[np.ndarray | None] = [None] * len(requests)
    batches = [order[i:i + batch_size] for i in range(0, len(order), batch_size)]
    it = batches
    if progress:
        from tqdm import tqdm

        it = tqdm(batches, desc=progress if isinstance(progress, str) else "score", unit="batch",
                  dynamic_ncols=True, leave=False)
    was = model.training
    model.eval()
    try:
        for idx in it:
            S = max(1, max(len(rows[i].keep) for i in idx))
            ids = torch.full((len(idx), S), PAD, dtype=torch.long)
            tgt = torch.full((len(idx), S), -1, dtype=torch.long)
            for r, i in enumerate(idx):
                row = rows[i]
                ids[r, :len(row.keep)] = torch.tensor(row.keep)
                if row.n:
                    tgt[r, row.first:row.first + row.n] = torch.tensor(row.keep[row.first + 1:row.first + 1 + row.n])
            batch = Batch(ids=ids, targets=tgt, noise=torch.zeros(len(idx), S),
                          index=torch.as_tensor(idx, dtype=torch.long)).to(device)
            for k in range(k_samples):
                noise = torch.zeros(len(idx), S)
                for r, i in enumerate(idx):
                    row, req = rows[i], requests[i]
                    full = request_noise(seed, k, req, row.offset + len(row.keep))
                    noise[r, :len(row.keep)] = torch.from_numpy(full[row.offset:])
                with autocast_for(device, dtype, model_width(model)):
                    out = score_batch(model, batch, noise=noise.to(device), mode=mode)
                tnll = out.nll.double().cpu()
                corr = out.correct.cpu() if out.correct is not None else None
                for r, i in enumerate(idx):
                    row = rows[i]
                    sl = slice(row.first, row.first + row.n)
                    nll[i] += float(tnll[r, sl].sum()) / k_samples
                    if corr is not None:
                        greedy[i] += float(bool(corr[r, sl].all())) / k_samples
                    if details and k == 0:
                        lp_out[i] = -out.nll[r, sl].float().cpu().numpy()
                        # the boundary of the byte fed at position p + 1, i.e. of each scored byte
                        bs = slice(row.first + 1, row.first + 1 + row.n)
                        if out.boundaries is not None:
                            b_out[i] = out.boundaries[r, bs].cpu().numpy().astype(bool)
                        if out.probs is not None:
                            p_out[i] = out.probs[r, bs].float().cpu().numpy()
                        if out.inner_boundaries is not None:
                            i_out[i] = out.inner_boundaries[r, bs].cpu().numpy().astype(bool)
    finally:
        model.train(was)
    return [RequestScore(nll=float(nll[i]), n_bytes=rows[i].n, greedy=float(greedy[i]),
                         truncated=rows[i].offset > 0, logprobs=lp_out[i], boundaries=b_out[i],
                         probs=p_out[i], inner_boundaries=i_out[i]) for i in range(len(requests))]


def rolling_requests(text: bytes, seq_len: int) -> list[Request]:
    """Disjoint windows that predict every byte of ``text`` exactly once with the longest context
    that fits (lm-eval's ``loglikelihood_rolling``): the first window is BOS + bytes, later ones
    are the preceding bytes (no BOS) followed by the bytes they score."""
    reqs: list[Request] = []
    n = len(text)
    first = min(n, seq_len - 1)
    reqs.append(Request(b"", text[:first], bos=True))
    s = first
    while s < n:
        e = min(n, s + seq_len - 1)
        # inputs: tokens of [BOS]+text at indices a .. e (seq_len of them); byte x_i is token i+1
        a = e + 1 - seq_len  # >= 1 here, so no BOS
        reqs.append(Request(text[a - 1:s], text[s:e], bos=False))
        s = e
    return reqs
