"""Boundary analysis: what a run's chunks look like, and what they cost across languages.

``boundary_stats(model, docs, bpe=...)`` on documents of any source:

* ``rate``: chunk ends per byte (each scored piece's last byte counts as an end, as the paper's
  rate counts the forced end); ``mean_chunk_bytes``; ``chunk_hist``: chunks of 1, 2, ..., ``max_len``
  (and longer, in the last bin) bytes;
* whitespace recall (whitespace bytes that end a chunk / whitespace bytes) and precision (chunk
  ends on whitespace / chunk ends);
* precision, recall and F1 against BPE boundaries in the convention of BPE guidance (spec 4.4:
  byte i ends a chunk iff a BPE token starts at byte i + 1, i.e. "word + following space");
* ``entropy_bits``: the mean binary entropy of the boundary decisions, in bits (0 for a
  deterministic method, H(r*) for Uniform);
* ``bpb`` on the same bytes.

Documents are cut into pieces of ``seq_len - 1`` bytes, each read as BOS + piece through
:func:`rltok.tasks.scoring.score_requests` (so every decision is the method's own: see there).
The last byte of a piece is left out of the whitespace, BPE and entropy statistics (it always ends
a chunk).

``cross_language(...)`` on the UDHR (the same text in 37 languages and scripts): bytes per chunk
and chunks per whitespace word for learned boundaries, BPE tokens per word, and each cost
relative to English. A frozen vocabulary makes the same content cost more tokens in some
languages; a learned tokenizer's chunks show whether it inherits that disparity.
"""

from __future__ import annotations

import math
import unicodedata
import xml.etree.ElementTree as ET
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Sequence

import numpy as np
from torch import nn

from .errors import RltokError
from .locks import held
from .evaluate import boundary_enrichment
from .text import WHITESPACE
from .bpe import bpe_boundaries, fit_bpe_to_rate, fit_docs, load_tokenizer, save_tokenizer, token_lengths
from .data import load_splits
from .data.builtin import cache_dir
from .tasks.scoring import Request, model_seq_len, score_requests

HIST_MAX = 24


def prf(pred: np.ndarray, ref: np.ndarray) -> tuple[float, float, float]:
    """Precision, recall and F1 of boolean ``pred`` against ``ref`` (NaN when undefined)."""
    pred, ref = np.asarray(pred, bool), np.asarray(ref, bool)
    tp = float((pred & ref).sum())
    p = tp / pred.sum() if pred.sum() else float("nan")
    r = tp / ref.sum() if ref.sum() else float("nan")
    f = 2 * p * r / (p + r) if (p + r) > 0 else (0.0 if pred.sum() and ref.sum() else float("nan"))
    return p, r, f


def binary_entropy_bits(p: np.ndarray) -> np.ndarray:
    p = np.clip(np.asarray(p, dtype=np.float64), 1e-12, 1 - 1e-12)
    return -(p * np.log2(p) + (1 - p) * np.log2(1 - p))


def chunk_lengths(ends: np.ndarray) -> np.ndarray:
    """Lengths of the chunks given chunk ends (the last byte always ends one)."""
    ends = np.asarray(ends, bool).copy()
    if len(ends) == 0:
        return np.zeros(0, dtype=np.int64)
    ends[-1] = True
    pos = np.flatnonzero(ends)
    return np.diff(np.concatenate([[-1], pos]))


@dataclass
class BoundaryStats:
    docs: int
    bytes: int
    chunks: int
    rate: float
    mean_chunk_bytes: float
    whitespace_recall: float
    whitespace_precision: float
    bpe_precision: float
    bpe_recall: float
    bpe_f1: float
    entropy_bits: float
    bpb: float
    boundary_enrichment: float = float("nan")  # evaluate.boundary_enrichment
    start_surprisal_ratio: float = float("nan")
    chunk_hist: list[int] = field(default_factory=list)  # index k: chunks of k+1 bytes; last bin: longer too

    def to_dict(self) -> dict:
        return asdict(self)


