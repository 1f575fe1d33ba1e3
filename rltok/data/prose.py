"""``prose``: real English prose (Wikipedia articles and Project Gutenberg books) in leak-free splits.

The text lives outside the repository, in a folder holding ``wikipedia_en/`` (WikiExtractor output,
``<doc id url title>...</doc>`` blocks in ``wiki_00..wiki_63``: 96,339 articles, most of them stubs)
and ``gutenberg/`` (221 books as ``<blob>.txt`` with ``MANIFEST.tsv`` naming ``<Author>/<Title>.txt``;
each keeps its Project Gutenberg header and footer). ``--data prose`` finds it at
``$RLTOK_PROSE_DIR``, else ``$RLTOK_SHARED_DATA/prose``, else ``<repo>/../shared/data/prose``;
``--data PATH`` to such a folder also works. Provenance: ../shared/data/SOURCES.md.

Documents:

* an article is ``Title\\n\\nbody\\n`` (WikiExtractor's text, one paragraph or heading a line);
  articles with no body (a title only) are dropped;
* a book loses its Project Gutenberg header, footer and licence (``strip_gutenberg``), its CRLF
  line ends become LF and its hard-wrapped paragraphs are unwrapped: the lines of a paragraph are
  joined by single spaces, paragraphs are separated by one blank line; a paragraph that is not
  wrapped prose (verse, a play's speaker line, a table, a heading) keeps its line breaks
  (``unwrap_paragraphs``).

The split is by source unit, before anything is cut, by a keyed hash of the unit's id with
``data.split_seed`` (as ``split_corpus``): a Wikipedia article is a unit (its page id); for the
books the unit is an **author group**: the MANIFEST author folder joined with every name in the
book's header (Author, Translator, Illustrator, Editor) by surname, transitively, so that one
writer's books never straddle splits even when the crawl filed them under a translator or an
illustrator (Tolstoy under the Maudes, Constance Garnett and Isabel Hapgood; Plato under Jowett;
the Iliad under its translator). Matching by surname alone merges a few unrelated folders too
(Carolyn Wells with H. G. Wells): that only makes a unit larger, never leaks. No piece of an
article, book or author group is in two splits.

* **test** (fixed, 1,000 documents): 800 Wikipedia articles of at least 500 bytes, whole, and 200
  pieces of at most 8 KiB (cut at paragraph boundaries after the split) of the books of 8 held-out
  author groups, taken round-robin over their books; shuffled (a prefix keeps the mix).
* **validation** (fixed, 500 documents): 400 articles of at least 500 bytes and 100 pieces of the
  books of 4 other held-out author groups, shuffled: a second held-out slice of the test domain,
  for early checks and rate calibration.
* **train**: every other article with a body (short ones included) and every book of the other
  author groups, cut into pieces of at most 64 KiB at paragraph boundaries, shuffled by
  ``split_seed`` so that any prefix of the training bytes already has the mix.

Held-out candidates are drawn in hash order from a pool larger than needed (1.5x); the rest of
the pool and the unused pieces of held-out books are discarded (they never reach training).

Near-duplicates across splits: the fraction of a document's 64-byte segments (aligned at 0, 64,
...; a tail under 64 ignored) found verbatim anywhere in the training split (``segments_in``) is
measured for every candidate; a candidate above 5% is dropped (templated articles that share
sentences with training ones, quotations, duplicated editions). The figures kept are
``test_segments_in_train`` (the build fails at 0.5% or more) and ``val_segments_in_train``.

With the shared data (96,339 articles, 36,183 of them with a body; 221 books, 77 author groups)
and the default seed (``prose_stats()`` gives the figures, ``stats.json`` beside the cache):

=========  =================================  ==================================  ===========
split      Wikipedia                          Gutenberg                           total
=========  =================================  ==================================  ===========
train      34,386 articles, 52.50 MB (42.1%)  1,200 pieces of 185 books, 72.11 MB  124.61 MB
val        400 articles, 1.02 MB              100 pieces of 13 books, 0.74 MB      1.76 MB
test       800 articles, 2.24 MB              200 pieces of 23 books, 1.51 MB      3.75 MB
=========  =================================  ==================================  ===========

Near-duplicates dropped: 171 test and 75 validation candidate articles, no book piece. Segments
found in training: test 0.089%, validation 0.107%. The build takes about 30 s on one core.

The built splits are cached as memory-mapped arrays under the rltok cache folder
(``$RLTOK_CACHE``, default ``~/.cache/rltok``) in ``prose-v1-s<seed>-<fingerprint>/``, keyed by
the version, the seed and the names and sizes of the source files, with ``stats.json``
(documents and bytes per split and per source, dropped near-duplicates, leakage figures). Two
processes starting at once build it once (``fetch_once``'s lock).

The run's data settings, for this source: ``data.test_docs`` = 0 (the default) means the fixed
1,000-document test split and N > 0 its first N documents; ``data.val_docs`` = -1 (the default)
means the fixed 500-document validation split and N >= 0 its first N; asking for more than the
split holds is an error. ``data.min_doc_bytes`` filters the training split only (the held-out
splits are fixed); ``data.max_doc_bytes`` does not apply (training pieces are at most 64 KiB).
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
import sys
import time
import unicodedata
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Iterable

import numpy as np

from ..errors import RltokError
from .corpus import Corpus, Splits

NAME = "prose"
VERSION = "prose-v1"  # in the cache key: change it whenever the documents or the split would change
WIKI, BOOKS = "wikipedia_en", "gutenberg"
SOURCES = ("wikipedia", "gutenberg")  # per-document source labels: 0, 1
SEG = 64
LEAK_LIMIT = 0.005  # test segments found in training: the build fails above this


@dataclass(frozen=True)
class ProseSpec:
    """How the splits are drawn (the defaults are ``--data prose``; tests build smaller ones)."""

    test_wiki: int = 800
    test_books: int = 200
    val_wiki: int = 400
    val_books: int = 100
    test_groups: int = 8  # author groups held out for the test split
    val_groups: int = 4  # and for validation
    heldout_min_bytes: int = 500  # held-out articles: at least this long
    heldout_piece_bytes: int = 8192  # held-out book pieces: at most this long ...
    heldout_piece_min: int = 1024  # ... and at least this long
    train_piece_bytes: int = 65536  # training documents: at most this long
    dup_threshold: float = 0.05  # held-out candidates with more of their segments in training are dropped
    pool_factor: float = 1.5  # candidates drawn per held-out document needed
    max_wiki_files: int = 0  # 0: all (a smaller number: tests)
    max_books: int = 0  # 0: all

    def key(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)


SPEC = ProseSpec()  # what ``--data prose`` builds (tests swap in a smaller one)


# -- locating the data ------------------------------------------------------------------------------

def _repo_root() -> Path:
    return Path(__file__).resolve().parents[2]


def is_prose_dir(path: str | os.PathLike) -> bool:
    """A folder holding ``wikipedia_en/`` (with wiki_* files) and/or ``gutenberg/`` (with MANIFEST.tsv)."""
    p = Path(path).expanduser()
    return (any((p / WIKI).glob("wiki_*")) if (p / WIKI).is_dir() else False) or (p / BOOKS / "MANIFEST.tsv").is_file()


def is_prose_source(source: str) -> bool:
    """``prose``, or a path to a prose folder (not a prepared directory)."""
    if source == NAME:
        return True
    try:
        p = Path(source).expanduser()
        return p.is_dir() and not (p / "manifest.json").is_file() and is_prose_dir(p)
    except OSError:
        return False


def prose_candidates() -> list[tuple[str, Path]]:
    """Where ``--data prose`` looks, in order: (what, folder)."""
    out = []
    if os.environ.get("RLTOK_PROSE_DIR"):
        out.append(("$RLTOK_PROSE_DIR", Path(os.environ["RLTOK_PROSE_DIR"]).expanduser()))
    if os.environ.get("RLTOK_SHARED_DATA"):
        out.append(("$RLTOK_SHARED_DATA/prose", Path(os.environ["RLTOK_SHARED_DATA"]).expanduser() / NAME))
    out.append(("<repo>/../shared/data/prose", _repo_root().parent / "shared" / "data" / NAME))
    return out


def prose_root(source: str = NAME) -> Path:
    """The prose folder a data source names, or one line saying where it looked."""
    if source != NAME:
        p = Path(source).expanduser()
        if is_prose_dir(p):
            return p.resolve()
        raise RltokError(f"data source {source!r}: not a prose folder (no {WIKI}/wiki_* or {BOOKS}/MANIFEST.tsv)")
    tried = prose_candidates()
    for what, p in tried:
        if is_prose_dir(p):
            return p.resolve()
        if what == "$RLTOK_PROSE_DIR":  # set, and wrong: no quiet fallback to other data
            raise RltokError(f"data source 'prose': RLTOK_PROSE_DIR={p} is not a prose folder (no {WIKI}/wiki_* "
                             f"or {BOOKS}/MANIFEST.tsv)")
    where = ", ".join(f"{what} ({p})" for what, p in tried)
    raise RltokError(f"data source 'prose': no prose folder ({WIKI}/ and {BOOKS}/) found; looked at {where}; "
                     f"set RLTOK_PROSE_DIR to the folder (or RLTOK_SHARED_DATA to its parent)")


# -- Wikipedia ----------------------------------------------------------------------------------------

_DOC_RE = re.compile(rb'<doc id="([^"]*)"[^>]*>\n?(.*?)</doc>', re.S)
# markup WikiExtractor left in (escaped): references, line breaks, transclusion markers
_WIKI_REF = re.compile(rb"<ref\b[^>]*?/>|<ref\b[^>]*>.*?</ref\s*>", re.S | re.I)
_WIKI_TAG = re.compile(rb"</?(?:ref|br|section|onlyinclude|includeonly|noinclude|poem|mapframe|small|center)\b[^>]*>",
                       re.I)


def _wiki_clean(body: bytes) -> bytes:
    for ent, ch in ((b"&lt;", b"<"), (b"&gt;", b">"), (b"&quot;", b'"'), (b"&amp;", b"&")):
        body = body.replace(ent, ch)
    body = _WIKI_REF.sub(b"", body)
    return _WIKI_TAG.sub(lambda m: b" " if m.group(0)[1:3].lower() == b"br" else b"", body)


def wiki_articles(text: bytes) -> Iterable[tuple[str, bytes]]:
    """(page id, document) of each WikiExtractor block with a body; a document is
    ``Title\\n\\nbody\\n``, with the HTML entities WikiExtractor escaped unescaped and the
    markup it left (references, ``<br>``, transclusion tags) removed."""
    for m in _DOC_RE.finditer(text.replace(b"\r\n", b"\n")):
        lines = [ln.rstrip() for ln in _wiki_clean(m.group(2)).strip().split(b"\n")]
        title = lines[0].strip() if lines else b""
        body = b"\n".join(ln for ln in lines[1:] if ln).strip()
        if body:
            yield m.group(1).decode("utf-8", "replace"), title + b"\n\n" + body + b"\n"


def wiki_files(root: Path, spec: ProseSpec) -> list[Path]:
    files = sorted(p for p in (root / WIKI).glob("wiki_*") if p.is_file()) if (root / WIKI).is_dir() else []
    return files[:spec.max_wiki_files] if spec.max_wiki_files > 0 else files


# -- Project Gutenberg --------------------------------------------------------------------------------

# where the header ends: the modern start line; the end of the old "small print" licence, which
# early e-texts carry in their header
_PG_START = re.compile(
    rb"^[ \t]*\*{3}[ \t]*START OF (?:THE|THIS) PROJECT GUTENBERG[^\n]*$"
    rb"|^[ \t]*\*+[ \t]*END[ *]*THE SMALL PRINT[^\n]*$", re.M | re.I)
# the footer line proper: "*** END OF THE/THIS PROJECT GUTENBERG EBOOK ...", "End of (the/this)
# Project Gutenberg('s) EBook/Etext ..."; and where the footer may start: those, or a small print
# placed at the end
_PG_FOOTER = re.compile(
    rb"^[ \t]*\*{3}[ \t]*END OF (?:THE|THIS) PROJECT GUTENBERG|^[ \t]*End of (?:the |this )?Project Gutenberg",
    re.M | re.I)
_PG_END = re.compile(_PG_FOOTER.pattern + rb"|^[ \t]*\**[ \t]*START\**[ \t]*THE SMALL PRINT", re.M | re.I)
# producer credits and notes about the e-text, among the first paragraphs after the header
_PG_CREDIT = re.compile(
    rb"^(?:Produced by|This (?:e-?text|e-?book) (?:was|is) (?:produced|prepared|created)|E-?text prepared by"
    rb"|E-?text scanned by|Prepared by|Transcribed (?:from|by)|Scanned(?: and proofed)? by|HTML version by"
    rb"|Text file produced by|Updated editions will replace)"
    rb"|Project Gutenberg|gutenberg\.(?:org|net)|ibiblio\.org|pgdp\.net|Distributed Proofreading", re.I)
_CREDIT_PARAS = 6
# a paragraph anywhere in the book that speaks of Project Gutenberg: a producer's or transcriber's note
_PG_MENTION = re.compile(rb"Project\s+Gutenberg|gutenberg\.(?:org|net)|pgdp\.net|promo\.net/pg", re.I)


def normalize_newlines(text: bytes) -> bytes:
    text = text[3:] if text.startswith(b"\xef\xbb\xbf") else text
    return text.replace(b"\r\n", b"\n").replace(b"\r", b"\n")


def strip_gutenberg(text: bytes) -> bytes:
    """A Project Gutenberg e-text without its header (and the old 'small print' licence that
    early e-texts carry there), its footer and licence, the producer credits that open it and any
    paragraph that speaks of Project Gutenberg (producers' and transcribers' notes). Newlines are
    normalised to LF."""
    text = normalize_newlines(text)
    # the header ends at the last start marker before the first footer line proper (an old
    # e-text may carry its small print after the footer, not in the header)
    footer = _PG_FOOTER.search(text)
    starts = list(_PG_START.finditer(text, 0, footer.start() if footer else len(text)))
    if starts:
        m = max(starts, key=lambda m: m.end())
        pos = m.end()
        if b"START" in m.group(0).upper() and not m.group(0).rstrip().endswith(b"***"):
            nxt = text.find(b"\n", pos + 1)  # a start line continued on the next line, up to its ***
            line = text[pos + 1:nxt if nxt >= 0 else len(text)]
            if line.rstrip().endswith(b"***"):
                pos += 1 + len(line)
        text = text[pos:]
    end = _PG_END.search(text)
    if end:
        text = text[:end.start()]
    paras = [p for p in re.split(rb"\n[ \t]*\n", text.strip()) if p.strip()]
    head = [p for p in paras[:_CREDIT_PARAS] if not _PG_CREDIT.search(p)]
    paras = [p for p in head + paras[_CREDIT_PARAS:] if not _PG_MENTION.search(p)]
    return b"\n\n".join(paras).strip() + b"\n" if paras else b""


def _chars(line: bytes) -> int:
    return len(line.decode("utf-8", "replace"))


def _wrap_width(lengths: list[int]) -> int:
    """The width a text was wrapped at: the 95th percentile of its line lengths (characters), at
    least 64 (so that a book of verse, whose lines are all short, is not taken for prose)."""
    lens = sorted(n for n in lengths if n)
    return max(64, lens[int(0.95 * (len(lens) - 1))] if lens else 0)


def _is_wrapped(lines: list[bytes], lens: list[int], width: int) -> bool:
    """Lines of a paragraph filled up to ``width`` (all but the last): the next line's first word
    would not have fitted on the line before (within 3 characters), for 3 in 4 line ends."""
    if len(lines) < 2:
        return False
    full = 0
    for i in range(len(lines) - 1):
        nxt = lines[i + 1].split(None, 1)
        if lens[i] + 1 + (_chars(nxt[0]) if nxt else 0) > width - 3:
            full += 1
    return full >= 0.75 * (len(lines) - 1)


def unwrap_paragraphs(text: bytes) -> list[bytes]:
    """The paragraphs of a hard-wrapped text (LF newlines): wrapped prose joined into one line
    with single spaces; verse, speaker lines, tables and headings keep their line breaks (each
    line stripped). Blank lines separate paragraphs; empty ones are dropped."""
    blocks = re.split(rb"\n[ \t]*\n", text)
    raw = [[ln.strip() for ln in blk.split(b"\n")] for blk in blocks]
    raw = [[ln for ln in blk if ln] for blk in raw]
    lens = [[_chars(ln) for ln in blk] for blk in raw]
    width = _wrap_width([n for blk in lens for n in blk])
    out = []
    for lines, ls in zip(raw, lens):
        if lines:
            out.append((b" " if _is_wrapped(lines, ls, width) else b"\n").join(lines))
    return out


def book_paragraphs(raw: bytes) -> list[bytes]:
    """A Project Gutenberg file as clean paragraphs: header and footer stripped, LF, unwrapped."""
    return unwrap_paragraphs(strip_gutenberg(raw))


def book_text(raw: bytes) -> bytes:
    paras = book_paragraphs(raw)
    return b"\n\n".join(paras) + b"\n" if paras else b""


_NAME_FIELD = re.compile(rb"^(?:Author|Translator|Illustrator|Editor|Translated by|Edited by|Illustrated by)s?"
                         rb"[ \t]*:?[ \t]*(.+)$", re.M | re.I)
_NOT_NAMES = {"various", "anonymous", "unknown", "al", "others", ""}
_TITLES = re.compile(r"\b(?:sir|dr|capt|count|graf|jr|sr|rev|mrs?|miss|lord|lady|et al)\b\.?", re.I)
# surnames spelled differently in different books of this collection
_ALIASES = {"tolstoi": "tolstoy", "turgenieff": "turgenev", "dostoievski": "dostoyevsky"}


def _surnames(name: str, folder: bool = False) -> list[str]:
    """Surname keys of a name field: "Last, First" (a MANIFEST folder) or "First Last" (a header
    field, possibly several names joined by "and" or commas)."""
    name = unicodedata.normalize("NFKD", name).encode("ascii", "ignore").decode().lower()
    name = re.sub(r"\([^)]*\)|\[[^\]]*\]", " ", name)
    parts = [name.split(",")[0]] if folder else re.split(r",|;|&|\band\b", name)
    keys = []
    for part in parts:
        words = re.findall(r"[a-z][a-z'-]*", _TITLES.sub(" ", part))
        words = [w for w in words if w not in ("pere", "fils", "von", "de", "van", "der")] or words
        if words and words[-1] not in _NOT_NAMES and len(words[-1]) > 1:
            keys.append(_ALIASES.get(words[-1], words[-1]))
    return keys


def header_names(raw: bytes) -> list[str]:
    """Author, translator, illustrator and editor names in a Project Gutenberg header."""
    head = normalize_newlines(raw[:8000])
    start = _PG_START.search(head)
    head = head[:start.start()] if start else head
    return [m.group(1).decode("utf-8", "replace").strip() for m in _NAME_FIELD.finditer(head)]


@dataclass
class Book:
    path: str  # Author/Title.txt (MANIFEST)
    file: Path
    folder: str  # the MANIFEST author
    names: list[str]  # header names
    group: str = ""  # author group id: its first folder name in sorted order


def read_manifest(root: Path, spec: ProseSpec) -> list[Book]:
    man = root / BOOKS / "MANIFEST.tsv"
    if not man.is_file():
        return []
    books = []
    for lineno, line in enumerate(man.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        cols = line.split("\t")
        if len(cols) < 3 or "/" not in cols[2]:
            raise RltokError(f"{man}:{lineno}: expected 'blob<TAB>bytes<TAB>Author/Title.txt'")
        f = root / BOOKS / f"{cols[0]}.txt"
        if not f.is_file():
            raise RltokError(f"{man}:{lineno}: {f.name} is missing")
        books.append(Book(path=cols[2], file=f, folder=cols[2].split("/")[0], names=[]))
    return books[:spec.max_books] if spec.max_books > 0 else books


def group_authors(books: list[Book]) -> None:
    """Set each book's author group: folders joined through shared surnames (union-find)."""
    parent: dict[str, str] = {}

    def find(x: str) -> str:
        while parent.setdefault(x, x) != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    def union(a: str, b: str) -> None:
        ra, rb = find(a), find(b)
        if ra != rb:
            parent[max(ra, rb)] = min(ra, rb)

    for b in books:
        node = "folder:" + b.folder
        find(node)
        for key in _surnames(b.folder, folder=True) + [k for n in b.names for k in _surnames(n)]:
            union(node, "name:" + key)
    members: dict[str, list[str]] = {}
    for b in books:
        members.setdefault(find("folder:" + b.folder), []).append(b.folder)
    for b in books:
        b.group = min(members[find("folder:" + b.folder)])


