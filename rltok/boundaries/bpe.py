"""``bpe``: BPE guidance (spec 4.4): the U-Net's boundaries are prescribed by a byte-level BPE.

Before training, ``setup`` fits a byte-level BPE (HF ``tokenizers``) on the training split with the
vocabulary size whose tokens-per-byte on held-out training documents is closest to r*
(``rltok.bpe.fit_bpe_to_rate``), or takes the tokenizer named by ``boundary.tokenizer``, and stores
it as RUN/tokenizer.json with RUN/tokenizer.info.json (vocabulary size, achieved rate).

In every forward pass the boundaries are computed from the input ids: each run of bytes between
BOS ids is tokenized on its own, and byte i of a run ends a chunk iff a BPE token starts at byte i
(i > 0; the paper's "left shift", see ``rltok.bpe.bpe_boundaries``); BOS positions are boundaries.
Token lengths come from the token byte lengths, never from character offsets.

Not causal: whether a token starts at byte t depends on the bytes after t (a leading space joins
the following word), so b_t carries a little information about the future. The paper's
BPE-guidance numbers share this property; read its bits-per-byte with that in mind.
A stream window that starts inside a document tokenizes its first partial word as it stands.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import numpy as np
import torch
from torch import Tensor

from .. import bpe as bpe_lib
from ..schema import BOS, BoundaryConfig, RunConfig
from ..errors import RltokError
from ..model.chunking import decided_mask, force_ends
from .base import BoundaryModule, BoundaryOutput, MethodSpec, register
from ..model.unet import ByteUNet

TOKENIZER = "tokenizer.json"
TOKENIZER_INFO = "tokenizer.info.json"


@dataclass
class BpeConfig(BoundaryConfig):
    tokenizer: str = ""  # a tokenizers JSON to use instead of fitting one (copied into the run)
    vocab_size: int = 0  # > 0: train exactly this vocabulary size; 0: fit it to target_rate
    fit_bytes: int = 20_000_000  # training bytes (first documents of the split) used to fit the BPE

    def validate(self) -> None:
        super().validate()
        if self.vocab_size < 0 or (0 < self.vocab_size < 260):
            raise RltokError(f"boundary.vocab_size={self.vocab_size} must be 0 (fit to the rate) or >= 260")
        if self.fit_bytes < 1:
            raise RltokError("boundary.fit_bytes must be >= 1")


# -- tokenizing many byte strings ---------------------------------------------------------------

def encode_many(tok, texts: Sequence[bytes]) -> list[tuple[list[int], list[int]]]:
    """(token ids, token byte lengths) for each text, with one ``encode_batch`` call for all valid
    UTF-8 runs. An invalid byte is its own single-byte token (its ByteLevel symbol)."""
    pieces: list[str] = []  # every valid UTF-8 run of every text
    layout: list[list] = []  # per text: index into pieces, or ("byte", value) for an invalid byte
    for t in texts:
        parts: list = []
        for run, ok in bpe_lib._utf8_runs(bytes(t)):
            if ok:
                parts.append(len(pieces))
                pieces.append(run.decode("utf-8"))
            else:
                parts.append(("byte", run[0]))
        layout.append(parts)
    encs = tok.encode_batch(pieces, add_special_tokens=False) if pieces else []
    out: list[tuple[list[int], list[int]]] = []
    for i, parts in enumerate(layout):
        ids: list[int] = []
        lens: list[int] = []
        for part in parts:
            if isinstance(part, tuple):
                ids.append(byte_token_id(tok, part[1]))
                lens.append(1)
            else:
                e = encs[part]
                ids.extend(e.ids)
                lens.extend(len(s) for s in e.tokens)  # ByteLevel: one symbol per byte
        if sum(lens) != len(texts[i]):
            raise RltokError("BPE tokens do not cover the input bytes (the tokenizer must use a "
                             "ByteLevel pre-tokenizer without add_prefix_space)")
        out.append((ids, lens))
    return out


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's reversible byte -> printable character map used by the ByteLevel pre-tokenizer."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(bs, cs)}


_BYTE_SYMBOL = _bytes_to_unicode()


def byte_token_id(tok, byte: int) -> int:
    i = tok.token_to_id(_BYTE_SYMBOL[byte])
    if i is None:
        raise RltokError(f"the BPE vocabulary has no token for byte {byte:#04x} (train it with the ByteLevel alphabet)")
    return i


def runs_of(row: np.ndarray) -> list[tuple[int, bytes]]:
    """Maximal runs of byte ids (< 256) in one row of ids: (start position, bytes)."""
    is_byte = row < 256
    out = []
    t, n = 0, len(row)
    while t < n:
        if not is_byte[t]:
            t += 1
            continue
        s = t
        while t < n and is_byte[t]:
            t += 1
        out.append((s, row[s:t].astype(np.uint8).tobytes()))
    return out


class BoundaryCache:
    """Boundaries of recently seen byte runs (evaluation scores the same documents again)."""

    def __init__(self, tok, max_items: int = 8192):
        self.tok = tok
        self.max_items = max_items
        self._d: dict[bytes, np.ndarray] = {}

    def boundaries(self, runs: Sequence[bytes]) -> list[np.ndarray]:
        missing = list({r for r in runs if r not in self._d})
        if missing and len(self._d) + len(missing) > self.max_items:
            # make room before this batch, never during it: clearing mid-batch dropped runs of
            # the batch that were already cached (a KeyError after ~8k distinct runs of training)
            self._d.clear()
            missing = list(dict.fromkeys(runs))
        if missing:
            for r, (_, lens) in zip(missing, encode_many(self.tok, missing)):
                b = np.zeros(len(r), dtype=bool)
                starts = np.cumsum([0] + lens[:-1])
                b[starts] = True
                b[0] = False
                self._d[r] = b
        return [self._d[r] for r in runs]


def bpe_boundaries_for_ids(cache: BoundaryCache, ids: np.ndarray) -> np.ndarray:
    """(B, S) bool boundaries for a batch of ids: BOS positions, and within each byte run the
    bytes where a BPE token starts (except the run's first byte)."""
    b = ids == BOS
    where: list[tuple[int, int]] = []
    runs: list[bytes] = []
    for r, row in enumerate(ids):
        for s, data in runs_of(row):
            where.append((r, s))
            runs.append(data)
    for (r, s), rb in zip(where, cache.boundaries(runs)):
        b[r, s:s + len(rb)] |= rb
    return b


# -- the tokenizer of a run ---------------------------------------------------------------------

def fit_docs(corpus, max_bytes: int) -> list[bytes]:
    """Documents of the split in a fixed random order, up to ``max_bytes``: a corpus stored source
    by source (the built-in ones: one language or manual after another) must not fit its BPE, nor
    hold out the documents that choose its vocabulary size (the first 10%), from one source."""
    docs, total = [], 0
    for i in np.random.default_rng(0).permutation(len(corpus)):
        d = corpus.doc_bytes(int(i))
        docs.append(d)
        total += len(d)
        if total >= max_bytes:
            break
    return docs


def prepare_tokenizer(cfg: RunConfig, train_corpus, run_dir: Path, label: str) -> dict:
    """Fit (or copy) the run's BPE into RUN/tokenizer.json and write its info; returns the info."""
    bc = cfg.boundary
    run_dir = Path(run_dir)
    docs = fit_docs(train_corpus, bc.fit_bytes)
    if bc.tokenizer:
        src = Path(bc.tokenizer).expanduser()
        tok = bpe_lib.load_tokenizer(src)
        rate = bpe_lib.tokens_per_byte(tok, docs)
        info = {"source": str(src), "vocab_size": tok.get_vocab_size(), "rate": rate,
                "rate_measured_on": "training documents used for fitting"}
    elif bc.vocab_size > 0:
        tok = bpe_lib.train_bpe(docs, bc.vocab_size)
        rate = bpe_lib.tokens_per_byte(tok, docs)
        info = {"source": "trained", "vocab_size": tok.get_vocab_size(), "rate": rate,
                "rate_measured_on": "training documents used for fitting"}
    else:
        tok, size, rate = bpe_lib.fit_bpe_to_rate(docs, bc.target_rate)
        info = {"source": "fit_bpe_to_rate", "vocab_size": size, "rate": rate,
                "rate_measured_on": "held-out 10% of the fitting documents"}
    info.update(target_rate=bc.target_rate, fit_docs=len(docs), fit_bytes=sum(len(d) for d in docs))
    run_dir.mkdir(parents=True, exist_ok=True)
    bpe_lib.save_tokenizer(tok, run_dir / TOKENIZER, info)
    print(f"{label}: BPE ({info['source']}) vocabulary {info['vocab_size']:,} gives {rate:.4f} tokens "
          f"per byte (target {bc.target_rate}); saved {run_dir / TOKENIZER}", file=sys.stderr)
    return info


def load_run_tokenizer(cfg: RunConfig, run_dir: Path | None):
    """RUN/tokenizer.json if the run has one, else ``boundary.tokenizer``, else None."""
    if run_dir is not None and (Path(run_dir) / TOKENIZER).is_file():
        return bpe_lib.load_tokenizer(Path(run_dir) / TOKENIZER)
    if cfg.boundary.tokenizer:
        return bpe_lib.load_tokenizer(Path(cfg.boundary.tokenizer).expanduser())
    return None


# -- the boundary method ------------------------------------------------------------------------

class BpeBoundaries(BoundaryModule):
    name = "bpe"
    causal = False  # a token boundary at t depends on the bytes after t

    def __init__(self, model_cfg, cfg: BpeConfig, tokenizer=None):
        super().__init__(model_cfg, cfg)
        self.tokenizer = tokenizer
        self._cache = BoundaryCache(tokenizer) if tokenizer is not None else None

    def forward(self, h: Tensor, ids: Tensor, *, valid: Tensor, noise: Tensor | None = None,
                fixed: Tensor | None = None, mode: str = "sample") -> BoundaryOutput:
        if fixed is not None:
            b = fixed.bool()
        else:
            if self._cache is None:
                raise RltokError("bpe: the model has no tokenizer (train the run with `rltok train "
                                 "--method bpe`, or set boundary.tokenizer)")
            b = torch.from_numpy(bpe_boundaries_for_ids(self._cache, ids.cpu().numpy())).to(ids.device)
        b = force_ends(b, valid)
        decided = decided_mask(valid)
        return BoundaryOutput(hard=b.float(), decided=decided, probs=b.float())


def _build(cfg: RunConfig, run_dir: Path | None = None):
    return ByteUNet(cfg.model, BpeBoundaries(cfg.model, cfg.boundary, load_run_tokenizer(cfg, run_dir)))


def _setup(cfg: RunConfig, train_corpus, run_dir: Path) -> None:
    prepare_tokenizer(cfg, train_corpus, run_dir, "bpe")


register(MethodSpec(
    name="bpe",
    config_cls=BpeConfig,
    build=_build,
    setup=_setup,
    description="BPE guidance: boundaries from a byte-level BPE fitted to the target rate (spec 4.4)",
))