def pieces_of(docs: Sequence[bytes], size: int) -> list[bytes]:
    return [d[i:i + size] for d in docs for i in range(0, len(d), size) if d[i:i + size]]


def segment_docs(model: nn.Module, docs: Sequence[bytes], *, seed: int = 0, mode: str = "sample",
                 batch_size: int = 16, dtype: str = "auto", progress: bool | str = False):
    """Pieces of the documents with their per-byte scores (boundaries, probabilities, log-probs)."""
    pieces = pieces_of(docs, model_seq_len(model) - 1)
    res = score_requests(model, [Request(b"", p) for p in pieces], seed=seed, mode=mode,
                         batch_size=batch_size, dtype=dtype, details=True, progress=progress)
    return pieces, res


def boundary_stats(model: nn.Module, docs: Sequence[bytes], bpe=None, *, hist_max: int = HIST_MAX,
                   **kw) -> BoundaryStats:
    pieces, res = segment_docs(model, docs, **kw)
    n_bytes = n_chunks = 0
    nll = 0.0
    hist = np.zeros(hist_max, dtype=np.int64)
    pred_all, ws_all, bpe_all, ent = [], [], [], []
    surprisal, starts = [], []
    for piece, r in zip(pieces, res):
        if r.boundaries is None:
            raise RltokError("this model has no chunk boundaries to analyze")
        ends = r.boundaries.copy()
        ends[-1] = True
        lens = chunk_lengths(ends)
        hist += np.bincount(np.minimum(lens, hist_max) - 1, minlength=hist_max)
        n_bytes += len(piece)
        n_chunks += len(lens)
        nll += r.nll
        arr = np.frombuffer(piece, dtype=np.uint8)
        dec = slice(0, len(piece) - 1)
        pred_all.append(ends[dec])
        ws_all.append(np.isin(arr, WHITESPACE)[dec])
        if bpe is not None:
            bpe_all.append(bpe_boundaries(bpe, piece)[dec])
        if r.probs is not None:
            ent.append(binary_entropy_bits(r.probs[dec]))
        if r.logprobs is not None and len(piece) > 1:
            # byte i+1 starts a chunk where byte i ends one (decided ends only: not the last byte)
            surprisal.append(-np.asarray(r.logprobs[1:len(piece)], dtype=float) / math.log(2))
            starts.append(ends[: len(piece) - 1])
    pred = np.concatenate(pred_all) if pred_all else np.zeros(0, bool)
    ws = np.concatenate(ws_all) if ws_all else np.zeros(0, bool)
    wp, wr, _ = prf(pred, ws)
    bp = br = bf = float("nan")
    if bpe is not None and bpe_all:
        bp, br, bf = prf(pred, np.concatenate(bpe_all))
    ent_all = np.concatenate(ent) if ent else np.zeros(0)
    return BoundaryStats(
        docs=len(docs), bytes=n_bytes, chunks=n_chunks, rate=n_chunks / max(1, n_bytes),
        mean_chunk_bytes=n_bytes / max(1, n_chunks), whitespace_recall=wr, whitespace_precision=wp,
        bpe_precision=bp, bpe_recall=br, bpe_f1=bf,
        entropy_bits=float(ent_all.mean()) if len(ent_all) else float("nan"),
        bpb=nll / (max(1, n_bytes) * math.log(2)), chunk_hist=hist.tolist(),
        **boundary_enrichment(np.concatenate(surprisal) if surprisal else np.zeros(0),
                              np.concatenate(starts) if starts else np.zeros(0, bool)))


# -- UDHR across languages ------------------------------------------------------------------------

CLAUSE_PUNCT = b",.;:!?"


