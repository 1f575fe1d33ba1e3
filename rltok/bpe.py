"""Byte-level BPE (HF ``tokenizers``): training, rate matching, and boundaries in bytes.

Used by the ``bpe`` boundary method (BPE guidance), the ``bpe-lm`` baseline and the boundary
analysis (agreement with BPE). Tokens are GPT-2-style byte-level BPE: the ByteLevel pre-tokenizer
attaches a leading space to the next word and maps every byte to one symbol, so a token's length
in symbols is its length in bytes. We derive boundaries from those byte lengths, never from the
character offsets ``tokenizers`` reports (those are character positions, and a ByteLevel
post-processor trims spaces out of them).

Deviation from the reference: ``add_prefix_space=False`` so that tokens cover exactly the input
bytes (the reference adds a virtual space before each text; it only changes the first word).
Invalid UTF-8 cannot be given to ``tokenizers`` (it takes str): each invalid byte is its own token
and the valid runs around it are tokenized separately.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Iterable, Sequence

import numpy as np

from .errors import RltokError
from .checkpoint import write_bytes_atomic

SPECIAL = ["<bos>", "<eos>"]


def _tokenizers():
    try:
        import tokenizers
    except ImportError:  # pragma: no cover
        raise RltokError("BPE needs the `tokenizers` package (pip install tokenizers)") from None
    return tokenizers


def train_bpe(docs: Iterable[bytes], vocab_size: int, min_frequency: int = 2):
    """Train a byte-level BPE on documents (bytes; decoded as UTF-8 with replacement)."""
    tk = _tokenizers()
    from tokenizers import decoders, models, pre_tokenizers, trainers

    tok = tk.Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, min_frequency=min_frequency,
                                  special_tokens=SPECIAL, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator((d.decode("utf-8", errors="replace") for d in docs), trainer=trainer)
    return tok


def load_tokenizer(path: str | Path):
    tk = _tokenizers()
    path = Path(path)
    if not path.is_file():
        raise RltokError(f"{path}: no tokenizer file")
    try:
        return tk.Tokenizer.from_file(str(path))
    except Exception as e:  # tokenizers raises a generic Exception on bad JSON
        raise RltokError(f"{path}: not a tokenizers JSON file ({e})") from None


def _utf8_runs(data: bytes) -> list[tuple[bytes, bool]]:
    """Split bytes into maximal valid UTF-8 runs and single invalid bytes."""
    runs: list[tuple[bytes, bool]] = []
    i, n = 0, len(data)
    start = 0
    while i < n:
        try:
            data[i:].decode("utf-8")
            break  # the rest is valid
        except UnicodeDecodeError as e:
            bad = i + e.start
            if bad > start:
                runs.append((data[start:bad], True))
            end = bad + max(1, e.end - e.start)
            for j in range(bad, end):
                runs.append((data[j:j + 1], False))
            i = start = end
    if start < n:
        runs.append((data[start:], True))
    return runs


def token_lengths(tok, data: bytes) -> list[int]:
    """Byte length of each BPE token of ``data``; they sum to len(data)."""
    out: list[int] = []
    for run, valid in _utf8_runs(bytes(data)):
        if not valid:
            out.append(1)
            continue
        lens = [len(t) for t in tok.encode(run.decode("utf-8"), add_special_tokens=False).tokens]
        if sum(lens) != len(run):
            raise RltokError("BPE tokens do not cover the input bytes (the tokenizer must use a "
                             "ByteLevel pre-tokenizer without add_prefix_space)")
        out.extend(lens)
    return out


def token_starts(tok, data: bytes) -> np.ndarray:
    """(len(data),) bool: True where a BPE token starts."""
    starts = np.zeros(len(data), dtype=bool)
    pos = 0
    for L in token_lengths(tok, data):
        starts[pos] = True
        pos += L
    return starts


def bpe_boundaries(tok, data: bytes) -> np.ndarray:
    """Boundaries in the U-Net's convention from BPE (spec 4.4, the "left shift"): byte i ends a
    chunk iff a token starts at byte i (i > 0). With GPT-2 pre-tokenization a token usually starts
    with a space, so chunks are "word + following space", the segmentation the learned policy
    finds. Returns (len(data),) bool."""
    b = token_starts(tok, data)
    if len(b):
        b[0] = False
    return b


def tokens_per_byte(tok, docs: Sequence[bytes]) -> float:
    n_tok = sum(len(token_lengths(tok, d)) for d in docs)
    n_bytes = sum(len(d) for d in docs)
    return n_tok / max(1, n_bytes)


def fit_bpe_to_rate(docs: Sequence[bytes], target_rate: float, *, min_vocab: int = 300,
                    max_vocab: int = 131072, holdout: float = 0.1, iters: int = 8):
    """Train BPEs of different vocabulary sizes and keep the one whose tokens-per-byte on held-out
    training documents is closest to ``target_rate``. Returns (tokenizer, vocab_size, rate).

    The rate falls as the vocabulary grows; a corpus too small for the target (the floor is about
    one token per pre-tokenized word) yields the largest useful vocabulary, and the achieved rate
    is reported so the user sees the mismatch.
    """
    docs = list(docs)
    n_hold = max(1, int(len(docs) * holdout)) if len(docs) > 1 else 0
    fit_docs, hold_docs = docs[n_hold:] or docs, docs[:n_hold] or docs
    lo, hi = np.log(min_vocab), np.log(max_vocab)
    best = None
    cache: dict[int, tuple] = {}
    for _ in range(iters):
        mid = int(round(np.exp((lo + hi) / 2)))
        if mid not in cache:
            tok = train_bpe(fit_docs, mid)
            cache[mid] = (tok, tok.get_vocab_size(), tokens_per_byte(tok, hold_docs))
        tok, size, rate = cache[mid]
        if best is None or abs(rate - target_rate) < abs(best[2] - target_rate):
            best = (tok, size, rate)
        if size < mid:  # the trainer ran out of merges: larger vocabularies change nothing
            hi = np.log(size)
            break
        if rate > target_rate:
            lo = np.log(mid)
        else:
            hi = np.log(mid)
    return best


def save_tokenizer(tok, path: str | Path, info: dict | None = None) -> None:
    path = Path(path)
    write_bytes_atomic(path, tok.to_str().encode())
    if info is not None:
        write_bytes_atomic(path.with_suffix(".info.json"), (json.dumps(info, indent=2) + "\n").encode())
