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

from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import numpy as np
import torch
from torch import Tensor

from ..bpe import TokenizerOptions, encode_many, load_run_tokenizer, prepare_tokenizer
from ..schema import BOS, BoundaryConfig, RunConfig
from ..errors import RltokError
from ..model.chunking import decided_mask, force_ends
from ..registry import MethodSpec, register
from .base import BoundaryModule, BoundaryOutput
from ..model.unet import ByteUNet


@dataclass
class BpeConfig(TokenizerOptions, BoundaryConfig):
    """The tokenizer's options (``TokenizerOptions``) under ``boundary.*``."""

    def validate(self) -> None:
        super().validate()
        self.check_tokenizer_options("boundary")


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
    router = BpeBoundaries(cfg.model, cfg.boundary, load_run_tokenizer(cfg.boundary, run_dir))
    return ByteUNet(cfg.model, router, cfg.chunker, cfg.dechunker)


def _setup(cfg: RunConfig, train_corpus, run_dir: Path) -> None:
    prepare_tokenizer(cfg.boundary, cfg.boundary.target_rate, train_corpus, run_dir, "bpe")


register(MethodSpec(
    name="bpe",
    config_cls=BpeConfig,
    build=_build,
    setup=_setup,
    description="BPE guidance: boundaries from a byte-level BPE fitted to the target rate (spec 4.4)",
))