# -- cutting ------------------------------------------------------------------------------------------

def _split_long(p: bytes, limit: int) -> list[bytes]:
    """A paragraph longer than ``limit`` cut at line breaks, else spaces, else anywhere."""
    out = []
    while len(p) > limit:
        cut = p.rfind(b"\n", 0, limit + 1)
        if cut <= 0:
            cut = p.rfind(b" ", 0, limit + 1)
        if cut <= 0:
            cut = limit
        out.append(p[:cut].strip())
        p = p[cut:].strip()
    out.append(p)
    return [x for x in out if x]


def pack(paragraphs: list[bytes], limit: int, sep: bytes = b"\n\n") -> list[bytes]:
    """Pieces of at most ``limit`` bytes (each ending in a newline), cut at paragraph boundaries."""
    pieces, cur, size = [], [], 0
    for p in paragraphs:
        for q in _split_long(p, limit - 1) if len(p) > limit - 1 else [p]:
            add = len(q) + (len(sep) if cur else 0)
            if cur and size + add + 1 > limit:
                pieces.append(sep.join(cur) + b"\n")
                cur, size = [], 0
                add = len(q)
            cur.append(q)
            size += add
    if cur:
        pieces.append(sep.join(cur) + b"\n")
    return pieces


# -- 64-byte segments in training -------------------------------------------------------------------------