def level_stats(pieces: Sequence[bytes], ends: Sequence[np.ndarray]) -> dict[str, float]:
    """What one level's chunk ends fall on, over pieces of text and their per-byte ends (each
    piece's last byte, a forced end, left out). Shares of the ends on whitespace, on punctuation
    and inside words; words per chunk (word starts: a non-whitespace byte after whitespace);
    word-start recall; and clause recall: the share of clause ends (``,.;:!?`` followed by
    whitespace) where a chunk ends on the punctuation or on the whitespace after it."""
    n_end = n_ws = n_punct = n_words = n_ws_start = n_ws_start_end = n_clause = n_clause_end = n_bytes = 0
    punct_all = np.frombuffer(bytes(range(33, 48)) + bytes(range(58, 65)) + bytes(range(91, 97))
                              + bytes(range(123, 127)), dtype=np.uint8)
    clause = np.frombuffer(CLAUSE_PUNCT, dtype=np.uint8)
    for piece, e in zip(pieces, ends):
        a = np.frombuffer(piece, dtype=np.uint8)
        e = np.asarray(e, bool)[: len(a)].copy()
        if len(a) < 2:
            continue
        e[-1] = False
        ws = np.isin(a, WHITESPACE)
        pu = np.isin(a, punct_all)
        start = np.zeros_like(ws)
        start[1:] = ws[:-1] & ~ws[1:]
        cl = np.zeros_like(ws)
        cl[:-1] = np.isin(a[:-1], clause) & ws[1:]
        cl_hit = np.zeros_like(ws)
        cl_hit[:-1] = cl[:-1] & (e[:-1] | e[1:])
        n_bytes += len(a) - 1
        n_end += int(e.sum())
        n_ws += int((e & ws).sum())
        n_punct += int((e & pu).sum())
        n_words += int(start.sum())
        n_ws_start += int(start.sum())
        n_ws_start_end += int((start & e).sum())
        n_clause += int(cl.sum())
        n_clause_end += int(cl_hit.sum())
    div = lambda a, b: a / b if b else float("nan")  # noqa: E731
    return {"ends": n_end, "bytes_per_chunk": div(n_bytes, n_end), "on_whitespace": div(n_ws, n_end),
            "on_punctuation": div(n_punct, n_end), "inside_words": div(n_end - n_ws - n_punct, n_end),
            "words_per_chunk": div(n_words, n_end), "word_start_recall": div(n_ws_start_end, n_ws_start),
            "clause_recall": div(n_clause_end, n_clause), "clause_ends": n_clause}


def stage_stats(model: nn.Module, docs: Sequence[bytes], **kw) -> dict[str, dict[str, float]]:
    """:func:`level_stats` of each level of a model's chunks ("outer", and "inner" for a two-stage
    U-Net), on the same boundary draws."""
    pieces, res = segment_docs(model, docs, **kw)
    if res and res[0].boundaries is None:
        raise RltokError("this model has no chunk boundaries to analyze")
    out = {"outer": level_stats(pieces, [r.boundaries for r in res])}
    if res and res[0].inner_boundaries is not None:
        out["inner"] = level_stats(pieces, [r.inner_boundaries for r in res])
    return out


@dataclass
class Translation:
    key: str  # file key, e.g. "jpn", "cmn_hans"
    name: str  # language name
    script: str  # ISO 15924
    paragraphs: list[str]

    @property
    def text(self) -> str:
        return "\n".join(self.paragraphs)


