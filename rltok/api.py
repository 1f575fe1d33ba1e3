"""The Python API for notebooks: load a run, score texts, see boundaries.

    >>> import rltok
    >>> model = rltok.load("runs/tiny")
    >>> res = rltok.score(model, ["Hello world.", b"raw \\xff bytes"])
    >>> res.logprobs[0]        # log p(byte_i | bytes before it), nats, one per byte
    >>> res.boundaries[0]      # True where byte i ends a chunk
    >>> rltok.segment(model, "The city council met on Tuesday.")
    ['The ', 'city ', 'council ', 'met ', 'on ', 'Tuesday.']
    >>> enc = rltok.encode(model, "The city council met on Tuesday.")
    >>> enc.offsets            # byte offsets of the chunks, like an HF tokenizers Encoding
    [(0, 4), (4, 9), (9, 17), (17, 21), (21, 24), (24, 32)]

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

from .schema import BOS, PAD
from .data.loader import Batch, document_windows, window_starts
from .evaluate import eval_noise, model_width
from .precision import autocast_for
from .objectives import score as score_batch
from .tasks.scoring import model_seq_len
from .data.corpus import Corpus
from .rates import requested_rate
from .run import load_model
from .text import chunks_of, to_bytes


def load(run: str | Path, device: str | torch.device = "cpu", checkpoint: str | None = None) -> nn.Module:
    """The model of a run directory (final weights, else its newest valid checkpoint), in eval
    mode, with ``.run_config`` attached."""
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
          seed: int = 0, boundaries: Sequence[Sequence[int]] | None = None, dtype: str = "auto",
          rate: float | None = None) -> Scored:
    """Per-byte log-probabilities and the boundaries used, for a batch of texts.

    ``mode``: ``sample`` (boundaries drawn as in training, from ``seed``) or ``greedy``.
    ``boundaries``: optional 0/1 per byte to fix the boundaries (teacher forcing).
    ``rate``: the boundary rate of a rate-conditioned model (``boundary.rate_schedule``).
    """
    if isinstance(texts, (str, bytes)):
        texts = [texts]
    raw = [_as_bytes(t) for t in texts]
    seq_len = model_seq_len(model)
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

    with requested_rate(model, rate, "rate="), autocast_for(device, dtype, model_width(model)):
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


@dataclass
class Encoding:
    """The chunks a model draws on one text, in the manner of an HF ``tokenizers`` Encoding.

    ``boundaries[i]`` is True where byte i ends a chunk (the last byte always does);
    ``offsets`` are (start, end) byte offsets of the chunks; ``chunks`` their bytes; ``strings``
    their text (a boundary inside a multi-byte character moves to that character's end, so
    strings are whole characters); ``char_offsets`` the same as character offsets into the str
    given (None for bytes input)."""

    text: str | bytes
    data: bytes
    boundaries: np.ndarray

    @property
    def offsets(self) -> list[tuple[int, int]]:
        ends = np.flatnonzero(self.boundaries) + 1
        starts = np.concatenate([[0], ends[:-1]])
        return [(int(a), int(b)) for a, b in zip(starts, ends)]

    @property
    def chunks(self) -> list[bytes]:
        return [self.data[a:b] for a, b in self.offsets]

    @property
    def strings(self) -> list[str]:
        if isinstance(self.text, bytes):
            return [c.decode("utf-8", errors="replace") for c in self.chunks]
        return [self.data[a:b].decode("utf-8", errors="replace") for a, b in _whole_characters(self.data, self.offsets)]

    @property
    def char_offsets(self) -> list[tuple[int, int]] | None:
        if isinstance(self.text, bytes):
            return None
        out, pos = [], 0
        for a, b in _whole_characters(self.data, self.offsets):
            n = len(self.data[a:b].decode("utf-8", errors="replace"))
            out.append((pos, pos + n))
            pos += n
        return out

    def __len__(self) -> int:
        return int(self.boundaries.sum())


def _whole_characters(data: bytes, offsets: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """Byte offsets with every boundary that falls inside a UTF-8 character moved to its end
    (chunks that become empty are dropped)."""
    out, start = [], 0
    for _, end in offsets:
        while end < len(data) and data[end] & 0xC0 == 0x80:  # a continuation byte follows
            end += 1
        if end > start:
            out.append((start, end))
            start = end
    return out


@torch.no_grad()
def encode_batch(model: nn.Module, texts: Sequence[str | bytes], *, mode: str = "greedy", seed: int = 0,
                 dtype: str = "auto", batch_size: int = 8, rate: float | None = None) -> list[Encoding]:
    """The chunks of each text. ``mode``: ``greedy`` (boundary where its probability > 0.5) or
    ``sample`` (drawn as in training, from ``seed``). Every byte of a text is an input (BOS +
    the text), so the boundary after its last byte is the forced end of the sequence. A text
    longer than the model's context is cut into windows of ``seq_len`` bytes overlapping by half
    (``data.loader.window_starts``); a byte's boundary comes from a window where it has at least
    a quarter of a window of context before it and is not the window's forced end. ``rate``: the
    boundary rate of a rate-conditioned model."""
    raw = [_as_bytes(t) for t in texts]
    if any(not r for r in raw):
        raise ValueError("encode: a text is empty")
    seq_len = model_seq_len(model)
    if seq_len < 8:
        raise ValueError(f"encode needs a context of at least 8 bytes (seq_len {seq_len})")
    stride = seq_len // 2
    # one placeholder target after each text makes its last byte an input; it is never read
    docs_in = [r + b"\0" for r in raw]
    plans = [window_starts(len(d), seq_len, stride) for d in docs_in]
    device = next(model.parameters()).device
    bounds = [np.zeros(len(r), dtype=bool) for r in raw]
    was = model.training
    model.eval()
    try:
        with requested_rate(model, rate, "rate="):
            for docs, wins, batch in document_windows(Corpus.from_docs(docs_in), seq_len, batch_size, stride=stride):
                noise = eval_noise(seed, 0, docs, batch.ids.shape[1], wins).to(device)
                with autocast_for(device, dtype, model_width(model)):
                    out = score_batch(model, batch.to(device), noise=noise, mode=mode)
                if out.boundaries is None:
                    raise ValueError("this model has no chunk boundaries")
                b = out.boundaries.cpu().numpy()
                for r, (d, w) in enumerate(zip(docs, wins)):
                    lo, hi = _window_bytes(plans[d], int(w), len(raw[d]))
                    s = plans[d][w][0]
                    bounds[d][lo:hi] = b[r, lo - s + 1:hi - s + 1]  # byte j is the input at j - s + 1
    finally:
        model.train(was)
    return [Encoding(text=t, data=r, boundaries=bd) for t, r, bd in zip(texts, raw, bounds)]


def _window_bytes(plan: list[tuple[int, int]], w: int, n: int) -> tuple[int, int]:
    """The bytes [lo, hi) of an n-byte text whose boundaries window w of ``plan`` (over the text
    and one placeholder byte) gives: from two bytes before its first scored target (never its
    first, context-free, input) to just before the next window's share, which excludes this
    window's forced end; the last window runs to the text's end."""
    lo = 0 if w == 0 else plan[w][1] - 2
    hi = n if w == len(plan) - 1 else plan[w + 1][1] - 2
    return lo, hi


def encode(model: nn.Module, text: str | bytes, **kw) -> Encoding:
    """The chunks of one text (see ``encode_batch``)."""
    return encode_batch(model, [text], **kw)[0]


def segment(model: nn.Module, text: str | bytes, *, mode: str = "greedy", seed: int = 0,
            rate: float | None = None) -> list:
    """The chunks ("tokens") a model draws on a text: bytes in, bytes out; str in, str out (a
    boundary inside a multi-byte character is shown at the end of that character)."""
    enc = encode(model, text, mode=mode, seed=seed, rate=rate)
    return enc.chunks if isinstance(text, bytes) else enc.strings