_MASK64 = (1 << 64) - 1
_BASES = (0x9E3779B97F4A7C15, 0xC2B2AE3D27D4EB4F, 0x165667B19E3779F9, 0xD6E8FEB86659FD93)
_CHUNK = 1 << 22


def _powers(base: int, n: int) -> np.ndarray:
    p = np.full(n, base, dtype=np.uint64)
    p[0] = 1
    return np.cumprod(p, out=p)


def _segments(corpus: Corpus, seg: int) -> tuple[np.ndarray, np.ndarray]:
    """Start (in ``corpus.data``) and document of each aligned segment: offsets 0, seg, ... of
    each document, a tail under ``seg`` ignored."""
    starts = np.asarray(corpus.offsets[:-1], dtype=np.int64)
    counts = np.asarray(corpus.lengths, dtype=np.int64) // seg
    doc = np.repeat(np.arange(len(counts), dtype=np.int64), counts)
    first = np.cumsum(counts) - counts
    j = np.arange(int(counts.sum()), dtype=np.int64) - np.repeat(first, counts)
    return starts[doc] + j * seg, doc


def segment_hits(train: Corpus, other: Corpus, seg: int = SEG) -> tuple[np.ndarray, np.ndarray]:
    """For each aligned ``seg``-byte segment of ``other`` (see ``segments_in``): whether it occurs
    verbatim in a training document, and which document of ``other`` it is in.

    Every window of every training document (each byte offset, not crossing a document end) is
    hashed with a polynomial rolling hash mod 2^64 (vectorised: prefix sums of ``b[i] * B^i``,
    then multiplied by ``B^-s``); a window whose hash is one of the segments' is compared byte by
    byte, so a hash collision can never count as a hit."""
    pos, doc = _segments(other, seg)
    found = np.zeros(len(pos), dtype=bool)
    if len(pos) == 0 or len(train) == 0:
        return found, doc
    odata = np.asarray(other.data)
    segs = odata[pos[:, None] + np.arange(seg)]
    uniq, inverse = np.unique(segs, axis=0, return_inverse=True)
    inverse = inverse.reshape(-1)
    for base in _BASES:  # a base under which the distinct segments' hashes are distinct
        pw = _powers(base, _CHUNK + seg)
        qh = (uniq.astype(np.uint64) * pw[:seg]).sum(axis=1, dtype=np.uint64)
        if len(np.unique(qh)) == len(qh):
            break
    else:  # pragma: no cover  (needs a 64-bit collision under four bases)
        raise RuntimeError("segment hashes collide under every base")
    order = np.argsort(qh)
    qh_sorted = qh[order]
    bitmap = np.zeros(1 << 24, dtype=bool)
    bitmap[qh_sorted >> np.uint64(40)] = True
    ipw = _powers(pow(base, -1, 1 << 64), _CHUNK)
    hit = np.zeros(len(uniq), dtype=bool)
    tdata = np.asarray(train.data)
    toffs = np.asarray(train.offsets, dtype=np.int64)
    lo_all, hi_all = int(toffs[0]), int(toffs[-1])
    ar = np.arange(seg)
    for a in range(lo_all, hi_all - seg + 1, _CHUNK):
        n_win = min(_CHUNK, hi_all - seg + 1 - a)
        x = tdata[a:a + n_win + seg - 1].astype(np.uint64)
        q = np.empty(len(x) + 1, dtype=np.uint64)
        q[0] = 0
        np.cumsum(x * pw[:len(x)], out=q[1:])
        h = (q[seg:] - q[:-seg]) * ipw[:n_win]
        cand = np.flatnonzero(bitmap[h >> np.uint64(40)])
        if len(cand) == 0:
            continue
        hc = h[cand]
        k = np.searchsorted(qh_sorted, hc)
        k[k == len(qh_sorted)] = 0
        ok = qh_sorted[k] == hc
        cand, k = cand[ok], order[k[ok]]
        keep = ~hit[k]
        cand, k = cand[keep], k[keep]
        if len(cand) == 0:
            continue
        s = a + cand
        d = np.searchsorted(toffs, s, side="right") - 1
        inside = s + seg <= toffs[d + 1]
        s, k = s[inside], k[inside]
        # verify byte by byte (the first window per segment; all of them where that one differs)
        _, first = np.unique(k, return_index=True)
        same = (tdata[s[first][:, None] + ar] == uniq[k[first]]).all(axis=1)
        hit[k[first][same]] = True
        rest = ~hit[k]
        if rest.any():
            s2, k2 = s[rest], k[rest]
            same2 = (tdata[s2[:, None] + ar] == uniq[k2]).all(axis=1)
            hit[k2[same2]] = True
    found = hit[inverse]
    return found, doc