def read_udhr(folder: str | Path, keys: Sequence[str] | None = None) -> list[Translation]:
    """The UDHR translations (``udhr_*.xml`` of the "UDHR in Unicode" project) in a folder: the
    titles and paragraphs of the preamble and the articles, in document order (the document title
    and translators' notes, which differ between translations, are left out), whitespace
    collapsed, in Unicode NFC (some files are not, and pretrained BPEs normalize to NFC)."""
    folder = Path(folder)
    files = sorted(folder.glob("udhr_*.xml"))
    if not files:
        raise RltokError(f"{folder}: no udhr_*.xml files (the UDHR in Unicode XML translations)")
    out = []
    for f in files:
        key = f.stem[len("udhr_"):]
        if keys is not None and key not in keys:
            continue
        try:
            root = ET.parse(f).getroot()
        except ET.ParseError as e:
            raise RltokError(f"{f}:{e.position[0]}: malformed XML ({e})") from None
        ns = root.tag[: root.tag.index("}") + 1] if root.tag.startswith("{") else ""
        paras = []
        for section in root:
            if section.tag not in (ns + "preamble", ns + "article"):
                continue
            for el in section.iter():
                if el.tag in (ns + "title", ns + "para"):
                    t = unicodedata.normalize("NFC", " ".join("".join(el.itertext()).split()))
                    if t:
                        paras.append(t)
        if not paras:
            raise RltokError(f"{f}: no preamble or article text")
        out.append(Translation(key=key, name=root.get("n", key), script=root.get("iso15924", ""),
                               paragraphs=paras))
    if keys is not None:
        missing = set(keys) - {t.key for t in out}
        if missing:
            raise RltokError(f"{folder}: no UDHR translation for {', '.join(sorted(missing))}")
    return out


FLORES_SENTENCES = 1012
# FLORES-200's halves: one calibrates rates, the other is scored; never both (issue 39)
FLORES_HALVES = {"calibrate": (0, 506), "score": (506, 1012), "all": (0, 1012)}


def read_flores(folder: str | Path, half: str = "score", keys: Sequence[str] | None = None,
                group: int = 4) -> list[Translation]:
    """FLORES-200 devtest (``LANG_Script.devtest``, 1,012 sentences aligned line by line in every
    file): each language's sentences of one half (``calibrate``: 0-505, ``score``: 506-1011,
    ``all``), in pieces of ``group`` consecutive sentences joined by a newline (consecutive
    devtest sentences mostly come from the same article, so a piece reads as a short paragraph;
    every piece is scored as a document, with BOS), in Unicode NFC. ``keys``: the files to read
    (e.g. ``eng_Latn``); None: all of them."""
    folder = Path(folder)
    if half not in FLORES_HALVES:
        raise RltokError(f"FLORES half {half!r} must be one of {', '.join(FLORES_HALVES)}")
    if group < 1:
        raise RltokError(f"FLORES group={group} must be >= 1")
    files = sorted(folder.glob("*.devtest"))
    if not files:
        raise RltokError(f"{folder}: no *.devtest files (FLORES-200 devtest)")
    lo, hi = FLORES_HALVES[half]
    out = []
    for f in files:
        key = f.stem
        if keys is not None and key not in keys:
            continue
        lines = f.read_text(encoding="utf-8").split("\n")
        if lines and lines[-1] == "":
            lines.pop()
        if len(lines) != FLORES_SENTENCES:
            raise RltokError(f"{f}: {len(lines)} lines, expected FLORES-200 devtest's {FLORES_SENTENCES}")
        sents = [unicodedata.normalize("NFC", x.strip()) for x in lines[lo:hi]]
        paras = ["\n".join(sents[i:i + group]) for i in range(0, len(sents), group)]
        out.append(Translation(key=key, name=key, script=key.split("_")[-1], paragraphs=paras))
    if keys is not None:
        missing = set(keys) - {t.key for t in out}
        if missing:
            raise RltokError(f"{folder}: no FLORES-200 devtest file for {', '.join(sorted(missing))}")
    return out


