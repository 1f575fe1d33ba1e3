"""Documents as bytes, and the deterministic train/validation/test split by document."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import numpy as np

from ..schema import DataConfig
from ..errors import RltokError


@dataclass
class Corpus:
    """Documents stored back to back in one uint8 array (in memory or memory-mapped)."""

    data: np.ndarray  # uint8
    offsets: np.ndarray  # int64, n_docs + 1
    name: str = ""

    def __len__(self) -> int:
        return len(self.offsets) - 1

    def doc(self, i: int) -> np.ndarray:
        return self.data[self.offsets[i]:self.offsets[i + 1]]

    def doc_bytes(self, i: int) -> bytes:
        return bytes(self.doc(i))

    @property
    def starts(self) -> np.ndarray:
        """Start of each document in ``data`` (prepared corpora store starts, not offsets)."""
        return self.offsets[:-1]

    @property
    def lengths(self) -> np.ndarray:
        return np.diff(self.offsets)

    @property
    def total_bytes(self) -> int:
        return int(self.offsets[-1] - self.offsets[0])

    @classmethod
    def from_docs(cls, docs: list[bytes], name: str = "") -> "Corpus":
        lens = np.fromiter((len(d) for d in docs), dtype=np.int64, count=len(docs))
        offsets = np.zeros(len(docs) + 1, dtype=np.int64)
        np.cumsum(lens, out=offsets[1:])
        data = np.frombuffer(b"".join(docs), dtype=np.uint8) if docs else np.zeros(0, np.uint8)
        return cls(data=data, offsets=offsets, name=name)

    def subset(self, index: np.ndarray) -> "Corpus":
        return Corpus.from_docs([self.doc_bytes(int(i)) for i in index], name=self.name)


def normalize_docs(docs: list[bytes], cfg: DataConfig) -> list[bytes]:
    """Cut documents longer than max_doc_bytes into pieces; drop ones under min_doc_bytes."""
    out: list[bytes] = []
    step = cfg.max_doc_bytes
    for d in docs:
        pieces = [d[i:i + step] for i in range(0, len(d), step)] if len(d) > step else [d]
        out.extend(p for p in pieces if len(p) >= cfg.min_doc_bytes)
    return out


@dataclass
class Splits:
    train: Corpus
    val: Corpus
    test: Corpus


def auto_val_docs(n_docs: int) -> int:
    return min(256, max(1, round(0.1 * n_docs)))


def split_corpus(corpus: Corpus, cfg: DataConfig) -> Splits:
    """Deterministic split by document: exact duplicates are dropped, the documents are ordered
    by a keyed hash of their content, the first go to validation, the next to test, the rest to
    training. The split depends only on the corpus and ``split_seed`` (not the training seed),
    and no byte of a held-out document reaches training."""
    n = len(corpus)
    n_val = auto_val_docs(n) if cfg.val_docs < 0 else cfg.val_docs
    n_test = cfg.test_docs
    key = cfg.split_seed.to_bytes(8, "little", signed=True)
    seen: set[bytes] = set()
    order: list[tuple[bytes, int]] = []
    for i in range(n):
        d = corpus.doc_bytes(i)
        digest = hashlib.sha256(d).digest()
        if digest in seen:
            continue
        seen.add(digest)
        order.append((hashlib.blake2b(d, key=key, digest_size=8).digest(), i))
    order.sort()
    idx = np.array([i for _, i in order], dtype=np.int64)
    if len(idx) < n_val + n_test + 1:
        raise RltokError(
            f"data source {corpus.name!r} has {len(idx)} distinct documents: too few for "
            f"{n_val} validation + {n_test} test documents and a training set "
            f"(set data.val_docs/data.test_docs, or lower data.max_doc_bytes to cut long documents)")
    val, test, train = idx[:n_val], idx[n_val:n_val + n_test], idx[n_val + n_test:]
    # keep the original order inside each split (deterministic either way)
    return Splits(train=corpus.subset(np.sort(train)), val=corpus.subset(val),
                  test=corpus.subset(test))