def segments_in(train: Corpus, other: Corpus, seg: int = SEG) -> float:
    """The fraction of ``other``'s ``seg``-byte segments (each document's bytes 0..seg-1,
    seg..2*seg-1, ...; a tail under ``seg`` ignored) that occur verbatim anywhere in ``train`` (at
    any byte offset inside one of its documents). 0.0 when ``other`` has no full segment."""
    found, _ = segment_hits(train, other, seg)
    return float(found.mean()) if len(found) else 0.0


def doc_fractions(found: np.ndarray, doc: np.ndarray, n_docs: int) -> np.ndarray:
    """Per document: the fraction of its segments found (0 for a document with none)."""
    n = np.bincount(doc, minlength=n_docs)
    k = np.bincount(doc, weights=found.astype(np.float64), minlength=n_docs)
    return np.divide(k, n, out=np.zeros(n_docs), where=n > 0)


# -- the build --------------------------------------------------------------------------------------

def _rank(key: bytes, unit: str) -> bytes:
    return hashlib.blake2b(unit.encode("utf-8", "surrogatepass"), key=key, digest_size=8).digest()


def _seed_key(split_seed: int) -> bytes:
    return int(split_seed).to_bytes(8, "little", signed=True)


@dataclass
class Built:
    docs: dict[str, list[bytes]]  # train, val, test
    sources: dict[str, np.ndarray]  # per document: 0 wikipedia, 1 gutenberg
    stats: dict


