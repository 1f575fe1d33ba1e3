"""The Python API for notebooks: load a run, score texts, see boundaries.

    >>> import rltok
    >>> model = rltok.load("runs/tiny")
    >>> res = rltok.score(model, ["Hello world.", b"raw \\xff bytes"])
    >>> res.logprobs[0]        # log p(byte_i | bytes before it), nats, one per byte
    >>> res.boundaries[0]      # True where byte i ends a chunk
    >>> rltok.segment(model, "The city council met on Tuesday.")
    ['The ', 'city ', 'council ', 'met ', 'on ', 'Tuesday.']

Texts are scored as BOS + their bytes, truncated to the model's context (``seq_len`` bytes).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import numpy as np
import torch
from torch import nn

from .config import BOS, PAD
from .data.loader import Batch
from .evaluate import autocast_for, eval_noise
from .objectives import score as score_batch


def load(run: str | Path, device: str | torch.device = "cpu", checkpoint: str | None = None) -> nn.Module:
    """The model of a run directory (final weights, else its newest valid checkpoint), in eval
    mode, with ``.run_config`` attached."""
    from .run import load_model

    return load_model(run, device=device, checkpoint=checkpoint)


@dataclass
class Scored:
    texts: list[bytes]
    logprobs: list[np.ndarray]  # per byte: log p(byte_i | BOS, byte_<i), nats
    boundaries: list[np.ndarray] | None  # per byte: True if byte i ends a chunk
    probs: list[np.ndarray] | None  # per byte: the method's boundary probability, if it has one

    @property
    def bits_per_byte(self) -> list[float]:
        return [float(-lp.sum() / (len(lp) * math.log(2))) if len(lp) else float("nan") for lp in self.logprobs]


def _as_bytes(t: str | bytes) -> bytes:
    from .text import to_bytes

    return to_bytes(t)


def _batch(texts: list[bytes], seq_len: int) -> Batch:
    lens = [min(len(t), seq_len) for t in texts]
    S = max(1, max(lens))
    ids = torch.full((len(texts), S), PAD, dtype=torch.long)
    tgt = torch.full((len(texts), S), -1, dtype=torch.long)
    for r, (t, L) in enumerate(zip(texts, lens)):
        b = torch.tensor(list(t[:L]), dtype=torch.long)
        ids[r, 0] = BOS
        ids[r, 1:L] = b[: L - 1]
        tgt[r, :L] = b
    return Batch(ids=ids, targets=tgt, noise=torch.zeros(len(texts), S), index=torch.arange(len(texts)))


@torch.no_grad()
def score(model: nn.Module, texts: str | bytes | Sequence[str | bytes], *, mode: str = "sample",
          seed: int = 0, boundaries: Sequence[Sequence[int]] | None = None, dtype: str = "fp32") -> Scored:
    """Per-byte log-probabilities and the boundaries used, for a batch of texts.

    ``mode``: ``sample`` (boundaries drawn as in training, from ``seed``) or ``greedy``.
    ``boundaries``: optional 0/1 per byte to fix the boundaries (teacher forcing).
    """
    if isinstance(texts, (str, bytes)):
        texts = [texts]
    raw = [_as_bytes(t) for t in texts]
    seq_len = model.run_config.model.seq_len if hasattr(model, "run_config") else model.cfg.seq_len
    batch = _batch(raw, seq_len)
    device = next(model.parameters()).device
    batch = batch.to(device)
    fixed = None
    if boundaries is not None:
        fixed = torch.zeros(batch.ids.shape, dtype=torch.bool)
        for r, b in enumerate(boundaries):
            b = torch.as_tensor(list(b)[: batch.ids.shape[1] - 1], dtype=torch.bool)
            fixed[r, 1:1 + len(b)] = b  # position i+1 holds byte i
        fixed = fixed.to(device)
    noise = eval_noise(seed, 0, range(len(raw)), batch.ids.shape[1]).to(device)
    was = model.training
    model.eval()
    with autocast_for(device, dtype):
        out = score_batch(model, batch, noise=noise, mode=mode, boundaries=fixed)
    model.train(was)
    lps, bs, ps = [], [], []
    for r, t in enumerate(raw):
        L = min(len(t), seq_len)
        lps.append(-out.nll[r, :L].float().cpu().numpy())
        if out.boundaries is not None:
            # byte i sits at input position i + 1; the last byte of a truncated text is not an input
            b = out.boundaries[r, 1:L + 1].cpu().numpy()
            bs.append(np.concatenate([b, np.ones(L - len(b), dtype=bool)]) if len(b) < L else b)
        if out.probs is not None:
            p = out.probs[r, 1:L + 1].float().cpu().numpy()
            ps.append(np.concatenate([p, np.ones(L - len(p))]) if len(p) < L else p)
    return Scored(texts=raw, logprobs=lps, boundaries=bs if out.boundaries is not None else None,
                  probs=ps if out.probs is not None else None)


def chunks_of(data: bytes, boundaries: np.ndarray) -> list[bytes]:
    """Split bytes after every byte whose boundary is set."""
    out, start = [], 0
    for i, b in enumerate(boundaries[: len(data)]):
        if b:
            out.append(data[start:i + 1])
            start = i + 1
    if start < len(data):
        out.append(data[start:])
    return out


def segment(model: nn.Module, text: str | bytes, *, mode: str = "greedy", seed: int = 0) -> list:
    """The chunks ("tokens") a model draws on a text: bytes in, bytes out; str in, str out (a
    boundary inside a multi-byte character is shown at the end of that character)."""
    res = score(model, text, mode=mode, seed=seed)
    if res.boundaries is None:
        raise ValueError("this model has no chunk boundaries")
    data = res.texts[0][: len(res.boundaries[0])]
    pieces = chunks_of(data, res.boundaries[0])
    if isinstance(text, bytes):
        return pieces
    out, carry = [], b""
    for p in pieces:
        p = carry + p
        # hold back an incomplete trailing UTF-8 sequence so characters stay whole
        cut = len(p)
        for k in range(1, min(4, len(p)) + 1):
            c = p[-k]
            if c & 0xC0 != 0x80:  # lead byte (or ASCII)
                need = 1 if c < 0x80 else 2 if c >> 5 == 0b110 else 3 if c >> 4 == 0b1110 else 4 if c >> 3 == 0b11110 else 1
                if need > k:
                    cut = len(p) - k
                break
        carry = p[cut:]
        if cut:
            out.append(p[:cut].decode("utf-8", errors="replace"))
    if carry:
        out.append(carry.decode("utf-8", errors="replace"))
    return out
