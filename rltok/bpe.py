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
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Sequence

import numpy as np

from .errors import RltokError
from .checkpoint import write_bytes_atomic

SPECIAL = ["<bos>", "<eos>"]
TOKENIZER = "tokenizer.json"
TOKENIZER_INFO = "tokenizer.info.json"


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


def holdout_split(docs: Sequence[bytes], holdout: float = 0.1) -> tuple[list[bytes], list[bytes]]:
    """(fitting documents, held-out documents) as :func:`fit_bpe_to_rate` splits them: the first
    ``holdout`` share (at least one) held out; a single document serves as both."""
    docs = list(docs)
    n_hold = max(1, int(len(docs) * holdout)) if len(docs) > 1 else 0
    return docs[n_hold:] or docs, docs[:n_hold] or docs


def fit_bpe_to_rate(docs: Sequence[bytes], target_rate: float, *, min_vocab: int = 300,
                    max_vocab: int = 131072, holdout: float = 0.1, iters: int = 8):
    """Train BPEs of different vocabulary sizes and keep the one whose tokens-per-byte on held-out
    training documents is closest to ``target_rate``. Returns (tokenizer, vocab_size, rate).

    The rate falls as the vocabulary grows; a corpus too small for the target (the floor is about
    one token per pre-tokenized word) yields the largest useful vocabulary, and the achieved rate
    is reported so the user sees the mismatch.
    """
    fit_docs, hold_docs = holdout_split(docs, holdout)
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


# -- tokenizing many byte strings ---------------------------------------------------------------

def encode_many(tok, texts: Sequence[bytes]) -> list[tuple[list[int], list[int]]]:
    """(token ids, token byte lengths) for each text, with one ``encode_batch`` call for all valid
    UTF-8 runs. An invalid byte is its own single-byte token (its ByteLevel symbol)."""
    pieces: list[str] = []  # every valid UTF-8 run of every text
    layout: list[list] = []  # per text: index into pieces, or ("byte", value) for an invalid byte
    for t in texts:
        parts: list = []
        for run, ok in _utf8_runs(bytes(t)):
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


# -- the tokenizer of a run ---------------------------------------------------------------------

@dataclass
class TokenizerOptions:
    """The options of a run's BPE, shared by bpe guidance (``boundary.*``) and the token LM
    (``flat.*``): the fields of their config classes, read by :func:`prepare_tokenizer` and
    :func:`load_run_tokenizer`."""

    tokenizer: str = ""  # a tokenizers JSON to use instead of fitting one (copied into the run)
    vocab_size: int = 0  # > 0: train exactly this vocabulary size; 0: fit it to boundary.target_rate
    fit_bytes: int = 20_000_000  # training bytes (first documents of the split) used to fit the BPE

    def check_tokenizer_options(self, section: str) -> None:
        if self.vocab_size < 0 or (0 < self.vocab_size < 260):
            raise RltokError(f"{section}.vocab_size={self.vocab_size} must be 0 (fit to the rate) or >= 260")
        if self.fit_bytes < 1:
            raise RltokError(f"{section}.fit_bytes must be >= 1")


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


def prepare_tokenizer(opts: TokenizerOptions, target_rate: float, train_corpus, run_dir: Path, label: str) -> dict:
    """Fit (or copy) the run's BPE into RUN/tokenizer.json and write its info; returns the info.
    ``opts``: the method's tokenizer options (``tokenizer``, ``vocab_size``, ``fit_bytes``: bpe
    guidance's ``boundary.*``, bpe-lm's ``flat.*``); ``target_rate``: the rate to fit to."""
    bc = opts
    run_dir = Path(run_dir)
    docs = fit_docs(train_corpus, bc.fit_bytes)
    if bc.tokenizer:
        src = Path(bc.tokenizer).expanduser()
        tok = load_tokenizer(src)
        # tokens must cover the bytes as they are: a normalizer (GPT-NeoX's NFC) would change them
        normalizer = tok.normalizer is not None
        tok.normalizer = None
        rate = tokens_per_byte(tok, docs)
        info = {"source": str(src), "vocab_size": tok.get_vocab_size(), "rate": rate,
                "rate_measured_on": "training documents used for fitting", "normalizer_removed": normalizer}
    elif bc.vocab_size > 0:
        tok = train_bpe(docs, bc.vocab_size)
        rate = tokens_per_byte(tok, docs)
        info = {"source": "trained", "vocab_size": tok.get_vocab_size(), "rate": rate,
                "rate_measured_on": "training documents used for fitting"}
    else:
        tok, size, rate = fit_bpe_to_rate(docs, target_rate)
        info = {"source": "fit_bpe_to_rate", "vocab_size": size, "rate": rate,
                "rate_measured_on": "held-out 10% of the fitting documents"}
    info.update(target_rate=target_rate, fit_docs=len(docs), fit_bytes=sum(len(d) for d in docs))
    run_dir.mkdir(parents=True, exist_ok=True)
    save_tokenizer(tok, run_dir / TOKENIZER, info)
    print(f"{label}: BPE ({info['source']}) vocabulary {info['vocab_size']:,} gives {rate:.4f} tokens "
          f"per byte (target {target_rate}); saved {run_dir / TOKENIZER}", file=sys.stderr)
    return info


def load_run_tokenizer(opts: TokenizerOptions, run_dir: Path | None):
    """RUN/tokenizer.json if the run has one, else the options' ``tokenizer``, else None."""
    if run_dir is not None and (Path(run_dir) / TOKENIZER).is_file():
        return load_tokenizer(Path(run_dir) / TOKENIZER)
    if opts.tokenizer:
        return load_tokenizer(Path(opts.tokenizer).expanduser())
    return None