def _split_stats(docs: list[bytes], src: np.ndarray) -> dict:
    lens = np.array([len(d) for d in docs], dtype=np.int64)
    out = {}
    for i, name in enumerate(SOURCES):
        m = src == i
        out[name] = {"docs": int(m.sum()), "bytes": int(lens[m].sum())}
    out["total"] = {"docs": len(docs), "bytes": int(lens.sum())}
    return out


def build_prose(root: Path, split_seed: int = 1234, spec: ProseSpec | None = None, log=None) -> Built:
    """Read, clean and split the prose folder ``root`` (no cache; ``load_prose`` caches)."""
    t0 = time.time()
    spec = spec or SPEC
    log = log or (lambda msg: None)
    key = _seed_key(split_seed)

    # Wikipedia: articles by page id (a repeated id keeps its first article)
    articles: dict[str, bytes] = {}
    repeated = 0
    for f in wiki_files(root, spec):
        for pid, doc in wiki_articles(f.read_bytes()):
            if pid in articles:
                repeated += 1
                continue
            articles[pid] = doc
    log(f"{len(articles):,} Wikipedia articles with a body")

    # books: cleaned paragraphs, author groups
    books = read_manifest(root, spec)
    paras: dict[str, list[bytes]] = {}
    for b in books:
        raw = b.file.read_bytes()
        b.names = header_names(raw)
        paras[b.path] = book_paragraphs(raw)
    group_authors(books)
    log(f"{len(books)} books, {len({b.group for b in books})} author groups")

    # -- the unit split (nothing cut yet) --
    eligible = sorted((_rank(key, "wiki:" + pid), pid) for pid, d in articles.items()
                      if len(d) >= spec.heldout_min_bytes)
    n_pool = min(len(eligible), math.ceil(spec.pool_factor * (spec.test_wiki + spec.val_wiki)))
    wiki_pool = [pid for _, pid in eligible[:n_pool]]
    pool_set = set(wiki_pool)
    groups = sorted({b.group for b in books}, key=lambda g: _rank(key, "author:" + g))
    test_groups = groups[:spec.test_groups]
    val_groups = groups[spec.test_groups:spec.test_groups + spec.val_groups]
    role = {g: "test" for g in test_groups} | {g: "val" for g in val_groups}

    # -- training: everything else, cut, shuffled --
    train_items: list[tuple[bytes, bytes, int]] = []  # (rank, doc, source)
    for pid, d in articles.items():
        if pid in pool_set:
            continue
        pieces = ([d] if len(d) <= spec.train_piece_bytes
                  else pack(d.rstrip(b"\n").split(b"\n"), spec.train_piece_bytes, b"\n"))
        for i, p in enumerate(pieces):
            train_items.append((_rank(key, f"wiki:{pid}:{i}"), p, 0))
    for b in books:
        if b.group in role:
            continue
        for i, p in enumerate(pack(paras[b.path], spec.train_piece_bytes)):
            train_items.append((_rank(key, f"book:{b.path}:{i}"), p, 1))
    train_items.sort(key=lambda t: t[0])
    train_docs = [d for _, d, _ in train_items if d.strip()]
    train_src = np.array([s for _, d, s in train_items if d.strip()], dtype=np.uint8)
    train = Corpus.from_docs(train_docs, name="prose-train")

    # -- held-out candidates: articles in hash order; book pieces round-robin over the books --
    def book_pool(names: list[str], need: int) -> list[tuple[str, bytes]]:
        per_book = []
        for b in sorted((b for b in books if b.group in names), key=lambda b: _rank(key, "book:" + b.path)):
            ps = [p for p in pack(paras[b.path], spec.heldout_piece_bytes) if len(p) >= spec.heldout_piece_min]
            ps = [p for _, p in sorted(((_rank(key, f"piece:{b.path}:{i}"), p) for i, p in enumerate(ps)),
                                       key=lambda t: t[0])]
            per_book.append((b.path, ps))
        out = []
        for j in range(max((len(ps) for _, ps in per_book), default=0)):
            out.extend((f"{path}#{j}", ps[j]) for path, ps in per_book if j < len(ps))
        return out[:math.ceil(spec.pool_factor * need)]

    cands: list[tuple[str, str, bytes, int]] = []  # (role, unit id, doc, source)
    cands += [("wiki", pid, articles[pid], 0) for pid in wiki_pool]
    cands += [("test_books", u, d, 1) for u, d in book_pool(test_groups, spec.test_books)]
    cands += [("val_books", u, d, 1) for u, d in book_pool(val_groups, spec.val_books)]
    pool = Corpus.from_docs([d for _, _, d, _ in cands])
    found, segdoc = segment_hits(train, pool)
    frac = doc_fractions(found, segdoc, len(cands))
    nseg = np.bincount(segdoc, minlength=len(cands))
    nhit = np.bincount(segdoc, weights=found.astype(np.float64), minlength=len(cands))
    log(f"near-duplicate check of {len(cands):,} held-out candidates against {train.total_bytes / 1e6:.1f} MB "
        f"of training text: {time.time() - t0:.0f} s so far")

    chosen: dict[str, list[int]] = {"test": [], "val": []}
    dropped = {"test": {"wikipedia": 0, "gutenberg": 0}, "val": {"wikipedia": 0, "gutenberg": 0}}
    wanted = {("wiki", "test"): spec.test_wiki, ("wiki", "val"): spec.val_wiki,
              ("test_books", "test"): spec.test_books, ("val_books", "val"): spec.val_books}
    taken = dict.fromkeys(wanted, 0)
    for i, (r, _, _, s) in enumerate(cands):
        dest = ("test" if taken[("wiki", "test")] < spec.test_wiki else "val") if r == "wiki" else r[:-6]
        if (r, dest) not in wanted or taken[(r, dest)] >= wanted[(r, dest)]:
            continue  # a spare candidate: discarded
        if frac[i] > spec.dup_threshold:
            dropped[dest][SOURCES[s]] += 1
            continue
        chosen[dest].append(i)
        taken[(r, dest)] += 1
    for (r, dest), n in wanted.items():
        if taken[(r, dest)] < n:
            what = "Wikipedia articles" if r == "wiki" else "book pieces"
            raise RltokError(f"prose corpus at {root}: only {taken[(r, dest)]} of {n} {dest} {what} left after the "
                             f"near-duplicate check (too little data for the split; a smaller ProseSpec?)")

    out_docs = {"train": train_docs}
    out_src = {"train": train_src}
    leakage = {}
    held_books = {}
    for name in ("val", "test"):
        idx = sorted(chosen[name], key=lambda i: _rank(key, f"{name}:{cands[i][1]}"))  # mixed sources
        held_books[name] = len({cands[i][1].rsplit("#", 1)[0] for i in idx if cands[i][3] == 1})
        out_docs[name] = [cands[i][2] for i in idx]
        out_src[name] = np.array([cands[i][3] for i in idx], dtype=np.uint8)
        segs = int(nseg[idx].sum())
        leakage[f"{name}_segments_in_train"] = float(nhit[idx].sum() / segs) if segs else 0.0
        leakage[f"{name}_segments"] = segs
    if leakage["test_segments_in_train"] >= LEAK_LIMIT:
        raise RltokError(f"prose corpus at {root}: {100 * leakage['test_segments_in_train']:.2f}% of the test split's "
                         f"64-byte segments occur in training (limit {100 * LEAK_LIMIT:.1f}%)")

    splits = {name: _split_stats(out_docs[name], out_src[name]) for name in ("train", "val", "test")}
    tb = splits["train"]
    stats = {
        "version": VERSION, "split_seed": split_seed, "root": str(root), "spec": asdict(spec),
        "splits": splits,
        "mixture": {s: round(tb[s]["bytes"] / max(1, tb["total"]["bytes"]), 4) for s in SOURCES},
        "units": {
            "wikipedia": {"articles": len(articles), "held_out_pool": len(wiki_pool), "repeated_ids": repeated},
            "gutenberg": {"books": len(books), "author_groups": len(groups),
                          "test_groups": test_groups, "val_groups": val_groups,
                          "train_books": sum(b.group not in role for b in books),
                          "val_books": held_books["val"], "test_books": held_books["test"],
                          "groups": {g: sorted({b.folder for b in books if b.group == g}) for g in groups
                                     if len({b.folder for b in books if b.group == g}) > 1}},
        },
        "dedup": {"segment_bytes": SEG, "threshold": spec.dup_threshold, "dropped": dropped,
                  "candidates": len(cands)},
        "leakage": leakage,
        "build_seconds": round(time.time() - t0, 1),
    }
    return Built(docs=out_docs, sources=out_src, stats=stats)