def translated_only(docs: dict[str, Sequence[str]], reference: str) -> tuple[list[Translation], dict]:
    """A line-aligned translation (the same documents with the same number of lines in every
    language, as po4a writes the Debian Reference) with its untranslated lines removed: line i of
    document j goes from *every* language when some language leaves it as the reference's line i
    (identical after stripping) and that line holds a letter. Lines without letters (blank lines,
    numbers, rules) stay, so what remains is the same content everywhere. Returns the
    translations (one paragraph per document) and what went: per language, the share of its
    lines identical to the reference's and of its bytes removed; overall, the share of line
    positions removed."""
    if reference not in docs:
        raise RltokError(f"translated_only: no reference language {reference!r} among {', '.join(sorted(docs))}")
    ref = [d.split("\n") for d in docs[reference]]
    split = {}
    for lang, ds in docs.items():
        lines = [d.split("\n") for d in ds]
        if [len(x) for x in lines] != [len(x) for x in ref]:
            raise RltokError(f"translated_only: {lang} is not line-aligned with {reference} "
                             f"({[len(x) for x in lines]} lines per document, {reference} {[len(x) for x in ref]})")
        split[lang] = lines
    worded = [[any(c.isalpha() for c in line) for line in d] for d in ref]
    same = {lang: [[a.strip() == b.strip() and w for a, b, w in zip(d, r, ws)] for d, r, ws in zip(lines, ref, worded)]
            for lang, lines in split.items() if lang != reference}
    drop = [[any(same[lang][j][i] for lang in same) for i in range(len(ref[j]))] for j in range(len(ref))]
    out, stats = [], {}
    for lang, lines in split.items():
        kept = ["\n".join(x for x, gone in zip(d, dr) if not gone) for d, dr in zip(lines, drop)]
        before = sum(len(d.encode("utf-8")) for d in docs[lang])
        after = sum(len(d.encode("utf-8")) for d in kept)
        n_lines = sum(len(d) for d in lines)
        identical = sum(sum(d) for d in same[lang]) / max(1, n_lines) if lang in same else None
        stats[lang] = {"lines_identical_to_reference": identical,
                       "bytes_removed": 1 - after / max(1, before), "bytes_kept": after}
        out.append(Translation(key=lang, name=lang, script="", paragraphs=kept))
    n_pos = sum(len(d) for d in drop)
    return out, {"reference": reference, "line_positions": n_pos,
                 "line_positions_removed": sum(sum(d) for d in drop) / max(1, n_pos), "languages": stats}


def cross_language(texts: Sequence[Translation], models: dict[str, nn.Module] | None = None,
                   tokenizers: dict[str, object] | None = None, reference: str = "eng",
                   progress: bool = False, **kw) -> list[dict]:
    """One row per language: bytes, characters, whitespace words; per run, chunks, bytes per
    chunk, chunks per word, bits and bits per byte; per tokenizer, tokens, bytes per token, tokens per word; and each
    count relative to the ``reference`` language (the same text)."""
    models, tokenizers = models or {}, tokenizers or {}
    rows = []
    for i, t in enumerate(texts):
        docs = [p.encode("utf-8") for p in t.paragraphs]
        n_bytes = sum(len(d) for d in docs)
        words = sum(len(p.split()) for p in t.paragraphs)
        row: dict = {"lang": t.key, "name": t.name, "script": t.script, "bytes": n_bytes,
                     "chars": sum(len(p) for p in t.paragraphs), "words": words}
        for name, m in models.items():
            # paragraphs are scored one by one (each with BOS), as documents
            _, res = segment_docs(m, docs, progress=f"{name} {t.key}" if progress else False, **kw)
            chunks = 0
            for r in res:
                e = r.boundaries.copy()
                e[-1] = True
                chunks += int(e.sum())
            bits = sum(r.nll for r in res) / math.log(2)
            row[f"chunks:{name}"] = chunks
            # the information cost of the text: bits, and bits per byte (each piece with BOS)
            row[f"bits:{name}"] = bits
            row[f"bpb:{name}"] = bits / max(1, n_bytes)
            row[f"bytes_per_chunk:{name}"] = n_bytes / max(1, chunks)
            row[f"chunks_per_word:{name}"] = chunks / max(1, words)
        for name, tok in tokenizers.items():
            n_tok = sum(len(token_lengths(tok, d)) for d in docs)
            row[f"tokens:{name}"] = n_tok
            row[f"bytes_per_token:{name}"] = n_bytes / max(1, n_tok)
            row[f"tokens_per_word:{name}"] = n_tok / max(1, words)
        rows.append(row)
    ref = next((r for r in rows if r["lang"] == reference), None)
    if ref is not None:
        for r in rows:
            r["bytes_rel"] = r["bytes"] / ref["bytes"]
            for k in list(r):
                if k.startswith(("chunks:", "tokens:", "bits:")):
                    r[k.split(":")[0] + "_rel:" + k.split(":", 1)[1]] = r[k] / max(1, ref[k])
    return rows


