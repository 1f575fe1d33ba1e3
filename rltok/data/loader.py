"""Training sequences: a pure function of (seed, global sequence index).

Nothing here keeps state between steps. The global batch of optimizer step k holds the sequences
with global indices k*G .. k*G+G-1; each data-parallel rank and each accumulation micro-step takes
a contiguous slice. So the data order (and the policy's random numbers, which ride along as
``noise``) is the same for any world size, and resuming needs only the step number.

Two packings:

* ``stream`` (default): documents joined, each preceded by BOS, read as a cyclic stream cut into
  windows of seq_len + 1 ids at a random offset per epoch; the windows of an epoch are visited in a
  seeded random order. Targets may be BOS, i.e. "end of document".
* ``document`` (the paper): item i is BOS + the first seq_len bytes of a document; shorter
  documents are padded and their padding carries no target.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from ..schema import BOS, PAD
from .corpus import Corpus  # or a PreparedCorpus: the same doc/starts/lengths interface


@dataclass
class Batch:
    ids: Tensor  # (B, S) long: inputs
    targets: Tensor  # (B, S) long: next id, -1 where there is none
    noise: Tensor  # (B, S) float32 uniforms: the boundary methods' randomness
    index: Tensor  # (B,) long: global sequence indices (the data position)

    def to(self, device) -> "Batch":
        return Batch(*(t.to(device, non_blocking=True) for t in (self.ids, self.targets, self.noise, self.index)))

    def __len__(self) -> int:
        return self.ids.shape[0]


def sequence_noise(seed: int, index: int, length: int) -> np.ndarray:
    return np.random.default_rng([seed, 7, int(index)]).random(length, dtype=np.float32)


class SequenceDataset:
    """Maps a global sequence index to seq_len + 1 ids."""

    def __init__(self, corpus: Corpus, seq_len: int, seed: int, packing: str = "stream"):
        self.corpus = corpus
        self.seq_len = seq_len
        self.seed = seed
        self.packing = packing
        lens = corpus.lengths
        self.vstart = np.zeros(len(lens) + 1, dtype=np.int64)  # virtual start of doc i (its BOS)
        np.cumsum(lens + 1, out=self.vstart[1:])
        self.vtotal = int(self.vstart[-1])
        if packing == "stream":
            self.items_per_epoch = max(1, self.vtotal // seq_len)
        else:
            self.items_per_epoch = len(corpus)
        self._perm_epoch = -1
        self._perm: np.ndarray | None = None

    def _epoch(self, epoch: int) -> np.ndarray:
        if epoch != self._perm_epoch:
            rng = np.random.default_rng([self.seed, 11, epoch])
            self._perm = rng.permutation(self.items_per_epoch)
            self._shift = int(rng.integers(self.seq_len)) if self.packing == "stream" else 0
            self._perm_epoch = epoch
        return self._perm

    def _stream_ids(self, start: int) -> np.ndarray:
        v = (start + np.arange(self.seq_len + 1, dtype=np.int64)) % self.vtotal
        doc = np.searchsorted(self.vstart, v, side="right") - 1
        local = v - self.vstart[doc]
        src = self.corpus.starts[doc] + local - 1
        ids = np.where(local == 0, BOS, 0).astype(np.int64)
        body = local > 0
        ids[body] = self.corpus.data[src[body]]
        return ids

    def _document_ids(self, doc: int) -> np.ndarray:
        d = self.corpus.doc(doc)[: self.seq_len]
        ids = np.full(self.seq_len + 1, PAD, dtype=np.int64)
        ids[0] = BOS
        ids[1:1 + len(d)] = d
        return ids

    def ids(self, index: int) -> np.ndarray:
        epoch, i = divmod(int(index), self.items_per_epoch)
        item = int(self._epoch(epoch)[i])
        if self.packing == "stream":
            return self._stream_ids(self._shift + item * self.seq_len)
        return self._document_ids(item)

    def batch(self, indices: np.ndarray) -> Batch:
        rows = np.stack([self.ids(i) for i in indices])
        ids = torch.from_numpy(rows[:, :-1].copy())
        targets = torch.from_numpy(rows[:, 1:].copy())
        targets[targets == PAD] = -1
        noise = torch.from_numpy(np.stack([sequence_noise(self.seed, i, self.seq_len) for i in indices]))
        return Batch(ids=ids, targets=targets, noise=noise, index=torch.as_tensor(indices, dtype=torch.long))

    def step_indices(self, step: int, global_batch: int, rank: int = 0, world: int = 1) -> np.ndarray:
        """The global indices this rank processes at optimizer step ``step``."""
        per_rank = global_batch // world
        start = step * global_batch + rank * per_rank
        return np.arange(start, start + per_rank, dtype=np.int64)


def document_batches(corpus: Corpus, seq_len: int, batch_size: int, max_docs: int | None = None):
    """Evaluation batches: each document as BOS + its first seq_len bytes, in input order, padded.

    Yields (doc indices, Batch); the targets are exactly the document's bytes (no end-of-document
    target), so a document of n bytes contributes min(n, seq_len) predicted bytes.
    """
    for idx, _, batch in document_windows(corpus, seq_len, batch_size, max_docs, first_only=True):
        yield idx, batch


def window_starts(n: int, seq_len: int, stride: int) -> list[tuple[int, int]]:
    """The windows that score every byte of an n-byte document exactly once: (start, scored_from)
    pairs. Window j covers target bytes [start, start + seq_len) and scores those from
    ``scored_from`` on, so every scored byte after the first window has at least
    seq_len - stride bytes of context. stride = seq_len: consecutive non-overlapping windows."""
    if n <= seq_len:
        return [(0, 0)]
    out, end = [(0, 0)], seq_len
    while end < n:
        start = min(end + stride - seq_len, n - seq_len)
        out.append((start, end))
        end = start + seq_len
    return out


def document_windows(corpus: Corpus, seq_len: int, batch_size: int, max_docs: int | None = None,
                     stride: int | None = None, first_only: bool = False):
    """Evaluation batches that score whole documents: each document cut into the windows of
    ``window_starts`` (``first_only``: its first window alone, ``document_batches``). The first
    window is BOS + the document's start; a later window's first input is the byte before it
    (as in stream-packed training, where sequences start mid-document). Targets outside a
    window's scored part are -1.

    Yields (per-row document index, per-row window number, Batch)."""
    stride = seq_len if stride is None else stride
    n = len(corpus) if max_docs is None else min(max_docs, len(corpus))
    rows = [(i, w, s, f) for i in range(n)
            for w, (s, f) in enumerate(window_starts(len(corpus.doc(i)), seq_len, stride)[:1 if first_only else None])]
    for lo in range(0, len(rows), batch_size):
        chunk = rows[lo:lo + batch_size]
        S = max(1, max(min(len(corpus.doc(i)) - s, seq_len) for i, _, s, _ in chunk))
        ids = np.full((len(chunk), S), PAD, dtype=np.int64)
        tgt = np.full((len(chunk), S), -1, dtype=np.int64)
        for r, (i, _, s, f) in enumerate(chunk):
            d = corpus.doc(i)
            L = min(len(d) - s, seq_len)
            ids[r, 0] = BOS if s == 0 else d[s - 1]
            ids[r, 1:L] = d[s:s + L - 1]
            tgt[r, f - s:L] = d[f:s + L]
        doc = np.array([c[0] for c in chunk], dtype=np.int64)
        yield doc, np.array([c[1] for c in chunk], dtype=np.int64), Batch(
            ids=torch.from_numpy(ids), targets=torch.from_numpy(tgt),
            noise=torch.zeros(len(chunk), S), index=torch.from_numpy(doc))