# -- cache --------------------------------------------------------------------------------------------

def fingerprint(root: Path, spec: ProseSpec) -> str:
    """Names and sizes of the source files, with the version and the spec."""
    h = hashlib.sha256(f"{VERSION}\n{spec.key()}\n".encode())
    for sub in (WIKI, BOOKS):
        d = root / sub
        if d.is_dir():
            for f in sorted(d.iterdir()):
                if f.is_file():
                    h.update(f"{sub}/{f.name}\t{f.stat().st_size}\n".encode())
    return h.hexdigest()[:16]


def cache_path(root: Path, split_seed: int, spec: ProseSpec | None = None) -> Path:
    from .debs import cache_dir

    spec = spec or SPEC
    return cache_dir() / f"{VERSION}-s{split_seed}-{fingerprint(root, spec)}"


def _write(dest: Path, built: Built) -> None:
    from .debs import write_docs

    for name, docs in built.docs.items():
        write_docs(dest / name, docs)
        np.save(dest / name / "source.npy", built.sources[name])
    (dest / "stats.json").write_text(json.dumps(built.stats, indent=1) + "\n")


def ensure_prose(root: Path, split_seed: int = 1234, spec: ProseSpec | None = None) -> Path:
    """The cached splits of ``root`` (built first if needed, once across processes)."""
    from .debs import fetch_once

    spec = spec or SPEC
    dest = cache_path(root, split_seed, spec)

    def build(tmp: Path) -> None:
        print(f"rltok: building the prose corpus from {root} into {dest} (once, about a minute)", file=sys.stderr)
        _write(tmp, build_prose(root, split_seed, spec,
                                log=lambda m: print(f"rltok: prose: {m}", file=sys.stderr)))

    return fetch_once(dest, lambda d: (d / "stats.json").is_file(), build, "the prose corpus")