def udhr_table(rows: Sequence[dict], runs: Sequence[str], toks: Sequence[str]) -> str:
    """A Markdown table of :func:`cross_language` rows."""
    head = ["lang", "script", "bytes", "words", "bytes rel"]
    for r in runs:
        head += [f"{r}: bytes/chunk", f"{r}: chunks/word", f"{r}: chunks rel"]
    for t in toks:
        head += [f"{t}: bytes/token", f"{t}: tokens/word", f"{t}: tokens rel"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]

    def f(x, nd=2):
        return "-" if x is None else f"{x:.{nd}f}"

    for row in rows:
        cells = [row["lang"], row["script"], str(row["bytes"]), str(row["words"]), f(row.get("bytes_rel"))]
        for r in runs:
            cells += [f(row[f"bytes_per_chunk:{r}"]), f(row[f"chunks_per_word:{r}"]), f(row.get(f"chunks_rel:{r}"))]
        for t in toks:
            cells += [f(row[f"bytes_per_token:{t}"]), f(row[f"tokens_per_word:{t}"]), f(row.get(f"tokens_rel:{t}"))]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def spread(values) -> dict[str, float]:
    """Spread of a cost across languages: max/min and the coefficient of variation (population std
    over mean); nan for no values."""
    v = np.asarray(list(values), dtype=float)
    if len(v) == 0:
        return {"max_over_min": float("nan"), "cv": float("nan")}
    return {"max_over_min": float(v.max() / v.min()), "cv": float(v.std() / v.mean())}


def disparity(rows: Sequence[dict], key: str) -> dict[str, float]:
    """:func:`spread` of ``key`` over the rows that have it."""
    return spread(r[key] for r in rows if key in r)


def run_bpe_path(cfg, max_bytes: int = 20_000_000):
    """Where :func:`run_bpe` caches the BPE of this data config and target rate."""
    import hashlib
    import json as _json


    # "docs": how fit_docs picks documents (2: a fixed random order across the split)
    key = _json.dumps({"data": cfg.data.__dict__, "rate": cfg.boundary.target_rate, "max_bytes": max_bytes,
                       "docs": 2}, sort_keys=True)
    return cache_dir() / "bpe" / (hashlib.sha256(key.encode()).hexdigest()[:16] + ".json")


def run_bpe(cfg, max_bytes: int = 20_000_000, progress: bool = False):
    """A BPE trained on the run's training split, its vocabulary fitted so that its tokens per byte
    match the run's target rate (the comparison the paper's BPE guidance makes). Cached under
    ``$RLTOK_CACHE/bpe/`` by (data source, split, rate). Returns (tokenizer, label)."""
    import sys


    rate = cfg.boundary.target_rate
    path = run_bpe_path(cfg, max_bytes)
    if not path.is_file():
        # processes that need the same BPE at once (parallel analyses, study cells) fit it once
        with held(path.with_name(path.name + ".lock")):
            if not path.is_file():
                if progress:
                    print(f"rltok: fitting a BPE to rate {rate} on the training split of {cfg.data.source} "
                          f"(cached in {path})", file=sys.stderr)
                tok, size, achieved = fit_bpe_to_rate(fit_docs(load_splits(cfg).train, max_bytes), rate)
                save_tokenizer(tok, path, {"source": cfg.data.source, "target_rate": rate, "vocab_size": size,
                                           "tokens_per_byte": achieved})
    tok = load_tokenizer(path)
    return tok, f"bpe{tok.get_vocab_size()}"