def _open_split(d: Path, name: str) -> tuple[Corpus, np.ndarray]:
    try:
        offsets = np.load(d / name / "offsets.npy")
        data = (np.load(d / name / "data.npy", mmap_mode="r") if offsets[-1] > 0 else np.zeros(0, np.uint8))
        src = np.load(d / name / "source.npy")
    except Exception as e:  # numpy raises many types for a damaged file
        raise RltokError(f"{d}: damaged cache of the prose corpus ({type(e).__name__}); remove the folder "
                         f"to build it again") from None
    return Corpus(data=data, offsets=offsets, name=f"prose [{name}]"), src


def open_prose(root: Path, split_seed: int = 1234, spec: ProseSpec | None = None):
    """(Splits, per-document sources {split: uint8 array, 0 wikipedia 1 gutenberg}, stats), as
    built and cached: the full fixed splits."""
    d = ensure_prose(root, split_seed, spec)
    parts = {name: _open_split(d, name) for name in ("train", "val", "test")}
    stats = json.loads((d / "stats.json").read_text())
    return (Splits(train=parts["train"][0], val=parts["val"][0], test=parts["test"][0]),
            {k: v[1] for k, v in parts.items()}, stats)


def _prefix(c: Corpus, n: int) -> Corpus:
    return Corpus(data=c.data[:int(c.offsets[n])], offsets=c.offsets[:n + 1], name=c.name)


def load_prose(cfg) -> Splits:
    """The run's prose splits (``cfg``: a DataConfig): the cached fixed splits, with
    ``data.val_docs``/``data.test_docs`` taking a prefix and ``data.min_doc_bytes`` filtering the
    training split (see the module docstring)."""
    splits, _, _ = open_prose(prose_root(cfg.source), cfg.split_seed)
    for name, n in (("val", cfg.val_docs if cfg.val_docs >= 0 else None),
                    ("test", cfg.test_docs if cfg.test_docs > 0 else None)):
        if n is None:
            continue
        c = getattr(splits, name)
        if n > len(c):
            raise RltokError(f"data.{name}_docs={n}: the prose {name} split holds {len(c)} documents (a fixed "
                             f"split by article and author); ask for at most {len(c)}")
        setattr(splits, name, _prefix(c, n))
    if cfg.min_doc_bytes > 1:
        keep = np.flatnonzero(splits.train.lengths >= cfg.min_doc_bytes)
        if len(keep) == 0:
            raise RltokError(f"data.min_doc_bytes={cfg.min_doc_bytes}: no prose training document is that long")
        if len(keep) < len(splits.train):
            splits.train = splits.train.subset(keep)
            splits.train.name = "prose [train]"
    return splits


def prose_corpus(cfg) -> Corpus:
    """All documents of the prose splits (train, then validation, then test): ``--split all``."""
    s = load_prose(cfg)
    parts = [s.train, s.val, s.test]
    data = np.concatenate([np.asarray(p.data[int(p.offsets[0]):int(p.offsets[-1])]) for p in parts])
    lens = np.concatenate([p.lengths for p in parts])
    offsets = np.zeros(len(lens) + 1, dtype=np.int64)
    np.cumsum(lens, out=offsets[1:])
    return Corpus(data=data, offsets=offsets, name="prose")


def prose_stats(source: str = NAME, split_seed: int = 1234) -> dict:
    """Documents and bytes per split and per source, the dropped near-duplicates and the leakage
    figures of the cached corpus (built first if needed)."""
    return open_prose(prose_root(source), split_seed)[2]
